"""Schemas 19 and 20: the row history behind catalog versions, and its indexes (docs/versions.md).

A catalog *state* is a value of the change counter (``catalog_changes.counter``), which every
write transaction moves once, at its start (dlindex.catalog.connection). Each row says since
which state it reads as it does (``valid_from``; NULL: since before versions were kept, i.e.
0); the triggers below copy a row's old values into ``image_history`` with the span of states
they held (``valid_from`` .. ``valid_to``, half-open) whenever a column a user sees changes,
and when the row is deleted. So the catalog at state S is: the rows with ``valid_from <= S``
plus the history rows with ``valid_from <= S < valid_to`` (dlindex.catalog.as_of), and the
history grows with the changes, never with the catalog. Labels keep the same kind of history
(``label_history``), so a relabelled or removed class keeps its name at an old state.

The triggers are in the file, so a write by any program (sqlite3, sqlite-utils) is kept too.
"""

from __future__ import annotations

# The columns whose change is a new version of a row: what a user selects, trains on and is
# shown. A change of only the file's identity (mtime, inode, ctime: a touch), a warning text,
# the timestamps or the path hash is not a new version.
TRACKED = (
    "root_id", "file_path", "label_id", "split", "width", "height", "format", "mode", "bytes", "xxh3_128",
    "status", "error", "processed", "processing_status", "excluded", "orientation", "pixel_limit",
)  # fmt: skip
# Every column of image_metadata at schema 18, in table order: a history row holds them all.
ROW_COLUMNS = (
    "id", "root_id", "file_path", "file_path_bytes", "label_id", "width", "height", "format", "mode", "bytes",
    "mtime_ns", "xxh3_128", "status", "error", "warning", "processed", "processing_status", "created_at",
    "updated_at", "split", "pixel_limit", "orientation", "excluded", "inode", "ctime_ns", "path_hash",
)  # fmt: skip
# Indexes the schema makes (every other index is the user's or `dlindex index`'s).
SCHEMA_INDEXES = ("image_metadata_valid_from", "image_history_id", "image_history_label")
# A server catalog's full-text index of the texts (SQLite's is the FTS5 table: dlindex.catalog.sqlite.text_schema).
SERVER_SEARCH_INDEX = "image_texts_search"
SCHEMA_INDEX_LIST = (
    "(" + ", ".join(f"'{n}'" for n in (*SCHEMA_INDEXES, SERVER_SEARCH_INDEX)) + ")"
)  # for SQL: names from this module
# The state the running write transaction makes: the counter, already moved at its start.
CURRENT = "(SELECT counter FROM catalog_changes WHERE id = 1)"

_OLD = ", ".join(f"OLD.{c}" for c in ROW_COLUMNS)
_CHANGED = " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in TRACKED)
_INSERT_OLD = f"""INSERT INTO image_history ({", ".join(ROW_COLUMNS)}, valid_from, valid_to)
                VALUES ({_OLD}, coalesce(OLD.valid_from, 0), {CURRENT});"""

# Schema 20: a past state's history rows by label and path hash, so a per-label sample of that
# state reads each label's few history rows before its N-th live one (dlindex.query.per_label),
# not every history row of the state. Full, not partial: any filter is checked on the row.
HISTORY_BY_LABEL = (f"CREATE INDEX {SCHEMA_INDEXES[2]} ON image_history (label_id, path_hash)",)

HISTORY = (
    "ALTER TABLE image_metadata ADD COLUMN valid_from INTEGER",
    # The rows written since a state, by index: a diff, a version's close and an append never
    # read the whole catalog. Partial: the rows of an older catalog (NULL: state 0) are left
    # out. The catalog's only index of its own (SCHEMA_INDEXES): `dlindex index` and `stats`
    # leave it out of the indexes they manage and list.
    f"CREATE INDEX {SCHEMA_INDEXES[0]} ON image_metadata (valid_from) WHERE valid_from IS NOT NULL",
    # The key's columns first and in its order: SQLite 3.40's integrity_check misreads the NOT
    # NULL columns of a WITHOUT ROWID table whose key columns are declared in another order.
    """CREATE TABLE image_history (
        valid_to INTEGER NOT NULL,
        id INTEGER NOT NULL,
        root_id INTEGER,
        file_path TEXT,
        file_path_bytes BLOB,
        label_id INTEGER,
        width INTEGER,
        height INTEGER,
        format TEXT,
        mode TEXT,
        bytes INTEGER,
        mtime_ns INTEGER,
        xxh3_128 TEXT,
        status TEXT,
        error TEXT,
        warning TEXT,
        processed BOOLEAN,
        processing_status TEXT,
        created_at TIMESTAMP,
        updated_at TIMESTAMP,
        split TEXT,
        pixel_limit INTEGER,
        orientation INTEGER,
        excluded INTEGER,
        inode INTEGER,
        ctime_ns INTEGER,
        path_hash INTEGER,
        valid_from INTEGER NOT NULL,
        PRIMARY KEY (valid_to, id)
    ) WITHOUT ROWID""",
    # Keyed in state order, so it grows at its end, and a state's rows, a diff's and an
    # append's all start from "ended after S".
    # A past state's rows by id (a sample, a loader's fetch, an id span): without it each such
    # read would go through every history row that ended after the state.
    f"CREATE INDEX {SCHEMA_INDEXES[1]} ON image_history (id)",
    # A row inserted gets the state of its transaction (no program need know the column).
    f"""CREATE TRIGGER image_history_inserted AFTER INSERT ON image_metadata WHEN NEW.valid_from IS NULL
        BEGIN
            UPDATE image_metadata SET valid_from = {CURRENT} WHERE id = NEW.id;
        END""",
    # A row changed twice in one transaction (or inserted and changed) keeps one old version:
    # the one a reader could see.
    f"""CREATE TRIGGER image_history_updated AFTER UPDATE OF {", ".join(TRACKED)} ON image_metadata
        WHEN ({_CHANGED}) AND OLD.valid_from IS NOT {CURRENT}
        BEGIN
            {_INSERT_OLD}
            UPDATE image_metadata SET valid_from = {CURRENT} WHERE id = NEW.id;
        END""",
    f"""CREATE TRIGGER image_history_deleted AFTER DELETE ON image_metadata
        WHEN OLD.valid_from IS NOT {CURRENT}
        BEGIN
            {_INSERT_OLD}
        END""",
    "ALTER TABLE labels ADD COLUMN valid_from INTEGER",
    """CREATE TABLE label_history (
        id INTEGER NOT NULL,
        name TEXT NOT NULL,
        valid_from INTEGER NOT NULL,
        valid_to INTEGER NOT NULL
    )""",
    f"""CREATE TRIGGER label_history_inserted AFTER INSERT ON labels WHEN NEW.valid_from IS NULL
        BEGIN
            UPDATE labels SET valid_from = {CURRENT} WHERE id = NEW.id;
        END""",
    f"""CREATE TRIGGER label_history_deleted AFTER DELETE ON labels
        WHEN OLD.valid_from IS NOT {CURRENT}
        BEGIN
            INSERT INTO label_history (id, name, valid_from, valid_to)
            VALUES (OLD.id, OLD.name, coalesce(OLD.valid_from, 0), {CURRENT});
        END""",
    f"""CREATE TRIGGER label_history_renamed AFTER UPDATE OF name ON labels
        WHEN OLD.name IS NOT NEW.name AND OLD.valid_from IS NOT {CURRENT}
        BEGIN
            INSERT INTO label_history (id, name, valid_from, valid_to)
            VALUES (OLD.id, OLD.name, coalesce(OLD.valid_from, 0), {CURRENT});
            UPDATE labels SET valid_from = {CURRENT} WHERE id = NEW.id;
        END""",
    # The numbered versions: one per command that changed the catalog (scan, mark, merge,
    # features import, roots move), the states it spanned, and what it said it did.
    # AUTOINCREMENT: a number is never given twice (a dropped empty version leaves a gap, as on a server).
    """CREATE TABLE versions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        command TEXT NOT NULL,
        started_at TEXT NOT NULL,
        finished_at TEXT,
        first_change INTEGER NOT NULL,
        last_change INTEGER NOT NULL,
        summary TEXT,
        pid INTEGER,
        host TEXT
    )""",
    """CREATE TABLE version_tags (
        name TEXT PRIMARY KEY,
        version INTEGER NOT NULL REFERENCES versions(id),
        tagged_at TEXT NOT NULL
    )""",
    # The oldest state history can rebuild: where an older catalog began keeping it (the states
    # before were never recorded), or where `versions --prune-before` cut it; 0 for a new catalog.
    """CREATE TABLE version_floor (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        state INTEGER NOT NULL
    )""",
    "INSERT INTO version_floor (id, state) SELECT 1, CASE WHEN EXISTS (SELECT 1 FROM image_metadata) "
    "THEN counter ELSE 0 END FROM catalog_changes WHERE id = 1",
    # A catalog that already has rows starts with version 1: the catalog as it was when versions began.
    """INSERT INTO versions (command, started_at, finished_at, first_change, last_change, summary)
        SELECT 'catalog before versions were kept', strftime('%Y-%m-%dT%H:%M:%SZ', 'now'),
            strftime('%Y-%m-%dT%H:%M:%SZ', 'now'), 0, counter, NULL
        FROM catalog_changes WHERE id = 1 AND EXISTS (SELECT 1 FROM image_metadata)""",
)
