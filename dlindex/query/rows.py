"""Training-time queries: composable filters, class-balanced sampling, seeded order, result cache.

Every query is one parameterised statement assembled from the constant fragments below:
values (labels, times, sizes, limits, seeds) are always bound parameters. The three enum
filters (status, processed, processing status) are SQL literals chosen from fixed
whitelists, because a partial index such as ``WHERE processed = 1`` serves only a query
that carries the same literal; nothing the user types reaches the SQL text.
"""

from __future__ import annotations

import array
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from dlindex.catalog.classes import CLASS_LISTS, canonical_splits, class_index, class_list
from dlindex.errors import InputError
from dlindex.query import cache

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

STATUSES = ("ok", "corrupt", "missing")
PROCESSING_STATUSES = ("queued", "completed", "failed")
ORDERS = ("id", "random")
# Stored columns, selected by name; path, root, label and label_id are derived from them in
# Python. label_row is the internal labels.id: never a column users see (dlindex/classes.py).
_STORED = {
    "id": "image_metadata.id",
    "root_id": "image_metadata.root_id",
    "file_path": "image_metadata.file_path",
    "file_path_bytes": "image_metadata.file_path_bytes",
    "label_row": "image_metadata.label_id",
    "split": "image_metadata.split",
    "width": "image_metadata.width",
    "height": "image_metadata.height",
    "format": "image_metadata.format",
    "mode": "image_metadata.mode",
    "bytes": "image_metadata.bytes",
    "mtime_ns": "image_metadata.mtime_ns",
    "xxh3_128": "image_metadata.xxh3_128",
    "status": "image_metadata.status",
    "error": "image_metadata.error",
    "warning": "image_metadata.warning",
    "processed": "image_metadata.processed",
    "processing_status": "image_metadata.processing_status",
    "created_at": "image_metadata.created_at",
    "updated_at": "image_metadata.updated_at",
}
_DERIVED = {
    "path": ("root_id", "file_path", "file_path_bytes"), "root": ("root_id",), "label": ("label_row",),
    "label_id": ("label_row",),
}  # fmt: skip
COLUMNS = ("id", "path", "root", "file_path", "label", "label_id", "split", *[c for c in _STORED if c not in
           ("id", "root_id", "file_path", "file_path_bytes", "label_row", "split")])  # fmt: skip
DEFAULT_COLUMNS = ("id", "path", "label", "width", "height", "status", "processed", "processing_status", "created_at")

_SELECT = "SELECT {columns} FROM image_metadata{where}{order}{limit}"
# Class balance without any index: number the rows of each label in a seeded pseudo-random
# order and keep the first N. One pass and one sort; measured in bench/bench_query.py.
_SAMPLE = (
    "SELECT {columns} FROM image_metadata WHERE image_metadata.id IN (SELECT sample_id FROM ("
    "SELECT sample_id, ROW_NUMBER() OVER (PARTITION BY sample_label ORDER BY sample_rank, sample_id) AS label_rank "
    "FROM (SELECT image_metadata.id AS sample_id, image_metadata.label_id AS sample_label, {rank} AS sample_rank "
    "FROM image_metadata{where})) WHERE label_rank <= :per_label){order}{limit}"
)
# A seeded hash of the id in plain SQL (any SQLite client can rerun the logged statement):
# an affine map mod a prime, squared (the non-linear step that breaks the lattice pattern
# an affine map alone leaves), then another affine map. Every product stays below 2**63.
_MIX = "(((image_metadata.id % 2147483647) * :seed_a + :seed_b) % 2147483647)"
_RANK = f"((({_MIX} * {_MIX}) % 2147483629) * :seed_c + :seed_d) % 2147483587"
_ORDER_ID = " ORDER BY image_metadata.id"
_ORDER_RANDOM = " ORDER BY " + _RANK + ", image_metadata.id"
_LIMIT = " LIMIT :limit"
_SPLIT_COUNTS = "SELECT image_metadata.split, count(*) FROM image_metadata{where} GROUP BY image_metadata.split"
_LIMIT_OFFSET = " LIMIT :limit OFFSET :offset"
_OFFSET = " LIMIT -1 OFFSET :offset"  # SQLite takes OFFSET only after a LIMIT; -1 is none
_INT64_MAX = 2**63 - 1  # the largest value SQLite binds
_WHERE_LABEL = "image_metadata.label_id = :label_id"
_WHERE_LABELS = "image_metadata.label_id IN (SELECT value FROM json_each(:label_ids))"
_WHERE_SPLIT = "image_metadata.split = :split"
_WHERE_SPLITS = "image_metadata.split IN (SELECT value FROM json_each(:splits))"
_WHERE_HAS_CLASS = {True: "image_metadata.label_id IS NOT NULL", False: "image_metadata.label_id IS NULL"}
_WHERE_SINCE = "image_metadata.created_at >= :since"
_WHERE_UNTIL = "image_metadata.created_at < :until"
_WHERE_MIN_WIDTH = "image_metadata.width >= :min_width"
_WHERE_MIN_HEIGHT = "image_metadata.height >= :min_height"
_WHERE_PROCESSED = {True: "image_metadata.processed = 1", False: "image_metadata.processed = 0"}
_LABEL_IDS = "SELECT id, name FROM labels WHERE name IN (SELECT value FROM json_each(:names))"
_LABEL_NAMES = "SELECT id, name FROM labels"
_ROOTS = "SELECT id, path, path_bytes FROM roots"
_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|secs|m|min|mins|h|hr|hrs|d|day|days|w|wk|wks)\s*$", re.I)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True)
class QuerySpec:
    """What to select: the options of ``dlindex query``, with the same names and defaults.

    ``split`` selects the tree's split folders (``"val"`` or ``"validation"``); ``classes``
    says which class list ``label_id`` indexes: ``"selected"`` (the ``labels`` named, else
    the catalog's) or ``"catalog"`` (always the catalog's); ``has_class`` keeps only files
    with (True) or without (False) a class. See dlindex/classes.py.
    Sequences may also be given as one string (``columns="id,path"``, ``labels="cat"``);
    ``since``/``until`` take an ISO date-time (UTC unless it says otherwise), a duration
    back from now (``30m``, ``24h``, ``7d``) or a ``datetime``.
    """

    labels: Sequence[str] | str = ()
    split: Sequence[str] | str = ()
    classes: str = "selected"
    has_class: bool | None = None
    status: Sequence[str] | str = ("ok",)
    processed: bool | None = None
    processing_status: Sequence[str] | str = ()
    since: str | datetime | None = None
    until: str | datetime | None = None
    min_width: int | None = None
    min_height: int | None = None
    per_label: int | None = None
    limit: int | None = None
    offset: int | None = None
    order: str = "id"
    seed: int = 0
    columns: Sequence[str] | str | None = DEFAULT_COLUMNS
    cache: bool = True

    def __post_init__(self) -> None:
        for name in ("labels", "split", "status", "processing_status"):
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value or ()))
        columns = DEFAULT_COLUMNS if self.columns is None else self.columns
        if isinstance(columns, str):
            columns = [c.strip() for c in columns.split(",")]
        object.__setattr__(self, "columns", tuple(columns or ()))


@dataclass(frozen=True)
class PreparedQuery:
    """One query as it will run: the SQL, its parameters, and how rows become dicts."""

    sql: str
    params: dict[str, Any]
    selection_sql: str  # the same selection returning ids only: the cache key's template
    columns: tuple[str, ...]
    base: tuple[str, ...]  # stored columns selected, id first
    cache: bool
    labels: dict[int, str] | None = None
    classes: tuple[str, ...] | None = None  # the class list label_id indexes
    class_list: str | None = None  # "labels" (the --label names) or "catalog"
    class_index: dict[int, int] | None = None  # internal label row id -> label_id
    roots: dict[int, tuple[str, bytes]] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Explained:
    sql: str
    params: dict[str, Any]
    plan: tuple[str, ...]


def query_rows(catalog: Catalog, spec: QuerySpec | None = None, **options: Any) -> Iterator[dict[str, Any]]:
    """Rows matching ``spec`` (or a ``QuerySpec`` of ``options``) as dicts, lazily; the spec is
    checked now, raising InputError, not when the rows are read.

        for row in query_rows(Catalog("train.db"), per_label=32, processed=True, seed=0):
            ...
    """
    prepared = prepare(catalog, spec or QuerySpec(**options))
    return _rows(catalog, prepared)


def sample_ids(catalog: Catalog, spec: QuerySpec | None = None, **options: Any) -> list[int]:
    """The ids that ``query_rows`` with the same spec or options would yield, in the same order."""
    prepared = prepare(catalog, _replace_columns(spec or QuerySpec(**options), ("id",)))
    return [row["id"] for row in _rows(catalog, prepared)]


def explain(catalog: Catalog, spec: QuerySpec) -> Explained:
    """The statement ``spec`` runs, its parameters and SQLite's ``EXPLAIN QUERY PLAN``."""
    prepared = prepare(catalog, spec)
    plan = tuple(str(r[3]) for r in catalog.conn.execute("EXPLAIN QUERY PLAN " + prepared.sql, prepared.params))
    return Explained(prepared.sql, prepared.params, plan)


def split_counts(catalog: Catalog, spec: QuerySpec) -> dict[str | None, int]:
    """Files per tree split (None: not in a split folder) among those ``spec``'s filters select
    (before --per-label and --limit)."""
    where, params = _filters(catalog, spec)
    where_sql = " WHERE " + " AND ".join(where) if where else ""
    return {split: int(n) for split, n in catalog.read(_SPLIT_COUNTS.replace("{where}", where_sql), params)}


def prepare(catalog: Catalog, spec: QuerySpec) -> PreparedQuery:
    """Check every option and build the statement; all errors are InputError, raised here."""
    columns = _check_columns(tuple(spec.columns or ()))
    where, params = _filters(catalog, spec)
    if spec.order not in ORDERS:
        raise InputError(f"unknown order {spec.order!r}; choose id or random")
    random_order = spec.order == "random"
    if spec.per_label is not None or random_order:
        params.update(_seed_params(spec.seed))
    if spec.limit is not None:
        params["limit"] = _count("--limit", spec.limit, 0)
    if spec.offset:
        params["offset"] = _count("--offset", spec.offset, 0)
        limit = _LIMIT_OFFSET if spec.limit is not None else _OFFSET
    else:
        limit = _LIMIT if spec.limit is not None else ""
    base = ["id"]
    for column in columns:
        for stored in _DERIVED.get(column, (column,)):
            if stored not in base:
                base.append(stored)
    where_sql = " WHERE " + " AND ".join(where) if where else ""
    classes = class_list = index = None
    if "label_id" in columns:
        classes, class_list = _class_list(catalog, spec)
        index = _class_index(catalog, classes)
    if spec.per_label is not None:
        params["per_label"] = _count("--per-label", spec.per_label, 1)
        template = _SAMPLE.replace("{rank}", _RANK).replace("{where}", where_sql)
    else:
        template = _SELECT.replace("{where}", where_sql)
    order = _ORDER_RANDOM if random_order else _ORDER_ID
    template = template.replace("{order}", order).replace("{limit}", limit)
    return PreparedQuery(
        sql=template.replace("{columns}", ", ".join(_STORED[c] for c in base)),
        params=params,
        selection_sql=template.replace("{columns}", _STORED["id"]),
        columns=columns,
        base=tuple(base),
        cache=spec.cache,
        labels=_label_names(catalog) if "label" in columns else None,
        classes=classes,
        class_list=class_list,
        class_index=index,
        roots=_roots(catalog) if "path" in columns or "root" in columns else None,
    )


def _check_columns(columns: Sequence[str]) -> tuple[str, ...]:
    if not columns:
        raise InputError(f"no columns asked for; choose from: {', '.join(COLUMNS)}")
    for column in columns:
        if column not in COLUMNS:
            raise InputError(f"unknown column {column!r}; choose from: {', '.join(COLUMNS)}")
    return tuple(dict.fromkeys(columns))


def _filters(catalog: Catalog, spec: QuerySpec) -> tuple[list[str], dict[str, Any]]:
    where: list[str] = []
    params: dict[str, Any] = {}
    if spec.classes not in CLASS_LISTS:
        raise InputError(f"unknown class list {spec.classes!r}; choose from: {', '.join(CLASS_LISTS)}")
    if spec.labels:
        ids = _label_ids(catalog, spec.labels)
        if len(ids) == 1:
            where.append(_WHERE_LABEL)
            params["label_id"] = ids[0]
        else:
            where.append(_WHERE_LABELS)
            params["label_ids"] = json.dumps(ids)
    if spec.split:
        splits = canonical_splits(spec.split)
        if len(splits) == 1:
            where.append(_WHERE_SPLIT)
            params["split"] = splits[0]
        else:
            where.append(_WHERE_SPLITS)
            params["splits"] = json.dumps(splits)
    if spec.has_class is not None:
        where.append(_WHERE_HAS_CLASS[bool(spec.has_class)])
    if spec.status:
        where.append(_in_literals("image_metadata.status", spec.status, STATUSES, "status"))
    if spec.processed is not None:
        where.append(_WHERE_PROCESSED[bool(spec.processed)])
    if spec.processing_status:
        where.append(
            _in_literals(
                "image_metadata.processing_status", spec.processing_status, PROCESSING_STATUSES, "processing status"
            )
        )
    since = parse_when(spec.since, "--since") if spec.since is not None else None
    until = parse_when(spec.until, "--until") if spec.until is not None else None
    if since is not None and until is not None and since >= until:
        raise InputError(f"empty time range: --since {since} is not before --until {until}")
    if since is not None:
        where.append(_WHERE_SINCE)
        params["since"] = since
    if until is not None:
        where.append(_WHERE_UNTIL)
        params["until"] = until
    for name, fragment in (("min_width", _WHERE_MIN_WIDTH), ("min_height", _WHERE_MIN_HEIGHT)):
        value = getattr(spec, name)
        if value is not None:
            params[name] = _count("--" + name.replace("_", "-"), value, 0)
            where.append(fragment)
    return where, params


def _count(option: str, value: Any, minimum: int) -> int:
    """``value`` as a whole number from ``minimum`` to the 64-bit limit SQLite can bind."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InputError(f"{option} must be a whole number, not {value!r}")
    if value < minimum:
        raise InputError(f"{option} must be {minimum} or more, not {value}")
    if value > _INT64_MAX:
        raise InputError(f"{option} must be at most {_INT64_MAX}, not {str(value)[:30]}")
    return value


def _in_literals(column: str, values: Sequence[str], allowed: tuple[str, ...], what: str) -> str:
    """``column = 'a'`` or ``column IN ('a', 'b')`` from whitelisted constants only."""
    for value in values:
        if value not in allowed:
            raise InputError(f"unknown {what} {value!r}; choose from: {', '.join(allowed)}")
    chosen = [v for v in allowed if v in values]  # whitelist order: one template per set
    literals = ", ".join("'" + v + "'" for v in chosen)
    return f"{column} = {literals}" if len(chosen) == 1 else f"{column} IN ({literals})"


def _label_ids(catalog: Catalog, names: Sequence[str]) -> list[int]:
    found = {name: id_ for id_, name in catalog.read(_LABEL_IDS, {"names": json.dumps(list(names))})}
    for name in names:
        if name not in found:
            import difflib  # only for this message

            known = [n for _, n in catalog.conn.execute(_LABEL_NAMES)]
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else f" ({len(known)} labels known)"
            raise InputError(f"unknown label {name!r}{hint}")
    return sorted({found[name] for name in names})


def _label_names(catalog: Catalog) -> dict[int, str]:
    return _per_change(catalog, "labels", lambda: dict(catalog.read(_LABEL_NAMES)))


def _class_list(catalog: Catalog, spec: QuerySpec) -> tuple[tuple[str, ...], str]:
    if spec.labels and spec.classes == "selected":
        return class_list(catalog, spec.labels, spec.classes)
    return _per_change(catalog, "classes", lambda: class_list(catalog, (), "catalog"))  # type: ignore[no-any-return]


def _class_index(catalog: Catalog, names: tuple[str, ...]) -> dict[int, int]:
    held = _per_change(catalog, "class_index", lambda: (names, class_index(catalog, names)))
    if held[0] != names:  # another class list: load it, and keep it for the next call
        held = (names, class_index(catalog, names))
        catalog.lookup_cache["class_index"] = (catalog.changes(), held)
    return held[1]  # type: ignore[no-any-return]


def _roots(catalog: Catalog) -> dict[int, tuple[str, bytes]]:
    def load() -> dict[int, tuple[str, bytes]]:
        roots = {}
        for id_, text, raw in catalog.read(_ROOTS):
            prefix = bytes(raw) if raw is not None else os.fsencode(text)
            roots[id_] = (text, prefix.rstrip(b"/") + b"/")
        return roots

    return _per_change(catalog, "roots", load)


def _per_change(catalog: Catalog, name: str, load: Callable[[], Any]) -> Any:
    """Small lookup tables, reloaded only when the catalog's change counter moved: a training
    loop asking for a few rows at a time should not re-read 1,000 label names per call."""
    cache = catalog.lookup_cache
    changes = catalog.changes()
    found = cache.get(name)
    if found is None or found[0] != changes:
        found = cache[name] = (changes, load())
    return found[1]


def parse_when(value: str | datetime, option: str = "time") -> str:
    """A time as the catalog stores it ('YYYY-MM-DD HH:MM:SS', UTC), from ISO text or a duration."""
    try:
        return _when(value, option)
    except (OverflowError, ValueError):  # a duration reaching before year 1, a time zone past 9999
        raise InputError(f"{option} {str(value)[:40]!r} is outside the years 1 to 9999") from None


def _when(value: str | datetime, option: str) -> str:
    if isinstance(value, datetime):
        moment = value
    else:
        text = value.strip()
        match = _DURATION.match(text)
        if match:
            seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)[0].lower()]
            if seconds <= 0:
                raise InputError(f"{option} {value!r}: a duration must be more than 0")
            moment = datetime.now(timezone.utc) - timedelta(seconds=seconds)
        else:
            try:
                moment = datetime.fromisoformat(text)
            except ValueError:
                raise InputError(
                    f"{option} {value!r} is neither an ISO date-time (2024-05-01, 2024-05-01T12:30:00Z) "
                    "nor a duration (30m, 24h, 7d)"
                ) from None
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc).replace(tzinfo=None)
    return moment.strftime(_TIME_FORMAT)


def _seed_params(seed: int) -> dict[str, int]:
    """Four multipliers/offsets for the rank hash, derived from the seed the same way everywhere."""
    digest = hashlib.sha256(f"dlindex-seed:{int(seed)}".encode()).digest()
    a, b, c, d = (int.from_bytes(digest[i : i + 8], "big") for i in range(0, 32, 8))
    return {
        "seed_a": 1 + a % 2147483646,
        "seed_b": b % 2147483647,
        "seed_c": 1 + c % 2147483628,
        "seed_d": d % 2147483629,
    }


def _replace_columns(spec: QuerySpec, columns: tuple[str, ...]) -> QuerySpec:
    return replace(spec, columns=columns)


def _rows(catalog: Catalog, prepared: PreparedQuery) -> Iterator[dict[str, Any]]:
    make = _row_maker(prepared)
    if not prepared.cache:
        for row in catalog.read(prepared.sql, prepared.params):
            yield make(row)
        return
    key = cache.cache_key(prepared.selection_sql, prepared.params)
    changes = catalog.changes()  # read first: a write after it can only make the entry unusable
    ids = cache.lookup(catalog, key, changes)
    if ids is not None:
        yield from _cached_rows(catalog, prepared, ids, make)
        return
    found: list[int] | None = []
    spent: list[float] = []
    for row in catalog.read(prepared.sql, prepared.params, on_done=lambda seconds, _: spent.append(seconds)):
        if found is not None:
            found.append(row[0])
            if len(found) > cache.MAX_ROWS:
                found = None
        yield make(row)
    if found is not None and spent and cache.worth_storing(spent[0], len(found)):
        cache.store(catalog, key, changes, found)


def _cached_rows(
    catalog: Catalog, prepared: PreparedQuery, ids: array.array[int], make: Callable[[tuple[Any, ...]], dict[str, Any]]
) -> Iterator[dict[str, Any]]:
    seconds = 0.0
    rows = 0
    try:
        if prepared.base == ("id",):
            for id_ in ids:
                rows += 1
                yield {"id": id_}
            return
        batches = cache.fetch(catalog, ids, ", ".join(_STORED[c] for c in prepared.base))
        while True:
            began = time.perf_counter()
            batch = next(batches, None)
            seconds += time.perf_counter() - began
            if batch is None:
                break
            for row in batch:
                rows += 1
                yield make(row)
    finally:
        catalog.querylog.record_read(catalog.conn, prepared.sql, prepared.params, seconds, rows, cached=True)


def _row_maker(prepared: PreparedQuery) -> Callable[[tuple[Any, ...]], dict[str, Any]]:
    """A function turning one selected tuple into the output dict (~1 us a row)."""
    position = {name: i for i, name in enumerate(prepared.base)}
    columns = prepared.columns
    if tuple(columns) == prepared.base:
        return lambda row: dict(zip(columns, row))
    derived = [c for c in columns if c not in position]
    # Derived values are appended to the row, then one C-level pick puts all in order.
    extra = {c: len(prepared.base) + k for k, c in enumerate(derived)}
    indexes = [position[c] if c in position else extra[c] for c in columns]
    pick: Callable[[tuple[Any, ...]], tuple[Any, ...]] = (
        itemgetter(*indexes) if len(indexes) > 1 else lambda row: (row[indexes[0]],)
    )
    if not derived:
        return lambda row: dict(zip(columns, pick(row)))
    getters = tuple(_getter(c, position, prepared) for c in derived)
    if len(getters) == 1:
        (get,) = getters
        return lambda row: dict(zip(columns, pick(row + (get(row),))))
    return lambda row: dict(zip(columns, pick(row + tuple(g(row) for g in getters))))


def _getter(column: str, position: dict[str, int], prepared: PreparedQuery) -> Callable[[tuple[Any, ...]], Any]:
    if column == "label":
        labels, i = prepared.labels or {}, position["label_row"]
        return lambda row: labels.get(row[i])
    if column == "label_id":
        index, i = prepared.class_index or {}, position["label_row"]
        return lambda row: index.get(row[i])
    roots = prepared.roots or {}
    if column == "root":
        texts, i = {k: v[0] for k, v in roots.items()}, position["root_id"]
        return lambda row: texts.get(row[i])
    assert column == "path", column
    r, f, b = position["root_id"], position["file_path"], position["file_path_bytes"]
    # Roots whose name is plain UTF-8 join as text; the others, and files with non-UTF-8
    # names, join as exact bytes, decoded losslessly (os.fsencode gives the real name back).
    texts = {k: text.rstrip("/") + "/" for k, (text, prefix) in roots.items() if os.fsencode(text) + b"/" == prefix}

    def path(row: tuple[Any, ...]) -> str | None:
        if row[b] is None:
            text = texts.get(row[r])
            if text is not None:
                return text + str(row[f])
        root = roots.get(row[r])
        if root is None:
            return None
        return os.fsdecode(root[1] + (bytes(row[b]) if row[b] is not None else os.fsencode(str(row[f]))))

    return path
