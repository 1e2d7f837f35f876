"""Texts into the catalog: staged first, then each sample's texts of a source replaced at once.

A writer (``text import``, a scan's sidecars) stages the texts it read in ``temp.text_rows``
and, in ``temp.text_scope``, every (sample, source) pair it read completely, with no rows
for a sidecar that is gone. ``apply_texts`` then makes each scoped pair hold exactly its
staged texts in two set-based statements: texts that are no longer there, or differ, are
deleted; the new ones inserted; one that is the same stays as it was (its id and its entry
in the full-text index untouched). Nothing outside the scope is touched: an import of
``captions.csv`` never removes a sidecar's text, nor another import's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dlindex.catalog.sqlite.history_schema import SERVER_SEARCH_INDEX
from dlindex.errors import InputError

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog


class Connection(Protocol):
    """What staging needs of a connection: a catalog's, or the plain sqlite3 one a merge holds."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...
    def executemany(self, sql: str, seq_of_parameters: Any, /) -> Any: ...


# A text's size, in UTF-8 bytes, before anything holds it whole: a caption is a sentence, a
# description a few paragraphs. Larger is no text for a training sample (docs/text.md).
MAX_TEXT_BYTES = 256 << 10

_CREATE = (
    "CREATE TEMP TABLE IF NOT EXISTS text_rows (image_id INTEGER NOT NULL, source TEXT NOT NULL, "
    "seq INTEGER NOT NULL, text TEXT NOT NULL, encoding TEXT NOT NULL, file_bytes INTEGER, file_mtime_ns INTEGER, "
    "PRIMARY KEY (image_id, source, seq))",
    "CREATE TEMP TABLE IF NOT EXISTS text_scope (image_id INTEGER NOT NULL, source TEXT NOT NULL, "
    "PRIMARY KEY (image_id, source))",
)
_CLEAR = ("DELETE FROM temp.text_rows", "DELETE FROM temp.text_scope")
STAGE_ROW = (
    "INSERT INTO temp.text_rows (image_id, source, seq, text, encoding, file_bytes, file_mtime_ns) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
STAGE_SCOPE = "INSERT INTO temp.text_scope (image_id, source) VALUES (?, ?) ON CONFLICT (image_id, source) DO NOTHING"
# Every pair with a staged text is in scope.
_SCOPE_ROWS = """INSERT INTO temp.text_scope (image_id, source) SELECT DISTINCT image_id, source FROM temp.text_rows
    WHERE true ON CONFLICT (image_id, source) DO NOTHING"""
_DELETE = """DELETE FROM image_texts WHERE EXISTS (SELECT 1 FROM temp.text_scope s
        WHERE s.image_id = image_texts.image_id AND s.source = image_texts.source)
    AND NOT EXISTS (SELECT 1 FROM temp.text_rows r WHERE r.image_id = image_texts.image_id
        AND r.source = image_texts.source AND r.seq = image_texts.seq AND r.text = image_texts.text
        AND r.encoding = image_texts.encoding)"""
_INSERT = """INSERT INTO image_texts (image_id, source, seq, text, encoding, file_bytes, file_mtime_ns)
    SELECT image_id, source, seq, text, encoding, file_bytes, file_mtime_ns FROM temp.text_rows
    WHERE true ORDER BY image_id, source, seq
    ON CONFLICT (image_id, source, seq) DO NOTHING"""
# A kept text whose sidecar was touched (same text, new mtime): the next rescan need not read it.
_RESTAT = """UPDATE image_texts SET file_bytes = r.file_bytes, file_mtime_ns = r.file_mtime_ns FROM temp.text_rows r
    WHERE r.image_id = image_texts.image_id AND r.source = image_texts.source AND r.seq = image_texts.seq
    AND (r.file_bytes IS NOT image_texts.file_bytes OR r.file_mtime_ns IS NOT image_texts.file_mtime_ns)"""
# Feature types made from texts (extractor ``text:...``, dlindex.features.text_extractors): a
# sample whose texts change loses its vectors and failures of them, as a changed image loses its
# image vectors (the image_features_stale trigger), so the next compute makes them again.
TEXT_TYPE_LIKE = "text:%"
_HAS_TEXT_TYPES = "SELECT 1 FROM feature_types WHERE extractor LIKE ? LIMIT 1"
_CHANGED = """SELECT image_id FROM image_texts WHERE EXISTS (SELECT 1 FROM temp.text_scope s
        WHERE s.image_id = image_texts.image_id AND s.source = image_texts.source)
    AND NOT EXISTS (SELECT 1 FROM temp.text_rows r WHERE r.image_id = image_texts.image_id
        AND r.source = image_texts.source AND r.seq = image_texts.seq AND r.text = image_texts.text)
    UNION SELECT image_id FROM temp.text_rows r WHERE NOT EXISTS (SELECT 1 FROM image_texts t
        WHERE t.image_id = r.image_id AND t.source = r.source AND t.seq = r.seq AND t.text = r.text)"""
_DROP_TEXT_VECTORS = tuple(
    f"""DELETE FROM {table} WHERE feature_type IN (SELECT name FROM feature_types WHERE extractor LIKE ?)
    AND image_id IN ({_CHANGED}){more}"""
    for table, more in (("image_features", ""), ("feature_state", " AND state = 'failed'"))
)
# Samples' texts by id, in the order every reader shows them (texts_of, export --texts).
TEXTS_OF = """SELECT image_id, source, seq, text FROM image_texts
    WHERE image_id IN (SELECT value FROM json_each(:ids)) ORDER BY image_id, source, seq"""
# The texts alone, in that order: what export --texts, the loader and text features read.
TEXT_BODIES_OF = """SELECT image_id, text FROM image_texts
    WHERE image_id IN (SELECT value FROM json_each(:ids)) ORDER BY image_id, source, seq"""
_REINDEX_SERVER = f"REINDEX INDEX {SERVER_SEARCH_INDEX}"


@dataclass(frozen=True)
class TextChanges:
    """What ``apply_texts`` changed: texts added (new or edited) and removed (gone or edited)."""

    added: int
    removed: int


def start_staging(conn: Connection) -> None:
    """Make the staging tables (temporary: this connection's own) and empty them."""
    for statement in (*_CREATE, *_CLEAR):
        conn.execute(statement)


def stage_rows(conn: Connection, rows: Iterable[tuple[int, str, int, str, str, int | None, int | None]]) -> None:
    """Stage (image id, source, seq, text, encoding, file bytes, file mtime) rows; their pairs are in scope."""
    conn.executemany(STAGE_ROW, rows)


def apply_texts(conn: Connection) -> TextChanges:
    """Replace the scoped pairs' texts by the staged ones, inside the caller's write transaction."""
    conn.execute(_SCOPE_ROWS)
    if conn.execute(_HAS_TEXT_TYPES, (TEXT_TYPE_LIKE,)).fetchone() is not None:
        for statement in _DROP_TEXT_VECTORS:
            conn.execute(statement, (TEXT_TYPE_LIKE,))
    removed = conn.execute(_DELETE).rowcount
    added = conn.execute(_INSERT).rowcount
    conn.execute(_RESTAT)
    for statement in _CLEAR:
        conn.execute(statement)
    return TextChanges(added=max(added, 0), removed=max(removed, 0))


def end_staging(catalog: Catalog, conn: Any) -> None:
    for table in ("text_rows", "text_scope"):
        catalog.backend.end_temp_table(conn, table)


def reindex(catalog: Catalog) -> None:
    """Rebuild the full-text index of the texts from the texts themselves (``text reindex``):
    the way back from a damaged index, which ``check`` reports."""
    from dlindex.catalog.sqlite.text_schema import REBUILD

    if not catalog.backend.has_text_search(catalog.conn):
        raise InputError(f"catalog {catalog.path} has no full-text index: the SQLite that made it has no FTS5")
    with catalog.write_transaction() as tx:
        tx.execute(_REINDEX_SERVER if catalog.backend.is_server else REBUILD)


def grouped_texts(rows: Iterable[tuple[int, str]]) -> dict[int, list[str]]:
    """(sample id, text) rows, in order, as each sample's list of texts."""
    found: dict[int, list[str]] = {}
    for image_id, text in rows:
        found.setdefault(image_id, []).append(text)
    return found


def texts_of(catalog: Catalog, ids: Iterable[int]) -> dict[int, list[dict[str, Any]]]:
    """Each sample's texts, by id: ``{"source", "seq", "text"}`` in source then seq order."""
    found: dict[int, list[dict[str, Any]]] = {}
    for image_id, source, seq, text in catalog.read(TEXTS_OF, {"ids": json.dumps([int(i) for i in ids])}):
        found.setdefault(int(image_id), []).append({"source": source, "seq": int(seq), "text": text})
    return found
