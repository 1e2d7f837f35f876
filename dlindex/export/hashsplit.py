"""Split fractions without a spill: one statement per split, which the database narrows by hash.

A sample's split is a range of the top 64 bits of its content hash (``plan.split_of``), and
those bits are the hash's first 16 hex digits: for a lowercase hex hash, comparing those
digits as text is comparing the numbers. So each split's statement is the selection's own
(same filters, order, limit) keeping the rows whose hash prefix lies in the split's range, or
whose hash is not such a prefix (none, or odd text); the rows that reach Python are then
checked by ``split_of`` itself, so a split holds exactly the rows, in exactly the order, that
dealing the whole selection out would give it, and nothing waits in memory or on disk. The
cost is a pass of the database over the selection per split, in C, instead of every row
going through Python, a spill file and back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from dlindex.catalog.as_of import state_of
from dlindex.export import plan
from dlindex.export.arrow_rows import odd_rows
from dlindex.export.plan import (
    _COLUMNS,
    _LOWER,
    _UPPER,
    HASH,
    ROW,
    UNIT,
    UpperHalf,
    export_spec,
    select_rows,
    split_bounds,
    split_of,
)
from dlindex.query.rows import prepare
from dlindex.query.spec import ID_SPAN

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.query.spec import QuerySpec

_HEX16 = "[0-9a-f]" * 16 + "*"
_HEX16_START = "^[0-9a-f]{16}"  # the same test as a regular expression, for Arrow's kernel
# The whole hash against 16-digit bounds is its prefix against them (a range one wider than
# split_of's at each end: a superset, which split_of then decides); a NULL or odd hash always
# passes. The range comes first: the pattern is only tried on the rows out of range.
_IN_RANGE = """SELECT * FROM ({query}) AS selected WHERE (selected.xxh3_128 >= :low AND selected.xxh3_128 < :high)
    OR selected.xxh3_128 IS NULL OR NOT (selected.xxh3_128 GLOB :hex16)"""


def batch_splits(fractions: Mapping[str, float]) -> Callable[[Sequence[tuple[Any, ...]]], list[str]]:
    """split_of over a batch of rows at once: each row's split, as split_of gives it (two splits
    and hex hashes in one comprehension; anything else row by row through split_of)."""
    assign = split_of(fractions)
    if len(fractions) != 2:
        return lambda batch: list(map(assign, batch))
    first, second = fractions
    cut = (0.0 + fractions[first]) * UNIT  # split_of's bound, the same float

    def splits(batch: Sequence[tuple[Any, ...]]) -> list[str]:
        try:
            return [first if int(digest[:16], 16) < cut else second for digest in map(itemgetter(HASH), batch)]
        except (TypeError, ValueError):  # a NULL, empty or odd hash: content_point decides
            return list(map(assign, batch))

    return splits


def hash_ranges(fractions: Mapping[str, float]) -> dict[str, tuple[str, str]]:
    """Per split: the lowest 16-digit hash prefix it can hold, and text above every hash it
    can hold (``g`` for the last: above any hex digit)."""
    ranges: dict[str, tuple[str, str]] = {}
    low, total = 0, 0.0
    names = list(fractions)
    for k, name in enumerate(names):
        total += fractions[name]
        high = (1 << 64) - 1 if k == len(names) - 1 else min(int(total * UNIT), (1 << 64) - 1)
        ranges[name] = (f"{low:016x}", f"{high + 1:016x}" if high + 1 < (1 << 64) else "g")
        low = high
    return ranges


def split_streams(
    catalog: Catalog, spec: QuerySpec, shuffle: bool, seed: int, fractions: Mapping[str, float], halves: bool = False
) -> tuple[dict[str, Iterator[tuple[Any, ...]]], Any, dict[str, UpperHalf]]:
    """Per split of ``fractions``: its rows, lazily, each split its own statement (nothing is
    read before the rows are iterated); with ``halves``, the upper half of each large split
    for a second process (see halved)."""
    streams: dict[str, Iterator[tuple[Any, ...]]] = {}
    uppers: dict[str, UpperHalf] = {}
    prepared = None
    keep = tuple(fractions.items())
    for name, (low, high) in hash_ranges(fractions).items():
        wrap = (_IN_RANGE, {"hex16": _HEX16, "low": low, "high": high})
        rows, prepared, upper = halved(catalog, spec, shuffle, seed, wrap, (keep, name), halves, fractions[name])
        streams[name] = OneSplit(rows, fractions, name)
        if upper is not None:
            uppers[name] = upper
    return streams, prepared, uppers


def dealt_rows(
    catalog: Catalog, spec: QuerySpec, shuffle: bool, seed: int, fractions: Mapping[str, float], halves: bool = True
) -> tuple[Iterator[tuple[Any, ...]], Any, UpperHalf | None, set[str]]:
    """The whole selection for manifest.write_jsonl_splits, cut in halves as halved cuts it;
    and the splits whose statement split_streams would have cut (their shard is written even
    when empty, as write_jsonl writes it). With no ``fractions``, each row carries its tree
    split at EXTRA (dealing by split folder). Without ``halves``, never cut."""
    rows, prepared, upper = halved(catalog, spec, shuffle, seed, halves=halves, with_split=not fractions)
    cut: set[str] = set()
    if upper is not None:
        low, high = catalog.conn.execute(ID_SPAN).fetchone()
        cut = {name for name, share in fractions.items() if share * (high - low) >= plan.HALVES_MIN_IDS}
    return rows, prepared, upper, cut


def halved(
    catalog: Catalog, spec: QuerySpec, shuffle: bool, seed: int, wrap: tuple[str, Mapping[str, Any]] | None = None,
    keep: Any = None, halves: bool = True, share: float = 1.0, with_split: bool = False,
) -> tuple[Iterator[tuple[Any, ...]], Any, UpperHalf | None]:  # fmt: skip
    """select_rows's rows (with ``wrap``), cut at the middle id as select_halves cuts a plain
    selection: the lower half here, the upper's statement for a second process (None when
    not cut: shuffled, --per-label, --limit, or fewer ids than HALVES_MIN_IDS in its ``share``
    of the id range: a second process costs more than it saves on a small split).
    ``with_split``: each row carries its tree split at EXTRA (select_rows')."""
    cut = halves and not shuffle and spec.per_label is None and spec.limit is None
    if cut:
        low, high = catalog.conn.execute(ID_SPAN).fetchone()
        cut = low is not None and share * (high - low) >= plan.HALVES_MIN_IDS
    if not cut:
        rows, prepared = select_rows(catalog, spec, shuffle, seed, with_split, wrap=wrap)
        return rows, prepared, None
    prepared = prepare(catalog, export_spec(spec, shuffle, seed, (*_COLUMNS, "split") if with_split else _COLUMNS))
    if tuple(prepared.base) != ((*ROW, "split") if with_split else ROW):
        rows, prepared = select_rows(catalog, spec, shuffle, seed, with_split, wrap=wrap)
        return rows, prepared, None
    sql, params = prepared.sql, {**prepared.params, "split_id": (low + high) // 2}
    if wrap is not None:
        sql, params = wrap[0].replace("{query}", sql), {**params, **wrap[1]}
    lower = catalog.read(_LOWER.replace("{query}", sql), params)
    return (
        lower,
        prepared,
        UpperHalf(
            catalog.url,
            _UPPER.replace("{query}", sql),
            params,
            keep,
            state_of(catalog.pinned),
        ),
    )


class OneSplit:
    """The rows of one split's statement that ``split_of`` puts in that split (the statement's
    hash range is one wider at each end), as tuples or, where the statement's rows can be
    read as Arrow (dlindex.export.arrow_rows), as Arrow batches, the same rows."""

    def __init__(self, rows: Iterator[tuple[Any, ...]], fractions: Mapping[str, float], name: str) -> None:
        self.rows, self.fractions, self.name = rows, dict(fractions), name
        self.assign = split_of(fractions)
        self._kept: Iterator[tuple[Any, ...]] | None = None

    def __iter__(self) -> OneSplit:
        return self

    def __next__(self) -> tuple[Any, ...]:
        if self._kept is None:
            assign, name = self.assign, self.name
            self._kept = (row for row in self.rows if assign(row) == name)
        return next(self._kept)

    def close(self) -> None:
        close = getattr(self.rows, "close", None)
        if close is not None:
            close()

    def arrow_batches(self) -> Generator[Any, None, None] | None:
        source = getattr(self.rows, "arrow_batches", None)
        batches = source() if source is not None and self._kept is None else None
        return None if batches is None else self._filtered(batches)

    def _filtered(self, batches: Generator[Any, None, None]) -> Generator[Any, None, None]:
        try:
            for batch in batches:
                yield batch.filter(split_mask(batch, self.fractions, self.name, self.assign))
        finally:
            batches.close()


def split_mask(batch: Any, fractions: Mapping[str, float], name: str, assign: Callable[..., str]) -> Any:
    """Which rows of an Arrow batch (ROW's columns) ``split_of`` puts in split ``name``: a hash
    that starts with 16 lowercase hex digits by comparing those digits as text with the split's
    bounds (the smallest whole point at or above each, in 16 digits: the same as the number
    against the float bound); any other row by ``assign`` itself, row by row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names, bounds = list(fractions), split_bounds(fractions)
    k = names.index(name)
    hashes = batch.column("xxh3_128")
    hexed = pc.fill_null(pc.match_substring_regex(hashes, _HEX16_START), False)
    prefix = pc.utf8_slice_codeunits(hashes, 0, 16)
    keep = hexed
    if k > 0:  # not below the split before's bound (a bound of 2^64 or more: no point is)
        low = math.ceil(bounds[k - 1])
        keep = pc.and_(keep, pc.greater_equal(prefix, f"{low:016x}") if low < 1 << 64 else False)
    if k < len(names) - 1 and math.ceil(bounds[k]) < 1 << 64:  # below its own (2^64: every point is)
        keep = pc.and_(keep, pc.less(prefix, f"{math.ceil(bounds[k]):016x}"))
    keep = pc.fill_null(keep, False)
    odd = pc.invert(hexed)
    if pc.any(odd).as_py():
        mine = [assign(row) == name for row in odd_rows(batch, odd)]
        keep = pc.replace_with_mask(keep, odd, pa.array(mine, pa.bool_()))
    return keep
