"""The catalog schema's first era on SQLite (versions 1-7): tables, query log, features, classes.

Part of ``migrations.MIGRATIONS`` (append-only: a released migration is never edited).
"""

from __future__ import annotations

import sqlite3


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
