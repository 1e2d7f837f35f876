"""Which samples an export holds and where each goes: selection, stable splits, order, ranks.

The selection is ``dlindex query``'s (its ``QuerySpec`` and SQL, through ``query.rows.prepare``); rows stay
plain tuples (``ROW`` order below), never a dict per row, or come as Arrow batches (``arrow_rows``)."""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from itertools import accumulate
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlindex.catalog.as_of import state_of
from dlindex.catalog.classes import canonical_splits
from dlindex.errors import InputError
from dlindex.export.arrow_rows import statement_rows
from dlindex.export.spill import DEFAULT_BUDGET, Spill, budget_rows, route
from dlindex.exported import ExportError as ExportError  # the read side defines it; export modules import it here
from dlindex.query.rows import prepare
from dlindex.query.spec import ID_SPAN, QuerySpec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

# Positions in a row tuple; the query's own column names (label_row: the internal labels.id,
# which plan.label_index maps to the label_id an export writes).
ROW = ("id", "root_id", "file_path", "file_path_bytes", "label_row", "width", "height", "format", "bytes", "xxh3_128")
ID, ROOT, FILE, FILE_BYTES, LABEL, WIDTH, HEIGHT, FORMAT, BYTES, HASH = range(len(ROW))
EXTRA = len(ROW)  # a row's one value after ROW, cut before it is written: tree split or --group-by value
# "path" and "label" make prepare() select root_id/file_path_bytes, load the root and label maps
_COLUMNS = ("id", "path", "file_path", "label", "label_id", "width", "height", "format", "bytes", "xxh3_128")

DEFAULT_SPLIT = "train"  # not "all": HF datasets reserves it for the union of all splits
_RESERVED_SPLITS = {"all"}
# A plain selection in id order can be read in two halves by two processes: the query's own
# statement, cut at an id. SQLite flattens the subquery into a rowid range search.
_LOWER = "SELECT * FROM ({query}) AS selected WHERE id <= :split_id"
_UPPER = "SELECT * FROM ({query}) AS selected WHERE id > :split_id"
# A row's --group-by value, looked up by primary key as the row is read: no map of every sample.
_WITH_VALUE = """SELECT selected.*, (SELECT value FROM sample_attributes AS a
    WHERE a.image_id = selected.id AND a.name = :group_column) FROM ({query}) AS selected"""
HALVES_MIN_IDS = 200_000  # below this a second process costs more than it saves
_SPLIT_NAME = re.compile(r"^[A-Za-z0-9_]{1,64}$")
UNIT = _UNIT = 2.0**64  # split_of's points are in [0, UNIT)
_UNLIMITED = 1 << 62


class Tally:
    """Samples written per (split, rank) and per (split, catalog label id), counted as written."""

    def __init__(self) -> None:
        self.samples: Counter[tuple[str, int]] = Counter()
        self.labels: Counter[tuple[str, int]] = Counter()

    def add(self, split: str, rank: int, batch: Sequence[tuple[Any, ...]]) -> None:
        self.samples[(split, rank)] += len(batch)
        for label, n in Counter(map(itemgetter(LABEL), batch)).items():
            self.labels[(split, label)] += n


@dataclass(frozen=True)
class Group:
    """The samples of one split for one rank, in output order; the last ``padded`` repeat earlier ones.

    ``rows`` is the query's rows as they stream from SQLite (without split fractions or ranks:
    one group, or one per tree split), a list, or rows spilled to disk (dlindex.export.spill),
    so no export of millions of rows holds them all in memory.
    """

    split: str
    rank: int
    rows: Iterable[tuple[Any, ...]]
    padded: int = 0
    positions: Sequence[int] = ()  # each row's place in its split's padded list (unique keys for repeats)
    tally: Tally | None = None


@dataclass(frozen=True)
class Plan:
    groups: tuple[Group, ...]
    labels: tuple[str, ...]  # the class list: label_id -> label name (sorted)
    label_index: Mapping[int, int]  # internal labels.id -> label_id
    roots: Mapping[int, bytes]  # root id -> absolute root path as bytes, ending with b"/"
    file_root: bytes  # what relative paths are relative to (b"/" with absolute paths)
    tally: Tally
    selected: int | None  # rows the query returned (None while streaming: see tally)
    dropped: int  # rows left out by --drop-last
    padded: int  # repeats added by --pad
    class_list: str = "catalog"  # which list `labels` is: "labels" (the --label names) or "catalog"

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(g.split for g in self.groups))

    @property
    def samples(self) -> int:
        return sum(self.tally.samples.values())


def parse_split(text: str | Mapping[str, float] | None) -> dict[str, float] | None:
    """``"train=0.9,val=0.1"`` -> ``{"train": 0.9, "val": 0.1}``; fractions must add up to 1."""
    if text is None:
        return None
    if isinstance(text, Mapping):
        fractions = {str(k): float(v) for k, v in text.items()}
    else:
        fractions = {}
        for part in (p.strip() for p in text.split(",")):
            name, sep, value = part.partition("=")
            try:
                fraction = float(value)
            except ValueError:
                fraction = math.nan
            if not sep or not name.strip() or math.isnan(fraction):
                raise ExportError(f"--split {text!r}: write NAME=FRACTION pairs, e.g. train=0.9,val=0.1")
            if name.strip() in fractions:
                raise ExportError(f"--split {text!r}: {name.strip()!r} is named twice")
            fractions[name.strip()] = fraction
    for name, fraction in fractions.items():
        if not _SPLIT_NAME.match(name):
            raise ExportError(f"split name {name!r} must be letters, digits or _ (it becomes part of file names)")
        if name.lower() in _RESERVED_SPLITS:
            raise ExportError(f"split name {name!r} is reserved (HF datasets reads it as every split); choose another")
        if not 0 < fraction <= 1:
            raise ExportError(f"split {name!r}: the fraction must be more than 0 and at most 1, not {fraction}")
    if not fractions or abs(sum(fractions.values()) - 1) > 1e-6:
        raise ExportError(f"split fractions must add up to 1, not {sum(fractions.values()):g}")
    return fractions


def tree_split_choice(text: str | Mapping[str, float] | None) -> tuple[str, ...] | None:
    """``--split tree`` -> () (every split folder); ``--split train,val`` -> those tree splits,
    canonical; None for fractions or no --split."""
    if text is None or isinstance(text, Mapping) or "=" in text:
        return None
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        return None  # parse_split says what is wrong
    if names == ["tree"]:
        return ()
    try:
        return canonical_splits(names)
    except InputError:
        raise ExportError(
            f"--split {text!r}: write NAME=FRACTION pairs (train=0.9,val=0.1), tree (the tree's split folders) "
            "or split folder names (train, val, test)"
        ) from None


def select_rows(
    catalog: Catalog,
    spec: QuerySpec,
    shuffle: bool,
    seed: int,
    with_split: bool = False,
    group_column: str = "",
    wrap: tuple[str, Mapping[str, Any]] | None = None,
) -> tuple[Iterator[tuple[Any, ...]], Any]:
    """The rows of ``spec`` as ROW tuples, lazily: by id, or in the query's seeded random order.
    ``with_split`` or ``group_column``: each tuple carries, at ``EXTRA``, its tree split or its
    value of that attribute (None: not in a split folder, no value). ``wrap``: a statement
    around the query's (at ``{query}``, keeping its columns and order), and its parameters."""
    prepared = prepare(catalog, export_spec(spec, shuffle, seed, (*_COLUMNS, "split") if with_split else _COLUMNS))
    base = prepared.base
    if group_column:
        sql, params = _WITH_VALUE.replace("{query}", prepared.sql), {**prepared.params, "group_column": group_column}
        base = (*base, "value")
    else:
        sql, params = prepared.sql, prepared.params
    if wrap is not None:
        sql, params = wrap[0].replace("{query}", sql), {**params, **wrap[1]}
    plain = not group_column and wrap is None  # a sample or narrow window: rows by id (query.fetch)
    wanted = (*ROW, "split") if with_split else (*ROW, "value") if group_column else ROW
    rows = statement_rows(catalog, prepared, base, None if plain else (sql, params))
    if tuple(base) == wanted:
        return rows, prepared
    return map(itemgetter(*(base.index(c) for c in wanted)), rows), prepared


def export_spec(spec: QuerySpec, shuffle: bool, seed: int, columns: tuple[str, ...]) -> QuerySpec:
    spec = replace(spec, columns=columns, order="random" if shuffle else "id", cache=False)
    return replace(spec, seed=seed) if shuffle else spec


@dataclass(frozen=True)
class UpperHalf:
    """The rows after ``split_id`` of a selection, for a second process to read and write."""

    db: str
    sql: str
    params: Mapping[str, Any]
    keep: tuple[tuple[tuple[str, float], ...], str] | None = None  # (fractions, split): keep its rows only
    at: int | None = None  # the state the export reads (``--at``), or None: the catalog as it is


def select_halves(
    catalog: Catalog, spec: QuerySpec, shuffle: bool, seed: int
) -> tuple[Iterator[tuple[Any, ...]], Any, UpperHalf | None]:
    """Like select_rows, but a large plain selection in id order comes back as its lower half
    plus the upper half's statement (None when the selection cannot be cut)."""
    rows, prepared = select_rows(catalog, spec, shuffle, seed)
    if shuffle or spec.per_label is not None or spec.limit is not None or tuple(prepared.base) != ROW:
        return rows, prepared, None
    low, high = catalog.conn.execute(ID_SPAN).fetchone()
    if low is None or high - low < HALVES_MIN_IDS:
        return rows, prepared, None
    rows.close()  # type: ignore[attr-defined]  # never started: nothing was read
    params = {**prepared.params, "split_id": (low + high) // 2}
    lower = catalog.read(_LOWER.replace("{query}", prepared.sql), params)
    upper = UpperHalf(catalog.url, _UPPER.replace("{query}", prepared.sql), params, at=state_of(catalog.pinned))
    return lower, prepared, upper


def split_of(fractions: Mapping[str, float], points: Mapping[int, int] | Callable[..., int] | None = None) -> Any:
    """A function from a row to its split name, by content hash: stable as the catalog grows.

    Args:
        points: sample id -> the point of its group (dlindex.export.groups), for grouped
            samples; the others go by their own content hash. Or a function from a row to
            its point (``--group-by``: of the value the row carries).
    """
    _point: Callable[[tuple[Any, ...]], int] = (
        points if callable(points) else partial(_grouped_point, points) if points else content_point
    )

    names, bounds = list(fractions), split_bounds(fractions)
    if len(names) == 2:
        first, second = names
        cut = bounds[0]
        return lambda row: first if _point(row) < cut else second

    def assign(row: tuple[Any, ...]) -> str:
        point = _point(row)
        for name, bound in zip(names, bounds, strict=True):
            if point < bound:
                return name
        return names[-1]

    return assign


def _grouped_point(points: Mapping[int, int], row: tuple[Any, ...]) -> int:
    found = points.get(row[ID])
    return content_point(row) if found is None else found


def split_bounds(fractions: Mapping[str, float]) -> list[float]:
    """Each split's upper bound of points, in order: a point goes to the first it is below."""
    bounds = [total * _UNIT for total in accumulate(0.0 + fractions[name] for name in fractions)]
    return [*bounds[:-1], _UNIT]  # rounding never leaves a sample without a split


def content_point(row: tuple[Any, ...]) -> int:
    """A row's point in [0, 2**64): the place its split is chosen by."""
    # The top 64 bits of the XXH3-128 of the content: identical files always share a split,
    # so a duplicate can never leak from train into val.
    digest = row[HASH]
    if digest:
        try:
            return int(digest[:16], 16)
        except ValueError:
            pass
    return int(row[ID] * 0x9E3779B97F4A7C15) % (1 << 64)  # no hash (never for status ok): by id


def make_plan(
    rows: Iterable[tuple[Any, ...]],
    classes: Sequence[str],
    class_index: Mapping[int, int],
    roots: Mapping[int, tuple[str, bytes]],
    *,
    class_list: str = "catalog",
    split: Mapping[str, float] | None,
    points: Mapping[int, int] | Callable[..., int] | None = None,
    tree_splits: Mapping[str, Iterable[tuple[Any, ...]]] | None = None,
    tree_names: Sequence[str] | None = None,
    world_size: int,
    drop_last: bool,
    absolute_paths: bool,
    stream: bool = True,
    spill_dir: Path | None = None,
    memory_budget: int | None = None,
) -> Plan:
    """Arrange rows into groups. Without split fractions and ranks (and with ``stream``), the
    rows are not read here: each group (one, or one per tree split) streams them to the writer.

    Args:
        classes, class_index: the selection's class list (dlindex.catalog.classes), whether or not a
            sample of each survives the other filters, so label_id does not shift with
            --min-width or --limit; and internal label row id -> label_id.
        points: the group points of grouped samples (``export --group``; see split_of); a
            function: rows carry a value at EXTRA for it, cut once their split is known.
        tree_splits: the rows of each of the tree's split folders (``--split tree``); ``rows``
            is then unused.
        tree_names: the tree's split folders when ``rows`` is one statement over all of them
            (``--limit``: a limit on the whole export), each row carrying its split at EXTRA.
        spill_dir: where rows beyond ``memory_budget`` bytes (default DEFAULT_BUDGET) wait on
            disk (the export's temporary folder); None: every row stays in memory.
    """
    if world_size < 1:
        raise ExportError(f"--world-size must be at least 1, not {world_size}")
    names = list(classes)
    label_index = dict(class_index)
    prefixes = {k: v[1] for k, v in roots.items()}
    file_root = b"/" if absolute_paths else _common_root(list(prefixes.values()))
    tally = Tally()
    if not split and world_size == 1 and stream and tree_names is None:
        # One group per split, each streaming its own query's rows (the tree's split folders)
        # or the one query's, to the writer in turn.
        streams = tree_splits if tree_splits is not None else {DEFAULT_SPLIT: rows}
        streamed = tuple(Group(name, 0, members, tally=tally) for name, members in streams.items())
        return Plan(streamed, tuple(names), label_index, prefixes, file_root, tally, None, 0, 0, class_list)
    # One pass over the rows, each routed to its (split, rank) group; held in memory up to the
    # budget, spilled to a file in ``spill_dir`` beyond it (dlindex.export.spill).
    parts: list[tuple[Any, Iterable[tuple[Any, ...]]]]
    if tree_splits is not None:
        split_names = list(tree_splits)
        parts = list(tree_splits.items())
    elif tree_names is not None:
        split_names = list(tree_names)
        parts = [(itemgetter(EXTRA), rows)]
    elif split:
        split_names = list(split)
        parts = [(split_of(split, points), rows)]
    else:
        split_names = [DEFAULT_SPLIT]
        parts = [(DEFAULT_SPLIT, rows)]
    held = len(split_names) * world_size if world_size > 1 else 0
    limit, budget = _UNLIMITED, 0
    if spill_dir is not None:
        budget = DEFAULT_BUDGET if memory_budget is None else memory_budget
        limit = budget_rows(budget, len(split_names) * world_size, held)
    spill = Spill(spill_dir or Path("."), len(split_names) * world_size, limit, held, budget)
    cut = EXTRA if tree_names is not None or callable(points) else None
    counts, heads = route(parts, split_names, world_size, spill, cut)
    groups: list[Group] = []
    dropped = padded = 0
    for k, name in enumerate(split_names):
        n = counts[name]
        total = n
        if world_size > 1:
            if drop_last:
                total = n // world_size * world_size
                dropped += n - total
            elif n % world_size:
                extra = world_size - n % world_size
                padded += extra
                total = n + extra  # the padded list: the split's rows, then its first ``extra`` again
        for rank in range(world_size):
            # Strided like torch's DistributedSampler: every rank sees the whole order's spread.
            positions = range(rank, total, world_size)
            real = len(range(rank, min(n, total), world_size))
            tail = [heads[name][(p - n) % n] for p in positions[real:]]
            rows_of = spill.rows(k * world_size + rank, real, tail)
            groups.append(Group(name, rank, rows_of, len(tail), positions, tally))
    return Plan(
        tuple(groups),
        tuple(names),
        label_index,
        prefixes,
        file_root,
        tally,
        sum(counts.values()),
        dropped,
        padded,
        class_list,
    )


def _common_root(prefixes: Sequence[bytes]) -> bytes:
    if not prefixes:
        return b"/"
    if len(prefixes) == 1:
        return prefixes[0]
    common = os.path.commonpath([p.rstrip(b"/") or b"/" for p in prefixes])
    return common.rstrip(b"/") + b"/"


def relative_prefixes(plan: Plan) -> dict[int, bytes]:
    """Per root: what goes before a file_path to make the path an export writes."""
    cut = 0 if plan.file_root == b"/" else len(plan.file_root)
    return {k: prefix[cut:] for k, prefix in plan.roots.items()}


def sample_path(row: tuple[Any, ...], prefixes: Mapping[int, bytes]) -> bytes:
    raw = row[FILE_BYTES]
    return prefixes[row[ROOT]] + (bytes(raw) if raw is not None else row[FILE].encode())


def absolute_path(row: tuple[Any, ...], roots: Mapping[int, bytes]) -> bytes:
    raw = row[FILE_BYTES]
    return roots[row[ROOT]] + (bytes(raw) if raw is not None else row[FILE].encode())
