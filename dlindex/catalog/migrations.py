"""The catalog schema, as an append-only list of forward migrations.

The schema version is ``PRAGMA user_version``: one integer in the database header that
any SQLite client can read, so an older dlindex can refuse a newer catalog before it
touches anything. A released migration is never edited; a change is a new function
appended to ``MIGRATIONS``.
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
from collections.abc import Callable, Iterable
from contextlib import suppress

# "dlix": marks the file as a dlindex catalog, so a random SQLite file is not mistaken for one.
APPLICATION_ID = 0x646C6978


def m001_initial(conn: sqlite3.Connection) -> None:
    # Only keys and uniqueness: secondary indexes are for `dlindex index` to prove worth it.
    for statement in _M001:
        conn.execute(statement)


_M001 = (
    """CREATE TABLE roots (
        id INTEGER PRIMARY KEY,
        path TEXT NOT NULL UNIQUE,
        path_bytes BLOB,
        added_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP
    )""",
    """CREATE TABLE labels (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE
    )""",
    """CREATE TABLE image_metadata (
        id INTEGER PRIMARY KEY,
        root_id INTEGER NOT NULL REFERENCES roots(id),
        file_path TEXT NOT NULL,
        file_path_bytes BLOB,
        label_id INTEGER NOT NULL REFERENCES labels(id),
        width INTEGER,
        height INTEGER,
        format TEXT,
        mode TEXT,
        bytes INTEGER,
        mtime_ns INTEGER,
        xxh3_128 TEXT,
        status TEXT NOT NULL DEFAULT 'ok' CHECK (status IN ('ok', 'corrupt', 'missing')),
        error TEXT,
        warning TEXT,
        processed BOOLEAN NOT NULL DEFAULT 0,
        processing_status TEXT CHECK (processing_status IN ('queued', 'completed', 'failed')),
        created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
        updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
        UNIQUE (root_id, file_path)
    )""",
    """CREATE TABLE scans (
        id INTEGER PRIMARY KEY,
        root_id INTEGER NOT NULL REFERENCES roots(id),
        options TEXT NOT NULL,
        pid INTEGER,
        state TEXT NOT NULL DEFAULT 'running'
            CHECK (state IN ('running', 'completed', 'interrupted', 'failed')),
        started_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
        finished_at TIMESTAMP,
        seen INTEGER NOT NULL DEFAULT 0,
        new INTEGER NOT NULL DEFAULT 0,
        changed INTEGER NOT NULL DEFAULT 0,
        unchanged INTEGER NOT NULL DEFAULT 0,
        missing INTEGER NOT NULL DEFAULT 0,
        corrupt INTEGER NOT NULL DEFAULT 0,
        skipped INTEGER NOT NULL DEFAULT 0,
        errors INTEGER NOT NULL DEFAULT 0,
        seconds REAL
    )""",
)


def m002_query_log(conn: sqlite3.Connection) -> None:
    # The query log (evidence for `dlindex index`), the change counter that keys the
    # query-result cache, and the cache itself; see docs/concepts.md.
    for statement in _M002:
        conn.execute(statement)


_M002 = (
    """CREATE TABLE query_log (
        id INTEGER PRIMARY KEY,
        kind TEXT NOT NULL CHECK (kind IN ('read', 'write')),
        source TEXT NOT NULL DEFAULT 'dlindex' CHECK (source IN ('dlindex', 'import')),
        sql TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        table_name TEXT,
        calls INTEGER NOT NULL DEFAULT 1,
        rows INTEGER,
        duration_ms REAL,
        plan TEXT CHECK (plan IN ('index', 'scan', 'none')),
        cached INTEGER NOT NULL DEFAULT 0,
        logged_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP
    )""",
    """CREATE TABLE query_log_templates (
        sql TEXT PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        plan_detail TEXT,
        offered INTEGER NOT NULL DEFAULT 0,
        sample_params TEXT NOT NULL DEFAULT '[]'
    ) WITHOUT ROWID""",
    """CREATE TABLE catalog_changes (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        counter INTEGER NOT NULL
    )""",
    "INSERT INTO catalog_changes (id, counter) VALUES (1, 0)",
    """CREATE TABLE query_cache (
        key TEXT PRIMARY KEY,
        changes INTEGER NOT NULL,
        ids BLOB NOT NULL,
        rows INTEGER NOT NULL,
        created_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP
    )""",
)


def m003_features(conn: sqlite3.Connection) -> None:
    # The feature cache (docs/concepts.md, "Feature cache"). Vectors go with their image:
    # `scan --prune` deletes image rows and ON DELETE CASCADE takes their vectors along,
    # and new content (a new xxh3_128) deletes the vectors computed from the old one.
    # Vector sizes are checked by dlindex's one write path, not by a trigger: a trigger
    # copies each 2 KiB row and made million-vector imports 25% slower (docs/design.md).
    for statement in _M003:
        conn.execute(statement)


_M003 = (
    """CREATE TABLE feature_types (
        name TEXT PRIMARY KEY,
        dim INTEGER CHECK (dim IS NULL OR dim > 0),
        dtype TEXT NOT NULL DEFAULT 'float32' CHECK (dtype IN ('float32', 'float16')),
        extractor TEXT NOT NULL,
        version INTEGER NOT NULL DEFAULT 0,
        created_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP
    )""",
    """CREATE TABLE image_features (
        image_id INTEGER NOT NULL REFERENCES image_metadata(id) ON DELETE CASCADE,
        feature_type TEXT NOT NULL REFERENCES feature_types(name) ON DELETE CASCADE,
        vector BLOB NOT NULL,
        created_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
        updated_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
        PRIMARY KEY (image_id, feature_type)
    )""",
    """CREATE TABLE feature_failures (
        image_id INTEGER NOT NULL REFERENCES image_metadata(id) ON DELETE CASCADE,
        feature_type TEXT NOT NULL REFERENCES feature_types(name) ON DELETE CASCADE,
        error TEXT NOT NULL,
        failed_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
        PRIMARY KEY (image_id, feature_type)
    )""",
    """CREATE TRIGGER image_features_stale AFTER UPDATE OF xxh3_128 ON image_metadata
        WHEN OLD.xxh3_128 IS NOT NEW.xxh3_128
        BEGIN
            DELETE FROM image_features WHERE image_id = NEW.id;
            DELETE FROM feature_failures WHERE image_id = NEW.id;
        END""",
    # dlindex bumps `version` once per transaction that writes vectors; deletions made by
    # SQLite itself (cascades, the trigger above) bump it here, so cached matrices expire.
    """CREATE TRIGGER image_features_deleted AFTER DELETE ON image_features
        BEGIN UPDATE feature_types SET version = version + 1 WHERE name = OLD.feature_type; END""",
)


def m004_index_changes(conn: sqlite3.Connection) -> None:
    # `dlindex index --apply` records what it created or dropped, so `--revert` undoes exactly
    # that; the query log gains the time spent waiting for the write lock (docs/concepts.md).
    for statement in _M004:
        conn.execute(statement)


_M004 = (
    """CREATE TABLE index_changes (
        id INTEGER PRIMARY KEY,
        run INTEGER NOT NULL,
        action TEXT NOT NULL CHECK (action IN ('create', 'drop')),
        name TEXT NOT NULL,
        table_name TEXT NOT NULL,
        sql TEXT NOT NULL,
        fingerprints TEXT NOT NULL DEFAULT '[]',
        changed_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
        reverted_at TIMESTAMP
    )""",
    "ALTER TABLE query_log ADD COLUMN lock_wait_ms REAL",
)


def m005_cheap_status_checks(conn: sqlite3.Connection) -> None:
    """Rewrite image_metadata's two ``IN (...)`` CHECKs as equivalent ``=``/``OR`` chains.

    SQLite builds an ephemeral table for a constant IN list once per statement run, and
    ``executemany`` runs the INSERT once per row: those two CHECKs were half the cost of
    every row a scan writes (docs/design.md). The constraints accept exactly the same
    values, so the stored rows stay valid and only the schema text changes: the in-place
    edit SQLite's ALTER TABLE documentation describes for CHECK changes, in O(1) instead of
    copying the table (which would also need foreign keys off to keep image_features from
    cascading away). The rewrite is only a speed-up: where the text is not what dlindex
    wrote, or SQLite refuses schema edits (SQLITE_DBCONFIG_DEFENSIVE), it is skipped.
    """
    (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'image_metadata'").fetchone()
    if not all(old in sql for old, _ in _M005_CHECKS):
        return
    new_sql = sql
    for old, cheap in _M005_CHECKS:
        new_sql = new_sql.replace(old, cheap)
    (version,) = conn.execute("PRAGMA schema_version").fetchone()
    conn.execute("PRAGMA writable_schema = ON")
    try:
        try:
            conn.execute(
                "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'image_metadata'", (new_sql,)
            )
        except sqlite3.DatabaseError:
            return  # schema edits refused: the slower constraints stay, and still hold
        # Other connections re-read the schema when they see the new version; PRAGMA takes
        # no parameters, and this is an integer read from SQLite itself.
        conn.execute(f"PRAGMA schema_version = {int(version) + 1}")
    finally:
        conn.execute("PRAGMA writable_schema = OFF")
    conn.execute("SELECT * FROM image_metadata LIMIT 0")  # the new text parses, or we roll back


_M005_CHECKS = (
    (
        "CHECK (status IN ('ok', 'corrupt', 'missing'))",
        "CHECK (status = 'ok' OR status = 'corrupt' OR status = 'missing')",
    ),
    (
        "CHECK (processing_status IN ('queued', 'completed', 'failed'))",
        "CHECK (processing_status = 'queued' OR processing_status = 'completed' OR processing_status = 'failed')",
    ),
)


def m006_classes(conn: sqlite3.Connection) -> None:
    """Files without a class (directly under ROOT) get a NULL label_id; the tree's split gets a column.

    Dropping a NOT NULL constraint is one of the schema changes SQLite's ALTER TABLE
    documentation lists as safe to make by editing the schema text: stored rows stay valid
    (all have a label) and nothing is copied. A table rebuild would copy every row and need
    foreign keys off, which cannot be switched inside the migration's transaction; the
    alternative, a reserved "no class" label row, would be one more name every reader of
    ``labels`` has to leave out (docs/design.md). If SQLite refuses schema edits
    (SQLITE_DBCONFIG_DEFENSIVE) on this connection, the migration fails and nothing changes.
    """
    columns = {row[1]: row for row in conn.execute("PRAGMA table_info(image_metadata)")}
    if columns["label_id"][3]:  # notnull
        (sql,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'image_metadata'"
        ).fetchone()
        if _M006_OLD not in sql:
            raise sqlite3.DatabaseError("image_metadata.label_id is not as dlindex created it; cannot make it nullable")
        (version,) = conn.execute("PRAGMA schema_version").fetchone()
        conn.execute("PRAGMA writable_schema = ON")
        try:
            conn.execute(
                "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'image_metadata'",
                (sql.replace(_M006_OLD, _M006_NEW),),
            )
            # PRAGMA takes no parameters; this is an integer read from SQLite itself.
            conn.execute(f"PRAGMA schema_version = {int(version) + 1}")
        finally:
            conn.execute("PRAGMA writable_schema = OFF")
        conn.execute("SELECT * FROM image_metadata LIMIT 0")  # the new text parses, or we roll back
    if "split" not in columns:
        conn.execute("ALTER TABLE image_metadata ADD COLUMN split TEXT")
    # Whether the root's last scan found split folders: `export` decides on it without a scan.
    conn.execute("ALTER TABLE roots ADD COLUMN presplit BOOLEAN NOT NULL DEFAULT 0")
    # From now on labels holds only labels some row has (scan drops the others), so that the
    # catalog's class list is the labels table; older dlindex left relabelled-away names behind.
    conn.execute(
        "DELETE FROM labels WHERE id NOT IN (SELECT DISTINCT label_id FROM image_metadata WHERE label_id IS NOT NULL)"
    )


_M006_OLD = "label_id INTEGER NOT NULL REFERENCES labels(id)"
_M006_NEW = "label_id INTEGER REFERENCES labels(id)"


def m007_feature_state(conn: sqlite3.Connection) -> None:
    """Give ``features compute`` per-type state of its own, apart from ``mark``'s columns.

    Until now compute wrote ``image_metadata.processing_status`` and ``error``, the very
    columns ``dlindex mark`` sets: a run overwrote what the user recorded. From here on
    compute keeps its state per (sample, type) in ``feature_state`` (``queued``, or
    ``failed`` with the error; a sample with a vector is done) and never touches
    ``image_metadata``. The failures recorded in ``feature_failures`` move there. In
    ``image_metadata``, only what compute provably wrote is cleared: ``failed`` with an error
    text identical to one of that sample's recorded extraction failures (the error stays, per
    type, in ``feature_state``; a corrupt row keeps its text). ``queued`` and ``completed``
    stay: ``mark`` writes the same values, and dlindex never erases what the user may have set.
    """
    for statement in _M007:
        conn.execute(statement)


_M007 = (
    """CREATE TABLE feature_state (
        image_id INTEGER NOT NULL REFERENCES image_metadata(id) ON DELETE CASCADE,
        feature_type TEXT NOT NULL REFERENCES feature_types(name) ON DELETE CASCADE,
        state TEXT NOT NULL CHECK (state = 'queued' OR state = 'failed'),
        error TEXT CHECK (state = 'queued' OR error IS NOT NULL),
        updated_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
        PRIMARY KEY (image_id, feature_type)
    ) WITHOUT ROWID""",
    """INSERT INTO feature_state (image_id, feature_type, state, error, updated_at)
        SELECT image_id, feature_type, 'failed', error, failed_at FROM feature_failures""",
    """UPDATE image_metadata SET processing_status = NULL,
            error = CASE WHEN status = 'ok' THEN NULL ELSE error END
        WHERE processing_status = 'failed' AND error IN
            (SELECT error FROM feature_failures WHERE feature_failures.image_id = image_metadata.id)""",
    "DROP TRIGGER IF EXISTS image_features_stale",
    "DROP TABLE feature_failures",
    """CREATE TRIGGER image_features_stale AFTER UPDATE OF xxh3_128 ON image_metadata
        WHEN OLD.xxh3_128 IS NOT NEW.xxh3_128
        BEGIN
            DELETE FROM image_features WHERE image_id = NEW.id;
            DELETE FROM feature_state WHERE image_id = NEW.id;
        END""",
)


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


_M015_COLUMNS = (
    "ALTER TABLE image_metadata ADD COLUMN inode INTEGER",
    "ALTER TABLE image_metadata ADD COLUMN ctime_ns INTEGER",
    "ALTER TABLE image_metadata ADD COLUMN path_hash INTEGER",
)


MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (
    m001_initial, m002_query_log, m003_features, m004_index_changes, m005_cheap_status_checks,
    m006_classes, m007_feature_state, m008_pixel_limit, m009_exports, m010_sample_attributes,
    m011_shard_runs, m012_change_token, m013_orientation, m014_excluded, m015_file_keys,
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
)


def missing_tables(tables: Iterable[str], version: int) -> list[str]:
    """dlindex's tables that a catalog at schema ``version`` should have and does not."""
    present = set(tables)
    return [
        t for since, until, names in _TABLES_SINCE if since <= version and (until is None or version < until)
        for t in names if t not in present
    ]  # fmt: skip
