"""The rows of a merge: part catalogs copied into temp tables keyed by path, then applied to
the catalog in one statement per table (``dlindex.catalog.merge`` checks the parts and runs
this inside its write transaction).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from dlindex.catalog import merge_cut, merge_texts
from dlindex.catalog.shard_runs import RUN_COLUMNS
from dlindex.errors import InputError

# What a sample row says, besides its key (root path, file path) and its id and time stamps.
CONTENT = (
    "file_path_bytes", "label", "width", "height", "format", "mode", "bytes", "mtime_ns", "xxh3_128", "status",
    "error", "warning", "processed", "processing_status", "split", "pixel_limit", "orientation", "excluded",
    "inode", "ctime_ns", "path_hash",
)  # fmt: skip
_TARGETCONTENT = {"label": "tl.name"}  # the rest are columns of image_metadata as they are

_TEMP_TABLES = (
    """CREATE TEMP TABLE m_roots (src INTEGER, path TEXT, path_bytes BLOB, presplit INTEGER, added_at TEXT)""",
    f"""CREATE TEMP TABLE m_rows (src INTEGER, root_path TEXT, file_path TEXT, {", ".join(CONTENT)},
        created_at TEXT, updated_at TEXT)""",
    """CREATE TEMP TABLE m_types (src INTEGER, name TEXT, dim INTEGER, dtype TEXT, extractor TEXT,
        extractor_version INTEGER)""",
    """CREATE TEMP TABLE m_versions (src INTEGER, feature_type TEXT, id INTEGER, version TEXT, first_used TEXT)""",
    """CREATE TEMP TABLE m_vectors (src INTEGER, root_path TEXT, file_path TEXT, xxh3_128 TEXT,
        feature_type TEXT, vector BLOB, created_at TEXT, updated_at TEXT, extractor_version INTEGER)""",
    """CREATE TEMP TABLE m_state (src INTEGER, root_path TEXT, file_path TEXT, xxh3_128 TEXT,
        feature_type TEXT, state TEXT, error TEXT, updated_at TEXT)""",
    """CREATE TEMP TABLE m_attrs (src INTEGER, root_path TEXT, file_path TEXT, name TEXT, value TEXT)""",
    """CREATE TEMP TABLE m_scans (src INTEGER, root_path TEXT, options TEXT, pid INTEGER, state TEXT,
        started_at TEXT, finished_at TEXT, seen INTEGER, new INTEGER, changed INTEGER, unchanged INTEGER,
        missing INTEGER, corrupt INTEGER, skipped INTEGER, errors INTEGER, seconds REAL)""",
    f"CREATE TEMP TABLE m_runs (src INTEGER, {RUN_COLUMNS})",
    merge_texts.TEMP_TABLE,
)
_COPY_FROM_PART = (
    """INSERT INTO temp.m_roots SELECT :part, path, path_bytes, presplit, added_at FROM part.roots""",
    f"""INSERT INTO temp.m_rows SELECT :part, r.path, i.file_path,
            {", ".join("l.name" if c == "label" else "i." + c for c in CONTENT)}, i.created_at, i.updated_at
        FROM part.image_metadata i JOIN part.roots r ON r.id = i.root_id LEFT JOIN part.labels l ON l.id = i.label_id""",
    """INSERT INTO temp.m_types SELECT :part, name, dim, dtype, extractor, extractor_version FROM part.feature_types""",
    """INSERT INTO temp.m_versions SELECT :part, feature_type, id, version, first_used FROM part.extractor_versions""",
    """INSERT INTO temp.m_vectors SELECT :part, r.path, i.file_path, i.xxh3_128, f.feature_type, f.vector,
            f.created_at, f.updated_at, f.extractor_version
        FROM part.image_features f JOIN part.image_metadata i ON i.id = f.image_id JOIN part.roots r ON r.id = i.root_id""",
    """INSERT INTO temp.m_state SELECT :part, r.path, i.file_path, i.xxh3_128, s.feature_type, s.state, s.error,
            s.updated_at
        FROM part.feature_state s JOIN part.image_metadata i ON i.id = s.image_id JOIN part.roots r ON r.id = i.root_id""",
    """INSERT INTO temp.m_attrs SELECT :part, r.path, i.file_path, a.name, a.value
        FROM part.sample_attributes a JOIN part.image_metadata i ON i.id = a.image_id
        JOIN part.roots r ON r.id = i.root_id""",
    """INSERT INTO temp.m_scans SELECT :part, r.path, s.options, s.pid, s.state, s.started_at, s.finished_at, s.seen,
            s.new, s.changed, s.unchanged, s.missing, s.corrupt, s.skipped, s.errors, s.seconds
        FROM part.scans s JOIN part.roots r ON r.id = s.root_id""",
    f"INSERT INTO temp.m_runs SELECT :part, {RUN_COLUMNS} FROM part.shard_runs",
    merge_texts.COPY_FROM_PART,
)

# The target's row for a key: (root path, file path) -> image_metadata via the unique index.
_TARGET_ROW = """SELECT t.id FROM main.image_metadata t JOIN main.roots tr ON tr.id = t.root_id
    WHERE tr.path = {m}.root_path AND t.file_path = {m}.file_path"""
_SAME_ROW = (
    "DELETE FROM temp.m_rows WHERE EXISTS (SELECT 1 FROM main.image_metadata t JOIN main.roots tr ON tr.id = t.root_id "
    "LEFT JOIN main.labels tl ON tl.id = t.label_id WHERE tr.path = m_rows.root_path "
    "AND t.file_path = m_rows.file_path AND "
    + " AND ".join(f"{_TARGETCONTENT.get(c, 't.' + c)} IS m_rows.{c}" for c in CONTENT)
    + ")"
)
# Among parts: rows equal to another part's row of the same key are dropped; what is left with
# two rows of one key is a conflict.
_SAME_AMONG_PARTS = (
    "DELETE FROM temp.{table} WHERE rowid NOT IN (SELECT min(rowid) FROM temp.{table} GROUP BY {columns})"
)
_ROWS_BY_KEY = "CREATE INDEX temp.m_rows_key ON m_rows (root_path, file_path)"
_SHARED_KEY = "SELECT 1 FROM temp.m_rows GROUP BY root_path, file_path HAVING count(*) > 1 LIMIT 1"
_CONFLICT = (
    "SELECT root_path, file_path{extra}, group_concat(src) FROM temp.{table} "
    "GROUP BY root_path, file_path{extra} HAVING count(*) > 1 LIMIT 1"
)
_ADD_ROOTS = (
    "INSERT OR IGNORE INTO main.roots (path, path_bytes, added_at) "
    "SELECT path, path_bytes, min(added_at) FROM temp.m_roots GROUP BY path ORDER BY path"
)
# A root's split-folder verdict comes from the part that scanned it (copies agree with the target).
_ROOT_PRESPLIT = """UPDATE main.roots SET presplit = m.presplit
    FROM (SELECT m_roots.path, max(m_roots.presplit) AS presplit FROM temp.m_roots JOIN temp.m_runs
          ON m_runs.src = m_roots.src AND m_runs.job = 'scan' AND m_runs.subject = m_roots.path
          GROUP BY m_roots.path) AS m
    WHERE roots.path = m.path"""
_ADD_LABELS = (
    "INSERT OR IGNORE INTO main.labels (name) SELECT DISTINCT label FROM temp.m_rows "
    "WHERE label IS NOT NULL ORDER BY label"
)
_UPDATE_ROWS = f"""UPDATE main.image_metadata SET
        {", ".join(f"{'label_id' if c == 'label' else c} = m.{'label_id' if c == 'label' else c}" for c in CONTENT)},
        updated_at = m.updated_at
    FROM (SELECT m_rows.*, r.id AS root_id, l.id AS label_id FROM temp.m_rows
          JOIN main.roots r ON r.path = m_rows.root_path LEFT JOIN main.labels l ON l.name = m_rows.label) AS m
    WHERE image_metadata.root_id = m.root_id AND image_metadata.file_path = m.file_path"""
_INSERT_ROWS = f"""INSERT INTO main.image_metadata (root_id, file_path,
        {", ".join("label_id" if c == "label" else c for c in CONTENT)}, created_at, updated_at)
    SELECT r.id, m.file_path, {", ".join("l.id" if c == "label" else "m." + c for c in CONTENT)},
        m.created_at, m.updated_at
    FROM temp.m_rows m JOIN main.roots r ON r.path = m.root_path LEFT JOIN main.labels l ON l.name = m.label
    WHERE NOT EXISTS (SELECT 1 FROM main.image_metadata t WHERE t.root_id = r.id AND t.file_path = m.file_path)
    ORDER BY m.root_path, m.file_path"""
_TYPE_CONFLICT = """SELECT m.name, m.src, m.dim, m.dtype, m.extractor, o.dim, o.dtype, o.extractor
    FROM temp.m_types m JOIN (SELECT name, dim, dtype, extractor FROM main.feature_types
        UNION ALL SELECT name, dim, dtype, extractor FROM temp.m_types) AS o ON o.name = m.name
    WHERE m.dtype != o.dtype OR m.extractor != o.extractor OR m.dim != o.dim LIMIT 1"""
_ADD_TYPES = """INSERT OR IGNORE INTO main.feature_types (name, dim, dtype, extractor)
    SELECT name, max(dim), dtype, extractor FROM temp.m_types GROUP BY name ORDER BY name"""
# Extractor versions keep their ids (digests of their texts) from catalog to catalog. A type
# whose latest compute the target does not record takes the first part's that does.
_ADD_VERSIONS = """INSERT OR IGNORE INTO main.extractor_versions (feature_type, id, version, first_used)
    SELECT feature_type, id, version, min(first_used) FROM temp.m_versions GROUP BY feature_type, id ORDER BY 1, 2"""
_TYPE_VERSIONS = """UPDATE main.feature_types SET extractor_version = (SELECT m.extractor_version
    FROM temp.m_types m WHERE m.name = feature_types.name AND m.extractor_version IS NOT NULL ORDER BY m.src LIMIT 1)
    WHERE extractor_version IS NULL"""
_TYPE_DIMS = """UPDATE main.feature_types SET dim = m.dim
    FROM (SELECT name, max(dim) AS dim FROM temp.m_types GROUP BY name) AS m
    WHERE feature_types.name = m.name AND feature_types.dim IS NULL AND m.dim IS NOT NULL"""
_BAD_VECTORS = """SELECT m.src, m.feature_type, count(*) FROM temp.m_vectors m
    JOIN main.feature_types t ON t.name = m.feature_type
    WHERE length(m.vector) != t.dim * (CASE t.dtype WHEN 'float16' THEN 2 ELSE 4 END) OR t.dim IS NULL
    GROUP BY m.src, m.feature_type LIMIT 1"""
# A vector (or feature state) computed from other content than the merged row has is stale.
_STALE = """DELETE FROM temp.{table} WHERE NOT EXISTS (SELECT 1 FROM main.image_metadata t
    JOIN main.roots tr ON tr.id = t.root_id WHERE tr.path = {table}.root_path AND t.file_path = {table}.file_path
    AND t.xxh3_128 IS {table}.xxh3_128)"""
_SAME_VECTOR = f"""DELETE FROM temp.m_vectors WHERE EXISTS (SELECT 1 FROM main.image_features f
    WHERE f.image_id = ({_TARGET_ROW.format(m="m_vectors")}) AND f.feature_type = m_vectors.feature_type
    AND f.vector = m_vectors.vector AND f.extractor_version IS m_vectors.extractor_version)"""
_UPSERT_VECTORS = f"""INSERT INTO main.image_features
        (image_id, feature_type, vector, created_at, updated_at, extractor_version)
    SELECT ({_TARGET_ROW.format(m="m")}), m.feature_type, m.vector, m.created_at, m.updated_at, m.extractor_version
    FROM temp.m_vectors m WHERE true ORDER BY 1, 2
    ON CONFLICT (image_id, feature_type) DO UPDATE SET vector = excluded.vector, updated_at = excluded.updated_at,
        extractor_version = excluded.extractor_version"""
_BUMP_TYPES = """UPDATE main.feature_types SET version = version + 1
    WHERE name IN (SELECT DISTINCT feature_type FROM temp.m_vectors)"""
_SAME_STATE = f"""DELETE FROM temp.m_state WHERE EXISTS (SELECT 1 FROM main.feature_state s
    WHERE s.image_id = ({_TARGET_ROW.format(m="m_state")}) AND s.feature_type = m_state.feature_type
    AND s.state IS m_state.state AND s.error IS m_state.error)"""
_UPSERT_STATE = f"""INSERT INTO main.feature_state (image_id, feature_type, state, error, updated_at)
    SELECT ({_TARGET_ROW.format(m="m")}), m.feature_type, m.state, m.error, m.updated_at
    FROM temp.m_state m WHERE true ORDER BY 1, 2
    ON CONFLICT (image_id, feature_type) DO UPDATE SET state = excluded.state, error = excluded.error,
        updated_at = excluded.updated_at"""
# A sample with a vector is done for its type: whatever state a copy carried for it goes.
_DONE_STATE = f"""DELETE FROM main.feature_state WHERE EXISTS (SELECT 1 FROM temp.m_vectors m
    WHERE ({_TARGET_ROW.format(m="m")}) = feature_state.image_id AND m.feature_type = feature_state.feature_type)"""
_SAME_ATTR = f"""DELETE FROM temp.m_attrs WHERE EXISTS (SELECT 1 FROM main.sample_attributes a
    WHERE a.image_id = ({_TARGET_ROW.format(m="m_attrs")}) AND a.name = m_attrs.name AND a.value = m_attrs.value)"""
_UPSERT_ATTRS = f"""INSERT INTO main.sample_attributes (image_id, name, value)
    SELECT ({_TARGET_ROW.format(m="m")}), m.name, m.value FROM temp.m_attrs m WHERE true ORDER BY 1, 2
    ON CONFLICT (image_id, name) DO UPDATE SET value = excluded.value"""
_ADD_SCANS = """INSERT INTO main.scans (root_id, options, pid, state, started_at, finished_at, seen, new, changed,
        unchanged, missing, corrupt, skipped, errors, seconds)
    SELECT r.id, m.options, m.pid, m.state, m.started_at, m.finished_at, m.seen, m.new, m.changed, m.unchanged,
        m.missing, m.corrupt, m.skipped, m.errors, m.seconds
    FROM (SELECT DISTINCT root_path, options, pid, state, started_at, finished_at, seen, new, changed, unchanged,
            missing, corrupt, skipped, errors, seconds FROM temp.m_scans) AS m
    JOIN main.roots r ON r.path = m.root_path
    WHERE NOT EXISTS (SELECT 1 FROM main.scans s WHERE s.root_id = r.id AND s.started_at = m.started_at
        AND s.options = m.options AND s.pid IS m.pid)
    ORDER BY m.started_at, m.root_path"""
_ADD_RUNS = f"""INSERT INTO main.shard_runs ({RUN_COLUMNS})
    SELECT DISTINCT {RUN_COLUMNS} FROM temp.m_runs m WHERE NOT EXISTS (SELECT 1 FROM main.shard_runs s
        WHERE s.job = m.job AND s.subject = m.subject AND s.part = m.part AND s.parts = m.parts
        AND s.plan = m.plan AND s.started_at = m.started_at)
    ORDER BY started_at, job, subject, part"""


def stage(conn: sqlite3.Connection, paths: list[Path]) -> None:
    """Copy every part's rows into this connection's temp tables, keyed by path, not id.

    Outside the write transaction: a part read inside it stays locked until the commit, and
    could not be detached; the temp schema is this connection's own, so no one waits.
    """
    # Sorting a million staged rows in 2 MiB of cache spills to disk page by page: give the
    # merge a bounded cache of its own (reset by unstage).
    conn.execute(f"PRAGMA temp.cache_size = {-_CACHE_KIB}")
    conn.execute(f"PRAGMA main.cache_size = {-_CACHE_KIB}")
    for statement in _TEMP_TABLES:
        conn.execute(statement)
    for number, path in enumerate(paths):
        conn.execute("ATTACH DATABASE ? AS part", (os.fspath(path),))
        try:
            conn.execute("BEGIN")
            for statement in _COPY_FROM_PART:
                conn.execute(statement, {"part": number})
            conn.execute("COMMIT")
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.execute("DETACH DATABASE part")


def unstage(conn: sqlite3.Connection) -> None:
    for table in _STAGED:
        conn.execute(f"DROP TABLE IF EXISTS temp.{table}")  # names from this module, never input
    merge_cut.drop_cut(conn)
    conn.execute("PRAGMA temp.cache_size = -2000")  # SQLite's default
    conn.execute("PRAGMA main.cache_size = -2000")


# Per cache: main's, temp's, and SQLite's sorter, which takes main's cache_size as its
# in-memory limit before it spills sorted runs to temporary files. Three of 256 MiB made
# merge's peak RSS 591 MB at 10^6 rows and 818 MB at 10^7 (bench_size); three of 64 MiB keep
# it ~200 MB at any size, at the same CPU time (the sorter's runs merge from disk instead).
_CACHE_KIB = 64 * 1024


_STAGED = tuple(statement.split()[3] for statement in _TEMP_TABLES)  # CREATE TEMP TABLE <name> (...)


def apply(conn: sqlite3.Connection, paths: list[Path]) -> dict[str, int]:
    parted = len(paths) > 1
    (incoming,) = conn.execute("SELECT count(*) FROM temp.m_rows").fetchone()
    same = conn.execute(_SAME_ROW).rowcount
    conn.execute(_ROWS_BY_KEY)  # one sort: the duplicate check and the insert in path order use it
    if parted and conn.execute(_SHARED_KEY).fetchone() is not None:  # parts of one job never share one
        conn.execute(_SAME_AMONG_PARTS.format(table="m_rows", columns=", ".join(("root_path", "file_path", *CONTENT))))
        _refuse_conflict(conn, paths, "m_rows", "", "both change the sample")
    conn.execute(_ADD_ROOTS)
    conn.execute(_ROOT_PRESPLIT)
    conn.execute(_ADD_LABELS)
    updated = conn.execute(_UPDATE_ROWS).rowcount
    added = conn.execute(_INSERT_ROWS).rowcount

    found = conn.execute(_TYPE_CONFLICT).fetchone()
    if found is not None:
        name, part, *sides = found
        raise InputError(
            f"feature type {name!r} in {paths[part]} is {sides[0]}-dim {sides[1]} from {sides[2]!r}, elsewhere "
            f"{sides[3]}-dim {sides[4]} from {sides[5]!r}; nothing was merged"
        )
    conn.execute(_ADD_TYPES)
    conn.execute(_TYPE_DIMS)
    conn.execute(_ADD_VERSIONS)
    conn.execute(_TYPE_VERSIONS)
    bad = conn.execute(_BAD_VECTORS).fetchone()
    if bad is not None:
        raise InputError(
            f"part {paths[bad[0]]} holds {bad[2]} vector(s) of type {bad[1]!r} of the wrong size; nothing was merged"
        )
    stale = conn.execute(_STALE.format(table="m_vectors")).rowcount
    conn.execute(_STALE.format(table="m_state"))
    conn.execute(_SAME_VECTOR)
    conn.execute(_SAME_STATE)
    conn.execute(_SAME_ATTR)
    if parted:
        for table, extra, columns in (
            ("m_vectors", ", feature_type", "root_path, file_path, feature_type, vector"),
            ("m_state", ", feature_type", "root_path, file_path, feature_type, state, error"),
            ("m_attrs", ", name", "root_path, file_path, name, value"),
            (*merge_texts.CONFLICT, merge_texts.SAME_AMONG_PARTS),
        ):
            conn.execute(_SAME_AMONG_PARTS.format(table=table, columns=columns))
            _refuse_conflict(conn, paths, table, extra, f"both change {table[2:].rstrip('s')} of the sample")
    vectors = conn.execute(_UPSERT_VECTORS).rowcount
    if vectors:
        conn.execute(_BUMP_TYPES)
    conn.execute(_UPSERT_STATE)
    conn.execute(_DONE_STATE)
    conn.execute(_UPSERT_ATTRS)
    texts = merge_texts.apply(conn)
    scans = conn.execute(_ADD_SCANS).rowcount
    conn.execute(_ADD_RUNS)
    return {
        "samples_added": added, "samples_updated": updated, "samples_same": same if incoming else 0,
        "vectors_written": vectors, "vectors_stale": stale, "texts_written": texts, "scans_added": scans,
    }  # fmt: skip


def _refuse_conflict(conn: sqlite3.Connection, paths: list[Path], table: str, extra: str, what: str) -> None:
    # table and extra come from this module's own constants, never from input
    found = conn.execute(_CONFLICT.format(table=table, extra=extra)).fetchone()
    if found is None:
        return
    root, file_path, *rest = found
    holders = sorted({int(p) for p in str(rest[-1]).split(",")})
    names = " and ".join(str(paths[p]) for p in holders[:2])
    detail = f" ({rest[0]})" if len(rest) > 1 else ""
    raise InputError(
        f"{names} {what} {os.path.join(root, file_path)}{detail} differently; nothing was merged "
        "(parts of one job never overlap: were these parts cut from different trees or catalogs?)"
    )
