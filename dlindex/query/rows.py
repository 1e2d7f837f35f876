"""Training-time queries: composable filters, class-balanced sampling, seeded order, result cache.

Every query is one parameterised statement assembled from the constant fragments below:
values (labels, times, sizes, limits, seeds) are always bound parameters. The enum
filters (status, processed, processing status, excluded) are SQL literals chosen from fixed
whitelists, because a partial index such as ``WHERE processed = 1`` serves only a query
that carries the same literal; nothing the user types reaches the SQL text.
"""

from __future__ import annotations

import array
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dlindex.catalog.classes import SPLITS
from dlindex.errors import InputError
from dlindex.query import cache, fetch, per_label, windows
from dlindex.query.filters import filters, text_form
from dlindex.query.lookups import class_numbers, classes_of, label_names, roots_by_id
from dlindex.query.spec import (
    DERIVED,
    ORDERS,
    STORED,
    TEXT_COLUMNS,
    QuerySpec,
    check_columns,
    check_count,
    with_columns,
)

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog


_SELECT = "SELECT {columns} FROM image_metadata{where}{order}{limit}"
# What --order random ranks a row by: the hash of its path under its root (path_hash), so a
# tree gives the same sample whatever ids its scan gave (ids follow the workers' timing) and
# on either backend. Rows no scan wrote (path_hash NULL) fall back to their id.
_KEY = "coalesce(image_metadata.path_hash, image_metadata.id)"
# A seeded hash of the key in plain SQL (any SQLite client can rerun the logged statement):
# an affine map mod a prime, squared (the non-linear step that breaks the lattice pattern
# an affine map alone leaves), then another affine map. Every product stays below 2**63.
# Ranks collide (about 2**31 values): the key, then the id, break ties.
_MIX = f"((({_KEY} % 2147483647) * :seed_a + :seed_b) % 2147483647)"
_RANK = f"((({_MIX} * {_MIX}) % 2147483629) * :seed_c + :seed_d) % 2147483587"
_ORDER_ID = " ORDER BY image_metadata.id"
_ORDER_RANDOM = " ORDER BY " + _RANK + ", " + _KEY + ", image_metadata.id"
_LIMIT = " LIMIT :limit"
# One pass and no sort (GROUP BY split sorted every selected row): a count per split folder, and of none.
_SPLIT_COUNTS = (
    "SELECT "
    + "".join(f"count(*) FILTER (WHERE image_metadata.split = '{name}'), " for name in SPLITS)
    + "count(*) FILTER (WHERE image_metadata.split IS NULL) FROM image_metadata{where}"
)
_ANY_SPLIT = "SELECT EXISTS (SELECT 1 FROM image_metadata WHERE {where})"
_LIMIT_OFFSET = " LIMIT :limit OFFSET :offset"
_OFFSET = " LIMIT -1 OFFSET :offset"  # SQLite takes OFFSET only after a LIMIT; -1 is none


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
    # The ids alone, from an index (a file catalog's per-label seek or narrow time window, in
    # id order): their rows are then read by id through several connections
    # (dlindex.query.fetch). None: ``sql`` runs as one statement.
    picked_sql: str | None = None


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
    prepared = prepare(catalog, with_columns(spec or QuerySpec(**options), ("id",)))
    return [row["id"] for row in _rows(catalog, prepared)]


def explain(catalog: Catalog, spec: QuerySpec) -> Explained:
    """The statement ``spec`` runs, its parameters and SQLite's ``EXPLAIN QUERY PLAN``."""
    prepared = prepare(catalog, spec)
    plan = tuple(str(r[3]) for r in catalog.conn.execute("EXPLAIN QUERY PLAN " + prepared.sql, prepared.params))
    return Explained(prepared.sql, prepared.params, plan)


def split_counts(catalog: Catalog, spec: QuerySpec) -> dict[str | None, int]:
    """Files per tree split (SPLITS; None: not in a split folder; only those with files) among
    those ``spec``'s filters select (before --per-label and --limit)."""
    where, params = filters(catalog, spec)
    where_sql = " WHERE " + " AND ".join(where) if where else ""
    (counts,) = catalog.read(_SPLIT_COUNTS.replace("{where}", where_sql), params)
    return {split: int(n) for split, n in zip((*SPLITS, None), counts, strict=True) if n}


def any_in_split_folder(catalog: Catalog, spec: QuerySpec) -> bool:
    """Is some sample ``spec``'s filters select in a tree split folder? (Stops at the first.)"""
    where, params = filters(catalog, spec)
    where_sql = " AND ".join([*where, "image_metadata.split IS NOT NULL"])
    ((found,),) = catalog.read(_ANY_SPLIT.replace("{where}", where_sql), params)
    return bool(found)


def prepare(catalog: Catalog, spec: QuerySpec) -> PreparedQuery:
    """Check every option and build the statement; all errors are InputError, raised here."""
    columns = check_columns(tuple(spec.columns or ()))
    if catalog.pinned is not None and set(columns) & set(TEXT_COLUMNS):
        raise InputError(
            "the text and texts columns are the texts as they are now (texts keep no history yet): not with --at"
        )
    where, params = filters(catalog, spec)
    if spec.order not in ORDERS:
        raise InputError(f"unknown order {spec.order!r}; choose id or random")
    random_order = spec.order == "random"
    if random_order:
        params.update(_seed_params(spec.seed))
    if spec.limit is not None:
        params["limit"] = check_count("--limit", spec.limit, 0)
    if spec.offset:
        params["offset"] = check_count("--offset", spec.offset, 0)
        limit = _LIMIT_OFFSET if spec.limit is not None else _OFFSET
    else:
        limit = _LIMIT if spec.limit is not None else ""
    base = ["id"]
    for column in columns:
        for stored in DERIVED.get(column, (column,)):
            if stored not in base:
                base.append(stored)
    classes = class_list = index = None
    if "label_id" in columns:
        classes, class_list = classes_of(catalog, spec)
        index = class_numbers(catalog, classes)
    picked_sql = None
    if spec.per_label is not None:
        params["per_label"] = check_count("--per-label", spec.per_label, 1)
        params["pivot"] = per_label.pivot(spec.seed)
        template = per_label.template(catalog, where, params)
        picked_sql = None if random_order else per_label.picked(template)
    else:
        if spec.text is not None and spec.limit is not None and not random_order:
            where = text_form(catalog, where, params, spec.limit + (spec.offset or 0))
        where, narrow = windows.choose(catalog, where, params)
        template = _SELECT.replace("{where}", " WHERE " + " AND ".join(where) if where else "")
        picked_sql = windows.ids_from_index(catalog, where, params) if narrow and not random_order else None
    order = _ORDER_RANDOM if random_order else _ORDER_ID
    template = template.replace("{order}", order).replace("{limit}", limit)
    return PreparedQuery(
        sql=template.replace("{columns}", ", ".join(STORED[c] for c in base)),
        params=params,
        selection_sql=template.replace("{columns}", STORED["id"]),
        columns=columns,
        base=tuple(base),
        cache=spec.cache,
        labels=label_names(catalog) if "label" in columns else None,
        classes=classes,
        class_list=class_list,
        class_index=index,
        roots=roots_by_id(catalog) if "path" in columns or "root" in columns else None,
        picked_sql=picked_sql,
    )


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


def _rows(catalog: Catalog, prepared: PreparedQuery) -> Iterator[dict[str, Any]]:
    make = _row_maker(prepared)
    if not prepared.cache or catalog.pinned is not None:  # the cache keys the current state only
        yield from map(make, read_rows(catalog, prepared))
        return
    key = cache.cache_key(prepared.selection_sql, prepared.params)
    changes = catalog.changes()  # read first: a write after it can only make the entry unusable
    ids = cache.lookup(catalog, key, changes)
    if ids is not None:
        yield from _cached_rows(catalog, prepared, ids, make)
        return
    found: list[int] = []
    spent: list[float] = []
    rows = read_rows(catalog, prepared, on_done=lambda seconds, _: spent.append(seconds))
    keep, complete = found.append, True
    for row in rows:
        keep(row[0])
        yield make(row)
        if len(found) > cache.MAX_ROWS:  # too many to cache: the rest go straight through
            complete = False
            yield from map(make, rows)
            break
    if complete and spent and cache.worth_storing(spent[0], len(found)):
        cache.store(catalog, key, changes, found)


def read_rows(catalog: Catalog, prepared: PreparedQuery, **on_done: Any) -> Iterator[tuple[Any, ...]]:
    """The statement's rows; a sample's through several connections (dlindex.query.fetch)."""
    if prepared.picked_sql is None:
        return catalog.read(prepared.sql, prepared.params, **on_done)
    columns = ", ".join(STORED[c] for c in prepared.base)
    return fetch.sample_rows(catalog, prepared.sql, prepared.picked_sql, prepared.params, columns, **on_done)


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
        batches = fetch.cached_rows(catalog, ids, ", ".join(STORED[c] for c in prepared.base))
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
    """A function turning one selected tuple into the output dict (~0.3 us a row).

    It is one dict display made for these columns, ``lambda row: {'id': row[0], 'label':
    _label(row[3]), ...}``: no per-row loop, zip or generator. Column names come from the
    whitelist (check_columns), written with repr; the values stay in ``row``.
    """
    position = {name: i for i, name in enumerate(prepared.base)}
    env: dict[str, Any] = {}
    items = []
    for column in prepared.columns:
        if column in position:
            items.append(f"{column!r}: row[{position[column]}]")
        else:
            env["_" + column] = _getter(column, position, prepared)
            items.append(f"{column!r}: _{column}(row)")
    maker: Callable[[tuple[Any, ...]], dict[str, Any]] = eval("lambda row: {" + ", ".join(items) + "}", env)
    return maker


def _getter(column: str, position: dict[str, int], prepared: PreparedQuery) -> Callable[[tuple[Any, ...]], Any]:
    if column == "label":
        labels, i = (prepared.labels or {}).get, position["label_row"]
        return lambda row: labels(row[i])
    if column == "label_id":
        index, i = (prepared.class_index or {}).get, position["label_row"]
        return lambda row: index(row[i])
    if column == "texts":  # a JSON array (SQLite's text, the server's list); no texts: [] (the server's NULL)
        i = position["texts_json"]
        return lambda row: json.loads(row[i]) if isinstance(row[i], str) else (row[i] or [])
    roots = prepared.roots or {}
    if column == "root":
        root_texts, i = {k: v[0] for k, v in roots.items()}.get, position["root_id"]
        return lambda row: root_texts(row[i])
    assert column == "path", column
    r, f, b = position["root_id"], position["file_path"], position["file_path_bytes"]
    # Roots whose name is plain UTF-8 join as text; the others, and files with non-UTF-8
    # names, join as exact bytes, decoded losslessly (os.fsencode gives the real name back).
    texts = {k: text.rstrip("/") + "/" for k, (text, prefix) in roots.items() if os.fsencode(text) + b"/" == prefix}
    text_of = texts.get

    def path(row: tuple[Any, ...]) -> str | None:
        if row[b] is None:
            text = text_of(row[r])
            if text is not None:
                return text + str(row[f])
        root = roots.get(row[r])
        if root is None:
            return None
        return os.fsdecode(root[1] + (bytes(row[b]) if row[b] is not None else os.fsencode(str(row[f]))))

    return path
