"""The texts of a merge (dlindex.catalog.merge_rows): each part's texts of a sample and source
replace the catalog's, as ``text import`` would (dlindex.catalog.texts).

A part carries a (sample, source) text set whole; the catalog's set of that pair becomes it,
texts that are the same staying as they were. A pair no part carries is left alone (a merge
adds, it never deletes). Against the cut a part was copied from, a set equal to the cut's is a
copy, not the part's work, and is dropped, so a text imported into the catalog after the cut
is kept (dlindex.catalog.merge_cut).
"""

from __future__ import annotations

import sqlite3

from dlindex.catalog.texts import apply_texts, start_staging

TEMP_TABLE = """CREATE TEMP TABLE m_texts (src INTEGER, root_path TEXT, file_path TEXT, source TEXT, seq INTEGER,
    text TEXT, encoding TEXT, file_bytes INTEGER, file_mtime_ns INTEGER)"""
COPY_FROM_PART = """INSERT INTO temp.m_texts SELECT :part, r.path, i.file_path, t.source, t.seq, t.text, t.encoding,
        t.file_bytes, t.file_mtime_ns
    FROM part.image_texts t JOIN part.image_metadata i ON i.id = t.image_id JOIN part.roots r ON r.id = i.root_id"""
# A staged set equal to the cut's set of the same pair: as many texts, each found in the cut.
DROP_COPIES = """DELETE FROM temp.m_texts WHERE (src, root_path, file_path, source) IN (
    SELECT m.src, m.root_path, m.file_path, m.source FROM temp.m_texts m
    GROUP BY m.src, m.root_path, m.file_path, m.source
    HAVING count(*) = (SELECT count(*) FROM cut.image_texts t JOIN cut.image_metadata c ON c.id = t.image_id
            JOIN cut.roots cr ON cr.id = c.root_id
            WHERE cr.path = m.root_path AND c.file_path = m.file_path AND t.source = m.source)
        AND count(*) = sum(EXISTS (SELECT 1 FROM cut.image_texts t JOIN cut.image_metadata c ON c.id = t.image_id
            JOIN cut.roots cr ON cr.id = c.root_id
            WHERE cr.path = m.root_path AND c.file_path = m.file_path AND t.source = m.source
            AND t.seq = m.seq AND t.text = m.text AND t.encoding = m.encoding)))"""
SAME_AMONG_PARTS = "root_path, file_path, source, seq, text, encoding"  # merge_rows drops the repeats
CONFLICT = ("m_texts", ", source, seq")  # then two texts at one place are two parts disagreeing
_STAGE = """INSERT INTO temp.text_rows (image_id, source, seq, text, encoding, file_bytes, file_mtime_ns)
    SELECT t.id, m.source, m.seq, m.text, m.encoding, m.file_bytes, m.file_mtime_ns FROM temp.m_texts m
    JOIN main.roots tr ON tr.path = m.root_path JOIN main.image_metadata t ON t.root_id = tr.id
        AND t.file_path = m.file_path"""


def apply(conn: sqlite3.Connection) -> int:
    """Write the staged texts (inside the merge's write transaction); how many were added."""
    start_staging(conn)
    conn.execute(_STAGE)
    return apply_texts(conn).added
