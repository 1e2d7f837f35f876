"""The catalog schema, as an append-only list of forward migrations.

The schema version is ``PRAGMA user_version``: one integer in the database header that
any SQLite client can read, so an older dlindex can refuse a newer catalog before it
touches anything. A released migration is never edited; a change is a new function
appended to ``MIGRATIONS``. Versions 1-7 are in ``early_migrations``.
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
from collections.abc import Callable, Iterable
from contextlib import suppress
from functools import cache

from dlindex.catalog.sqlite.early_migrations import (
    m001_initial,
    m002_query_log,
    m003_features,
    m004_index_changes,
    m005_cheap_status_checks,
    m006_classes,
    m007_feature_state,
)
from dlindex.catalog.sqlite.history_schema import HISTORY, HISTORY_BY_LABEL
from dlindex.catalog.sqlite.text_schema import m021_texts

# "dlix": marks the file as a dlindex catalog, so a random SQLite file is not mistaken for one.
APPLICATION_ID = 0x646C6978


def m008_pixel_limit(conn: sqlite3.Connection) -> None:
    # The --max-pixels a verdict depended on, so a scan under another limit re-probes exactly
    # those files (docs/commands/scan.md). Rows judged before this column existed get 0, a
    # limit no scan uses: the next scan probes them once under its own limit.
    conn.execute("ALTER TABLE image_metadata ADD COLUMN pixel_limit INTEGER")
    conn.execute(_M008_UNKNOWN_LIMIT)


_M008_UNKNOWN_LIMIT = """UPDATE image_metadata SET pixel_limit = 0
    WHERE (status = 'corrupt' AND error LIKE 'DecompressionBombError%')
        OR warning LIKE '%not decoded: % pixels exceeds --max-pixels%'"""


def m009_exports(conn: sqlite3.Connection) -> None:
    # Each export dlindex wrote from this catalog, so the training loader can find a packed
    # copy of its selection without being told (docs/training.md#where-the-bytes-come-from).
    conn.execute(
        """CREATE TABLE exports (
            path TEXT PRIMARY KEY,
            format TEXT NOT NULL,
            samples INTEGER NOT NULL,
            created_at TEXT NOT NULL,
            catalog_changes INTEGER NOT NULL
        )"""
    )


def m010_sample_attributes(conn: sqlite3.Connection) -> None:
    # The extra columns of a `scan --labels` CSV (a source video, a patient id), one row per
    # sample and name, for `export --group-by NAME` (docs/commands/scan.md#labels). They go
    # with their image: --prune deletes them by cascade; new content keeps them (a path's
    # video does not change when its file is re-encoded).
    conn.execute(
        """CREATE TABLE sample_attributes (
            image_id INTEGER NOT NULL REFERENCES image_metadata(id) ON DELETE CASCADE,
            name TEXT NOT NULL,
            value TEXT NOT NULL,
            PRIMARY KEY (image_id, name)
        ) WITHOUT ROWID"""
    )


def m011_shard_runs(conn: sqlite3.Connection) -> None:
    # Each `--part I/N` run of scan or features compute, with the digest of the cut it made,
    # so `dlindex merge` can prove every part of one job is there, once, finished, and cut
    # alike (docs/scale-out.md). A part catalog carries its runs into the merged catalog.
    conn.execute(
        """CREATE TABLE shard_runs (
            id INTEGER PRIMARY KEY,
            job TEXT NOT NULL CHECK (job = 'scan' OR job = 'features'),
            subject TEXT NOT NULL,
            part INTEGER NOT NULL CHECK (part >= 0),
            parts INTEGER NOT NULL CHECK (parts > part),
            plan TEXT NOT NULL,
            state TEXT NOT NULL DEFAULT 'running'
                CHECK (state = 'running' OR state = 'completed' OR state = 'interrupted'),
            started_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
            finished_at TIMESTAMP
        )"""
    )


def m012_change_token(conn: sqlite3.Connection) -> None:
    # A random token that every write transaction draws anew beside the change counter: a file
    # restored from a backup brings back an old counter that the next write repeats, but never
    # with the token that counter had before, so (counter, token) names one state of the
    # catalog, and caches outside the file (the L2 cache in Redis) key on it.
    conn.execute("ALTER TABLE catalog_changes ADD COLUMN token TEXT NOT NULL DEFAULT ''")
    conn.execute("UPDATE catalog_changes SET token = ? WHERE id = 1", (secrets.token_hex(16),))


def m013_orientation(conn: sqlite3.Connection) -> None:
    # The EXIF orientation a file asks for (1-8, 1: upright), beside its stored width and
    # height, so the turned image can be chosen (docs/concepts.md#orientation). Rows scanned
    # before keep NULL (not known) until their file is probed again (scan --force).
    conn.execute("ALTER TABLE image_metadata ADD COLUMN orientation INTEGER")


def m014_excluded(conn: sqlite3.Connection) -> None:
    # `mark --exclude` leaves a sample out of every selection (query, export, the loader) without
    # forgetting it: dups --rest | mark --exclude trains on one copy of each (docs/commands/mark.md).
    # Apart from scan's status and mark's processing_status, so neither is overloaded.
    conn.execute("ALTER TABLE image_metadata ADD COLUMN excluded INTEGER NOT NULL DEFAULT 0")


def m015_file_keys(conn: sqlite3.Connection) -> None:
    # inode and ctime_ns: a file's identity when it was read. A replacement of the same size
    # and mtime (cp -p, rsync -a, tar x) changes them, so a scan reads it again; rows judged
    # before get them from the next scan's lstat (docs/commands/scan.md).
    # path_hash: what a seeded sample ranks rows by, so that it follows from the tree, not
    # from the ids a scan's timing gave (docs/commands/query.md).
    for statement in _M015_COLUMNS:
        conn.execute(statement)
    conn.create_function("dlindex_path_hash", 1, path_hash, deterministic=True)
    conn.execute("UPDATE image_metadata SET path_hash = dlindex_path_hash(file_path)")


def path_hash(file_path: str) -> int:
    """The ``path_hash`` column: the first 60 bits of the MD5 of ``file_path`` (UTF-8).

    A seeded sample ranks rows by it (dlindex.query.rows), so the sample of a tree is the same
    whatever ids its rows got. pgschema.SCHEMA_V15 computes the same number in SQL. A key is
    always valid UTF-8 (a name that is not has an ASCII stand-in, dlindex.catalog.paths), so
    both backends hash the same bytes.
    """
    return int(hashlib.md5(file_path.encode("utf-8"), usedforsecurity=False).hexdigest()[:15], 16)


def m016_scan_digests(conn: sqlite3.Connection) -> None:
    # What a rescan's fast path found of a folder unit (dlindex.scan.quick): a digest of what it
    # compared and the answer, so the next rescan of the same unchanged folder costs find's
    # lines, not the catalog's rows. Triggers forget a unit's digest whenever any writer
    # (dlindex or not) inserts, deletes or changes a row of that unit in a column the
    # comparison reads: a digest is never older than the rows it vouches for.
    for statement in SCAN_DIGESTS:
        conn.execute(statement)


def m017_extractor_versions(conn: sqlite3.Connection) -> None:
    # Which extractor made each vector (dlindex.features.versions): a type's vectors made by
    # another version of its extractor than the current one are stale, and `features compute`
    # makes them again. Vectors stored before keep NULL (not recorded) until a compute claims them.
    for statement in EXTRACTOR_VERSIONS:
        conn.execute(statement)


def m018_auto_features(conn: sqlite3.Connection) -> None:
    # `features auto --type T`: the catalog queues every new or changed ok sample for T
    # (feature_state 'queued'), whoever writes the row (scan, merge, another program), and
    # `features compute --queued` computes the queue without reading the whole selection.
    for statement in AUTO_FEATURES:
        conn.execute(statement)


def m019_versions(conn: sqlite3.Connection) -> None:
    # Catalog versions (dlindex.catalog.versions): every row's old values when it changes or
    # goes, labels' too, and the numbered versions with their tags; the catalog at any past
    # state is then answered from the rows and their history (dlindex.catalog.as_of).
    for statement in HISTORY:
        conn.execute(statement)


def m020_history_by_label(conn: sqlite3.Connection) -> None:
    # A past state's per-label sample reads the history by label (history_schema.HISTORY_BY_LABEL).
    for statement in HISTORY_BY_LABEL:
        conn.execute(statement)


# What queues a sample for the automatic types: an ok row inserted, or new content in an ok
# row (after the vectors and states of the old content are deleted, in the same trigger, so
# the order of the two is fixed).
_QUEUE_AUTO = """INSERT INTO feature_state (image_id, feature_type, state) SELECT NEW.id, name, 'queued'
            FROM feature_types WHERE auto = 1 AND extractor != 'import' AND NEW.status = 'ok'
            ON CONFLICT (image_id, feature_type) DO NOTHING;"""
AUTO_FEATURES = (
    "ALTER TABLE feature_types ADD COLUMN auto INTEGER NOT NULL DEFAULT 0",
    "DROP TRIGGER IF EXISTS image_features_stale",
    f"""CREATE TRIGGER image_features_stale AFTER UPDATE OF xxh3_128 ON image_metadata
        WHEN OLD.xxh3_128 IS NOT NEW.xxh3_128
        BEGIN
            DELETE FROM image_features WHERE image_id = NEW.id;
            DELETE FROM feature_state WHERE image_id = NEW.id;
            {_QUEUE_AUTO}
        END""",
    f"""CREATE TRIGGER feature_auto_inserted AFTER INSERT ON image_metadata WHEN NEW.status = 'ok'
        BEGIN
            {_QUEUE_AUTO}
        END""",
)


# A version's id is a digest of its text (dlindex.features.versions.version_id): the same in
# every catalog, so parts computed apart merge without renumbering.
EXTRACTOR_VERSIONS = (
    """CREATE TABLE extractor_versions (
        feature_type TEXT NOT NULL REFERENCES feature_types(name) ON DELETE CASCADE,
        id INTEGER NOT NULL,
        version TEXT NOT NULL,
        first_used TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
        PRIMARY KEY (feature_type, id)
    )""",
    "ALTER TABLE feature_types ADD COLUMN extractor_version INTEGER",
    "ALTER TABLE image_features ADD COLUMN extractor_version INTEGER",
)


# The unit whose range holds a path: the digests of one root never overlap (a rescan replaces
# them all), so it is the one starting last at or before the path, if it ends after it.
_FORGET = """DELETE FROM scan_digests WHERE root_id = {row}.root_id
            AND start = (SELECT max(start) FROM scan_digests WHERE root_id = {row}.root_id AND start <= {row}.file_path)
            AND (stop IS NULL OR stop > {row}.file_path);"""
# The columns of dlindex.scan.quick._LINES; processing_status and error only as it reads them.
_WATCHED = (
    "root_id", "file_path", "bytes", "mtime_ns", "inode", "ctime_ns", "status", "width", "height", "pixel_limit",
    "label_id", "split",
)  # fmt: skip
SCAN_DIGESTS = (
    """CREATE TABLE scan_digests (
        root_id INTEGER NOT NULL,
        start TEXT NOT NULL,
        stop TEXT,
        digest BLOB NOT NULL,
        files INTEGER NOT NULL,
        skips TEXT NOT NULL,
        PRIMARY KEY (root_id, start)
    ) WITHOUT ROWID""",
    "CREATE TRIGGER scan_digests_inserted AFTER INSERT ON image_metadata BEGIN\n            "
    + _FORGET.format(row="NEW")
    + "\n        END",
    "CREATE TRIGGER scan_digests_deleted AFTER DELETE ON image_metadata BEGIN\n            "
    + _FORGET.format(row="OLD")
    + "\n        END",
    f"CREATE TRIGGER scan_digests_updated AFTER UPDATE OF {', '.join((*_WATCHED, 'processing_status', 'error'))} "
    "ON image_metadata\n        WHEN "
    + " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in _WATCHED)
    + "\n            OR ((OLD.processing_status IS 'failed' OR NEW.processing_status IS 'failed')"
    " AND (OLD.processing_status IS NOT NEW.processing_status OR OLD.error IS NOT NEW.error))\n        BEGIN\n            "
    + _FORGET.format(row="OLD")
    + "\n            "
    + _FORGET.format(row="NEW")
    + "\n        END",
)


_M015_COLUMNS = (
    "ALTER TABLE image_metadata ADD COLUMN inode INTEGER",
    "ALTER TABLE image_metadata ADD COLUMN ctime_ns INTEGER",
    "ALTER TABLE image_metadata ADD COLUMN path_hash INTEGER",
)


MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (
    m001_initial, m002_query_log, m003_features, m004_index_changes, m005_cheap_status_checks,
    m006_classes, m007_feature_state, m008_pixel_limit, m009_exports, m010_sample_attributes,
    m011_shard_runs, m012_change_token, m013_orientation, m014_excluded, m015_file_keys,
    m016_scan_digests, m017_extractor_versions, m018_auto_features, m019_versions, m020_history_by_label,
    m021_texts,
)  # fmt: skip
LATEST_VERSION = len(MIGRATIONS)


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def apply_migrations(conn: sqlite3.Connection) -> int:
    """Bring the catalog to LATEST_VERSION; each step commits together with its version bump."""
    version = schema_version(conn)
    if version >= LATEST_VERSION:
        return version  # the common case takes no lock: readers never wait for a writer here
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-read inside the write lock: another process may have migrated meanwhile.
            version = schema_version(conn)
            if version >= LATEST_VERSION:
                conn.execute("COMMIT")
                return version
            MIGRATIONS[version](conn)
            # PRAGMA takes no parameters; both values are integers from this module.
            conn.execute(f"PRAGMA user_version = {int(version + 1)}")
            conn.execute(f"PRAGMA application_id = {int(APPLICATION_ID)}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # SQLite ends a transaction a full disk failed by itself
                with suppress(sqlite3.Error):  # the error being raised is the one to report
                    conn.execute("ROLLBACK")
            raise


_TABLES_SINCE: tuple[tuple[int, int | None, tuple[str, ...]], ...] = (
    (1, None, ("roots", "labels", "image_metadata", "scans")),
    (2, None, ("query_log", "query_log_templates", "catalog_changes", "query_cache")),
    (3, None, ("feature_types", "image_features")),
    (3, 7, ("feature_failures",)),  # m007_feature_state moved its rows to feature_state
    (4, None, ("index_changes",)),
    (7, None, ("feature_state",)),
    (9, None, ("exports",)),
    (10, None, ("sample_attributes",)),
    (11, None, ("shard_runs",)),
    (16, None, ("scan_digests",)),
    (17, None, ("extractor_versions",)),
    (19, None, ("image_history", "label_history", "versions", "version_tags", "version_floor")),
    (21, None, ("image_texts",)),
)


def missing_tables(tables: Iterable[str], version: int) -> list[str]:
    """dlindex's tables that a catalog at schema ``version`` should have and does not."""
    present = set(tables)
    return [
        t for since, until, names in _TABLES_SINCE if since <= version and (until is None or version < until)
        for t in names if t not in present
    ]  # fmt: skip


@cache
def latest_columns() -> dict[str, frozenset[tuple[str, str, int]]]:
    """Each table's columns at LATEST_VERSION, as (name, declared type, primary-key position):
    the migrations run once on an empty in-memory database."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        apply_migrations(conn)
        return _columns(conn)
    finally:
        conn.close()


def _columns(conn: sqlite3.Connection) -> dict[str, frozenset[tuple[str, str, int]]]:
    found: dict[str, set[tuple[str, str, int]]] = {}
    for table, column, declared, pk in conn.execute(_COLUMNS):
        found.setdefault(str(table), set()).add((str(column), str(declared).upper(), int(pk)))
    return {table: frozenset(columns) for table, columns in found.items()}


# Names, types and keys only: no migration changes them, while the CHECK constraints' text
# differs between catalogs (m005 rewrites it where SQLite allows).
_COLUMNS = (
    "SELECT m.name, c.name, c.type, c.pk FROM sqlite_master m, pragma_table_info(m.name) c WHERE m.type = 'table'"
)


def changed_columns(conn: sqlite3.Connection, version: int) -> list[str]:
    """``table.column`` names a catalog at LATEST_VERSION does not have as dlindex made them
    (name, type, primary key): one damaged byte of the schema's text can rename a column or
    turn ``id INTEGER PRIMARY KEY`` into a plain column and still parse (found by
    test_faults_catalog's fuzzer). Older catalogs are checked by their migration instead."""
    if version != LATEST_VERSION:
        return []
    present = _columns(conn)
    return [
        f"{table}.{name}" for table, columns in latest_columns().items() if table in present
        for name, _, _ in sorted(columns - present[table])
    ]  # fmt: skip
