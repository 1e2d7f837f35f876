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
    f"""CREATE VIRTUAL TABLE {SEARCH_TABLE} USING fts5(text, content='image_texts', content_rowid='id',
        tokenize='unicode61 remove_diacritics 2')""",
    f"""CREATE TRIGGER image_texts_inserted AFTER INSERT ON image_texts BEGIN
            INSERT INTO {SEARCH_TABLE} (rowid, text) VALUES (NEW.id, NEW.text);
        END""",
    f"""CREATE TRIGGER image_texts_deleted AFTER DELETE ON image_texts BEGIN
            INSERT INTO {SEARCH_TABLE} ({SEARCH_TABLE}, rowid, text) VALUES ('delete', OLD.id, OLD.text);
        END""",
    f"""CREATE TRIGGER image_texts_updated AFTER UPDATE OF text ON image_texts BEGIN
            INSERT INTO {SEARCH_TABLE} ({SEARCH_TABLE}, rowid, text) VALUES ('delete', OLD.id, OLD.text);
            INSERT INTO {SEARCH_TABLE} (rowid, text) VALUES (NEW.id, NEW.text);
        END""",
)
_FTS5 = "SELECT 1 FROM pragma_module_list WHERE name = 'fts5'"
_HAS_SEARCH = f"SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{SEARCH_TABLE}'"


def m021_texts(conn: sqlite3.Connection) -> None:
    conn.execute(TEXTS)
    if conn.execute(_FTS5).fetchone() is not None:
        for statement in SEARCH:
            conn.execute(statement)


def has_search(conn: sqlite3.Connection) -> bool:
    """Whether the catalog has its full-text index (made where SQLite has FTS5)."""
    return conn.execute(_HAS_SEARCH).fetchone() is not None
