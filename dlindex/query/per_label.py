"""``--per-label N``: at most N rows of each label, the same N for a seed, in one of two shapes.

What a seed picks: each row's ``path_hash`` (the first 60 bits of the MD5 of its path under
its root, so a tree gives the same sample whatever ids its scan gave) is a point on a ring;
the seed names a point on it (the *pivot*), and a label's sample is the N rows that follow
the pivot: ``path_hash >= pivot`` in ascending order, then, wrapping round, ``path_hash <
pivot``, then rows no scan wrote (``path_hash`` NULL) by id; the id breaks ties. Hashes are
spread evenly, so the N rows after any point are a uniform sample of the label.

Two statements compute that same sample:

* ``SEEK``, for an index on ``(label_id, path_hash)`` whose partial WHERE the filters
  imply (``dlindex index`` creates one; docs/scale.md): per label, three index range scans
  of at most N entries each. Its cost follows the sample's size, not the catalog's.
* ``WINDOW``, for any catalog: one pass numbering each label's rows in that order
  (``ROW_NUMBER() OVER (PARTITION BY label_id ...)``) and one sort. Without that index the
  seek would read each label's rows three times, so a catalog takes it only when its planner
  shows every range scan served by such an index.

A server catalog's seek is ``SERVER_SEEK``: the same arcs, per label through ``CROSS JOIN
LATERAL`` (PostgreSQL runs a correlated ``IN`` in a join as a filter over every pair of label
and row; the lateral arcs are one Limit over three index scans per label, the later ones run
only while the earlier gave fewer than N rows). Its plan is read as JSON (``server_served``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from dlindex.catalog.sqlite.history_schema import ROW_COLUMNS

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.catalog.postgres.connect import PgConnection

PIVOT_BITS = 60  # path_hash's width (dlindex.catalog.migrations.path_hash)

WINDOW = (
    "SELECT {columns} FROM image_metadata WHERE image_metadata.id IN (SELECT sample_id FROM ("
    "SELECT sample_id, ROW_NUMBER() OVER (PARTITION BY sample_label ORDER BY sample_arc, sample_key, sample_id) "
    "AS label_rank FROM (SELECT image_metadata.id AS sample_id, image_metadata.label_id AS sample_label, "
    "CASE WHEN image_metadata.path_hash IS NULL THEN 2 WHEN image_metadata.path_hash >= :pivot THEN 0 ELSE 1 END "
    "AS sample_arc, image_metadata.path_hash AS sample_key "
    "FROM image_metadata{where}) AS ranked) AS numbered WHERE label_rank <= :per_label){order}{limit}"
)
# One label's sample: the arc from the pivot, the arc before it, the rows without a hash.
# SQLite reads the arms of a UNION ALL in order and stops at the outer LIMIT.
_ARC = (
    "SELECT sample_id FROM (SELECT sample_rows.id AS sample_id FROM image_metadata AS sample_rows "
    "WHERE {label}{where} AND sample_rows.path_hash {arc} ORDER BY {key} LIMIT :per_label)"
)
# The three arcs of a label's sample: from the pivot on, before it, rows without a path hash
# (name: the subquery's alias where the server requires one).
_ARC_KINDS = (
    (">= :pivot", "sample_rows.path_hash, sample_rows.id", "arc_after"),
    ("< :pivot", "sample_rows.path_hash, sample_rows.id", "arc_before"),
    ("IS NULL", "sample_rows.id", "arc_unhashed"),
)


def _arcs(named: bool) -> str:
    def arc(where: str, key: str, name: str) -> str:
        text = _ARC.replace("{arc}", where).replace("{key}", key)
        return text.replace(" LIMIT :per_label)", f" LIMIT :per_label) AS {name}") if named else text

    return " UNION ALL ".join(arc(*kind) for kind in _ARC_KINDS) + " LIMIT :per_label"


_ARCS = _arcs(named=False)
# Each label's arcs, as a JSON array of ids that json_each lists (SQLite has no LATERAL join):
# no table row is read until the outer statement fetches the sample by id, in id order (a
# join on image_metadata would read every sampled row once more first, in label and hash order:
# at 10^8 rows, 32,000 random page reads before the fetch).
_SEEK_HEAD = "SELECT {columns} FROM image_metadata WHERE image_metadata.id IN ("
_SEEK_IDS = "picked.value FROM labels AS sample_labels, json_each("  # what this seek's ids begin with
_SEEK_TAIL = "){order}{limit}"
SEEK = (
    _SEEK_HEAD
    + "SELECT "
    + _SEEK_IDS
    + "(SELECT json_group_array(sample_id) FROM ("
    + _ARCS.replace("{label}", "sample_rows.label_id = sample_labels.id")
    + "))) AS picked UNION ALL SELECT sample_id FROM ("
    + _ARCS.replace("{label}", "sample_rows.label_id IS NULL")
    + ")"
    + _SEEK_TAIL
)


# PostgreSQL: each label's arcs as a lateral subquery (arms and subqueries named, as it requires)
_SERVER_ARCS = _arcs(named=True)
SERVER_SEEK = (
    "SELECT {columns} FROM image_metadata WHERE image_metadata.id IN ("
    "SELECT picked.sample_id FROM labels AS sample_labels CROSS JOIN LATERAL ("
    + _SERVER_ARCS.replace("{label}", "sample_rows.label_id = sample_labels.id")
    + ") AS picked UNION ALL SELECT unlabelled.sample_id FROM ("
    + _SERVER_ARCS.replace("{label}", "sample_rows.label_id IS NULL")
    + ") AS unlabelled){order}{limit}"
)


def pivot(seed: int) -> int:
    """The point on the path_hash ring where ``seed``'s sample of each label starts."""
    digest = hashlib.sha256(f"dlindex-per-label:{int(seed)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - PIVOT_BITS)


def template(catalog: Catalog, where: list[str], params: dict[str, Any]) -> str:
    """The per-label statement for these filters (``{columns}``, ``{order}``, ``{limit}`` left open)."""
    window = WINDOW.replace("{where}", " WHERE " + " AND ".join(where) if where else "")
    server = catalog.backend.is_server
    if catalog.pinned is not None and not server:
        params["pinned_state"] = catalog.pinned.state
        pinned = _pinned_seek(where)
        statement = pinned.replace("{columns}", "image_metadata.id").replace("{order}", "").replace("{limit}", "")
        plan = [str(r[3]) for r in catalog.conn.execute("EXPLAIN QUERY PLAN " + statement, params)]
        return pinned if seek_served(plan) and history_served(plan) else _materialized(window)
    seek = _seek(" AND ".join(where), server)
    statement = seek.replace("{columns}", "image_metadata.id").replace("{order}", "").replace("{limit}", "")
    return seek if (_server_served if server else _served)(catalog, statement, params) else window


# A past state's rows are a view of two parts (dlindex.catalog.as_of); SQLite reads the outer
# statement part by part and would number every row once for each: numbered once, here.
_OUTER = "SELECT {columns} FROM image_metadata WHERE image_metadata.id IN ("


def _materialized(window: str) -> str:
    inner, rest = window[len(_OUTER) :].rsplit("){order}", 1)
    return f"WITH sampled AS MATERIALIZED ({inner}) {_OUTER}SELECT sample_id FROM sampled){{order}}{rest}"


# A past state's sample when an index serves the live table's seek: that seek on the live rows
# of the state gives each label's first N there, read once with every column (the output comes
# from these rows, not from the view a second time); a history row of the state (a row changed
# since it) can only be in the sample if it comes before the label's N-th live row (its bound),
# so only those are read besides, by the schema's history index (image_history_label), three
# arcs as the live seek's, each up to the bound; a label with fewer than N live rows (no bound),
# and the rows without a label, take all their history rows of the state. The two are numbered
# once as WINDOW numbers rows, and the statement's own ``image_metadata`` (a name without a
# schema finds the statement's table first) holds the sampled rows. Row values compare arc, key
# and id in WINDOW's order; a row without a path hash is arc 2, its key -1, ordered by id.
_ARC_OF = "CASE WHEN {t}.path_hash IS NULL THEN 2 WHEN {t}.path_hash >= :pivot THEN 0 ELSE 1 END"
_RANKED = _ARC_OF + ", coalesce({t}.path_hash, -1), {t}.id"
_ALL_COLUMNS = ", ".join((*ROW_COLUMNS, "valid_from"))
_HISTORY_COLUMNS = ", ".join(f"sample_history.{c}" for c in (*ROW_COLUMNS, "valid_from"))
_LAST_KEY = (1 << 63) - 1
# Unary plus: the state's span is checked on each row the label index finds, never the
# history's key range read instead (after ANALYZE, SQLite may prefer "valid_to > S": at an old
# state, every history row).
_IN_STATE = "+sample_history.valid_from <= :pinned_state AND +sample_history.valid_to > :pinned_state{history}"
_BEFORE_BOUND = (
    "(" + _RANKED.format(t="sample_history") + ") < (bounds.sample_arc, bounds.sample_key, bounds.sample_id)"
)
_BOUNDED = "SELECT {past} FROM sample_bounds AS bounds CROSS JOIN main.image_history AS sample_history WHERE sample_history.label_id = bounds.sample_label AND "
_PAST = " UNION ALL ".join((
    _BOUNDED + "sample_history.path_hash >= :pivot AND sample_history.path_hash <= CASE WHEN bounds.sample_arc = 0 "
    f"THEN bounds.sample_key ELSE {_LAST_KEY} END AND {_IN_STATE} AND {_BEFORE_BOUND}",
    _BOUNDED + "bounds.sample_arc >= 1 AND sample_history.path_hash < :pivot AND sample_history.path_hash <= CASE "
    f"WHEN bounds.sample_arc = 1 THEN bounds.sample_key ELSE {_LAST_KEY} END AND {_IN_STATE} AND {_BEFORE_BOUND}",
    _BOUNDED + f"bounds.sample_arc = 2 AND sample_history.path_hash IS NULL AND {_IN_STATE} AND {_BEFORE_BOUND}",
    "SELECT {past} FROM labels AS unbounded CROSS JOIN main.image_history AS sample_history "
    "WHERE sample_history.label_id = unbounded.id AND unbounded.id NOT IN (SELECT sample_label FROM sample_bounds) "
    f"AND {_IN_STATE}",
    f"SELECT {{past}} FROM main.image_history AS sample_history WHERE sample_history.label_id IS NULL AND {_IN_STATE}",
)).replace("{past}", _HISTORY_COLUMNS)  # fmt: skip
_PINNED = (
    f"WITH sample_live AS MATERIALIZED (SELECT {_ALL_COLUMNS} FROM main.image_metadata WHERE id IN ({{live}})), "
    "sample_bounds AS MATERIALIZED (SELECT sample_label, sample_arc, sample_key, sample_id FROM (SELECT label_id AS "
    "sample_label, " + _ARC_OF.format(t="sample_live") + " AS sample_arc, coalesce(path_hash, -1) AS sample_key, id "
    "AS sample_id, ROW_NUMBER() OVER (PARTITION BY label_id ORDER BY " + _RANKED.format(t="sample_live") + ") AS "
    "bound_rank FROM sample_live) AS ranked WHERE bound_rank = :per_label AND sample_label IS NOT NULL), "
    f"sample_past AS MATERIALIZED ({_PAST}), "
    "sample_candidates AS (SELECT * FROM sample_live UNION ALL SELECT * FROM sample_past), "
    "sampled AS MATERIALIZED (SELECT sample_id FROM (SELECT id AS sample_id, ROW_NUMBER() OVER (PARTITION BY label_id "
    "ORDER BY " + _RANKED.format(t="sample_candidates") + ") AS label_rank FROM sample_candidates) AS numbered WHERE "
    "label_rank <= :per_label), image_metadata AS (SELECT * FROM sample_candidates WHERE id IN (SELECT sample_id "
    "FROM sampled)) " + _OUTER + "SELECT sample_id FROM sampled){order}{limit}"
)
_LIVE_AT_STATE = "(image_metadata.valid_from IS NULL OR image_metadata.valid_from <= :pinned_state)"


def _pinned_seek(where: list[str]) -> str:
    live = _seek(" AND ".join([*where, _LIVE_AT_STATE]))
    live = live[len(_SEEK_HEAD) : -len(_SEEK_TAIL)].replace("FROM image_metadata AS", "FROM main.image_metadata AS")
    history = "".join(" AND " + w.replace("image_metadata.", "sample_history.") for w in where)
    return _PINNED.replace("{live}", live).replace("{history}", history)


def picked(template: str) -> str | None:
    """The ids of a file catalog's seek (``template``'s, ``{order}`` and ``{limit}`` still open)
    alone, read from the index without a table row (dlindex.query.fetch then reads the rows);
    None for any other statement."""
    if template.startswith(_SEEK_HEAD + "SELECT " + _SEEK_IDS) and template.endswith(
        _SEEK_TAIL
    ):  # not WINDOW's, not the server's
        return template[len(_SEEK_HEAD) : -len(_SEEK_TAIL)]
    return None


def _seek(where: str, server: bool = False) -> str:
    filters = " AND " + where.replace("image_metadata.", "sample_rows.") if where else ""
    return (SERVER_SEEK if server else SEEK).replace("{where}", filters)


# A WINDOW statement as it is run and logged: its columns, filters, order and limit.
_WINDOW_TEXT = re.compile(
    "".join(
        {"{columns}": "(?P<columns>.+?)", "{where}": "(?: WHERE (?P<where>.+?))?", "{order}": "(?P<tail>.*)"}.get(
            part, "" if part == "{limit}" else re.escape(part)
        )
        for part in re.split(r"(\{\w+\})", WINDOW)
    ),
    re.S,
)


def seek_of(sql: str, server: bool = False) -> str | None:
    """The SEEK statement (``server``: SERVER_SEEK) giving the same rows as the logged WINDOW
    statement ``sql`` (same parameters): what ``dlindex query`` runs instead once an index
    serves it; None if ``sql`` is no per-label WINDOW statement."""
    m = _WINDOW_TEXT.fullmatch(sql)
    if m is None:
        return None
    return _seek(m["where"] or "", server).replace("{columns}", m["columns"]).replace("{order}{limit}", m["tail"])


def seek_served(plan: Sequence[str]) -> bool:
    """Whether an EXPLAIN QUERY PLAN of a SEEK statement reads every arm as an index range
    over (label_id, path_hash)."""
    reads = [line for line in plan if " sample_rows" in line]
    return bool(reads) and all(
        line.startswith("SEARCH sample_rows USING") and "INDEX" in line and "path_hash" in line for line in reads
    )


def history_served(plan: Sequence[str]) -> bool:
    """Whether an EXPLAIN QUERY PLAN of a past state's seek reads the history rows by label
    through an index (the schema's image_history_label), never the whole history."""
    reads = [line for line in plan if line.startswith(("SEARCH sample_history", "SCAN sample_history"))]
    return bool(reads) and all(
        line.startswith("SEARCH sample_history USING") and "INDEX" in line and "label_id" in line for line in reads
    )


def server_served(plan: Mapping[str, Any]) -> bool:
    """Whether a PostgreSQL plan (``EXPLAIN (FORMAT JSON)``'s "Plan") of a SERVER_SEEK statement
    reads every arc (the scans of ``sample_rows``) as an index range whose condition holds
    label_id and path_hash: an index scan in order, or a bitmap of that range (the planner's
    choice for an arc it expects to be short), never the label's or the table's rows."""
    arms = [node for node in _nodes(plan) if str(node.get("Alias", "")).startswith("sample_rows")]
    return bool(arms) and all(_ranged(node) for node in arms)


def _ranged(node: Mapping[str, Any]) -> bool:
    if node.get("Node Type") == "Bitmap Heap Scan":
        return any(_ranged(child) for child in node.get("Plans", ()) if child.get("Node Type") == "Bitmap Index Scan")
    condition = str(node.get("Index Cond", ""))
    return node.get("Node Type") in ("Index Scan", "Index Only Scan", "Bitmap Index Scan") and all(
        column in condition for column in ("label_id", "path_hash")
    )


def _nodes(plan: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def _served(catalog: Catalog, sql: str, params: dict[str, Any]) -> bool:
    """Whether SQLite reads every arm of ``sql`` as an index range over (label_id, path_hash)."""
    return seek_served([str(r[3]) for r in catalog.conn.execute("EXPLAIN QUERY PLAN " + sql, params)])


def _server_served(catalog: Catalog, sql: str, params: dict[str, Any]) -> bool:
    """``server_served`` of the server's plan of ``sql`` (planned, not run)."""
    from dlindex.catalog.postgres.dialect import server_statement

    text, bound = server_statement(sql, params)
    conn = cast("PgConnection", catalog.conn)
    row = conn.execute_raw(f"EXPLAIN (FORMAT JSON) {text}", bound).fetchone()
    data = row[0] if row else [{}]
    data = json.loads(data) if isinstance(data, str) else data
    return server_served(data[0].get("Plan", {}))
