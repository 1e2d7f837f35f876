"""Schema 21: the texts that come with images (captions, alt texts, descriptions) and their
full-text index (docs/text.md).

One image has any number of texts, each from a *source* (a sidecar's suffix, ``.txt``,
``.caption``, ``.json``, or the name of a ``text import``) and numbered within it (``seq``:
COCO has five captions per image). ``text`` holds the characters; ``encoding`` the codec
that gives back the bytes they were read from (``text.encode(encoding)``), so a Latin-1 or
UTF-16 sidecar is kept losslessly. A sidecar's text keeps the file's size and mtime
(``file_bytes``, ``file_mtime_ns``; NULL for an import), so a rescan reads only the sidecars
that changed. A text goes with its image (ON DELETE CASCADE).

The full-text index is SQLite's FTS5 over the table (external content: the text is stored
once), kept up to date by triggers, so a write by any program keeps it right too. SQLite
built without FTS5 gets the table alone; ``query --text`` then says so (``has_search``).
"""

from __future__ import annotations

import sqlite3

TEXTS = """CREATE TABLE image_texts (
    id INTEGER PRIMARY KEY,
    image_id INTEGER NOT NULL REFERENCES image_metadata(id) ON DELETE CASCADE,
    source TEXT NOT NULL,
    seq INTEGER NOT NULL,
    text TEXT NOT NULL,
    encoding TEXT NOT NULL DEFAULT 'utf-8',
    file_bytes INTEGER,
    file_mtime_ns INTEGER,
    UNIQUE (image_id, source, seq)
)"""
SEARCH_TABLE = "image_texts_fts"
# unicode61 folds case and (remove_diacritics 2) accents: 'Cafe' finds 'café'.
SEARCH = (
    # image_id UNINDEXED: read from the table by rowid, so a search names samples in one
    # statement shape on both backends (``SELECT image_id FROM image_texts_fts(q)``).
    f"""CREATE VIRTUAL TABLE {SEARCH_TABLE} USING fts5(text, image_id UNINDEXED, content='image_texts',
        content_rowid='id', tokenize='unicode61 remove_diacritics 2')""",
    f"""CREATE TRIGGER image_texts_inserted AFTER INSERT ON image_texts BEGIN
            INSERT INTO {SEARCH_TABLE} (rowid, text, image_id) VALUES (NEW.id, NEW.text, NEW.image_id);
        END""",
    f"""CREATE TRIGGER image_texts_deleted AFTER DELETE ON image_texts BEGIN
            INSERT INTO {SEARCH_TABLE} ({SEARCH_TABLE}, rowid, text, image_id)
                VALUES ('delete', OLD.id, OLD.text, OLD.image_id);
        END""",
    f"""CREATE TRIGGER image_texts_updated AFTER UPDATE OF text, image_id ON image_texts BEGIN
            INSERT INTO {SEARCH_TABLE} ({SEARCH_TABLE}, rowid, text, image_id)
                VALUES ('delete', OLD.id, OLD.text, OLD.image_id);
            INSERT INTO {SEARCH_TABLE} (rowid, text, image_id) VALUES (NEW.id, NEW.text, NEW.image_id);
        END""",
)
_FTS5 = "SELECT 1 FROM pragma_module_list WHERE name = 'fts5'"
_HAS_SEARCH = f"SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{SEARCH_TABLE}'"


def m021_texts(conn: sqlite3.Connection) -> None:
    conn.execute(TEXTS)
    if conn.execute(_FTS5).fetchone() is not None:
        for statement in SEARCH:
            conn.execute(statement)


_CHECK = f"INSERT INTO {SEARCH_TABLE} ({SEARCH_TABLE}, rank) VALUES ('integrity-check', 1)"
_SQLITE_CORRUPT = 11  # FTS5's integrity-check fails with SQLITE_CORRUPT_VTAB (an extended code of it)
REBUILD = f"INSERT INTO {SEARCH_TABLE} ({SEARCH_TABLE}) VALUES ('rebuild')"


def search_problems(path: str) -> list[str]:
    """Whether the full-text index agrees with the texts (FTS5's own integrity-check, which
    PRAGMA integrity_check does not run). FTS5 runs it as an INSERT, so it needs a writable
    connection: inside a transaction that is rolled back, nothing is written. A catalog
    that cannot be written now (read-only, locked) is not checked."""
    try:
        conn = sqlite3.connect(path, isolation_level=None, timeout=1)
    except sqlite3.Error:
        return []
    try:
        if conn.execute(_HAS_SEARCH).fetchone() is None:
            return []
        conn.execute("BEGIN")
        conn.execute(_CHECK)
    except UnicodeDecodeError:  # SQLite's message quoted a damaged schema: check reports the schema
        return []
    except sqlite3.DatabaseError as e:
        if e.sqlite_errorcode & 0xFF != _SQLITE_CORRUPT:  # read-only, locked, busy: not checked now
            return []
        return [f"the full-text index of texts is damaged ({e}): rebuild it with dlindex text reindex"]
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.close()
    return []


def has_search(conn: sqlite3.Connection) -> bool:
    """Whether the catalog has its full-text index (made where SQLite has FTS5)."""
    return conn.execute(_HAS_SEARCH).fetchone() is not None
