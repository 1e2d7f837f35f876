"""Merging parts against the catalog they were cut from: later changes to the catalog win.

A part that starts as a copy of the catalog (``scan --engine ray``) carries every row of the
catalog as it was at the cut. Merged as a plain part, each row the catalog changed since
(a ``mark``, a plain scan, a ``features compute``) would differ from the part's copy and the
part would win, silently undoing it. Given the cut (the copy the parts were made from):

- a part row equal to the cut's is a copy, not the part's work: it is dropped;
- a part's sample row whose catalog row changed after the cut (or appeared, or went) is
  dropped too: the later change wins, and the next scan looks at that file again.

Statements take column names from dlindex.catalog.merge's constants, never from input.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from dlindex.catalog import merge_texts

_CUT_LABEL = "cl.name"
_KEY = "cr.path = {m}.root_path AND c.file_path = {m}.file_path"
_CUT_ROW = (
    "FROM cut.image_metadata c JOIN cut.roots cr ON cr.id = c.root_id LEFT JOIN cut.labels cl ON cl.id = c.label_id"
)
_COPIED_VECTOR = """DELETE FROM temp.m_vectors WHERE EXISTS (SELECT 1 FROM cut.image_features f
    JOIN cut.image_metadata c ON c.id = f.image_id JOIN cut.roots cr ON cr.id = c.root_id
    WHERE cr.path = m_vectors.root_path AND c.file_path = m_vectors.file_path
    AND f.feature_type = m_vectors.feature_type AND f.vector = m_vectors.vector)"""
_COPIED_STATE = """DELETE FROM temp.m_state WHERE EXISTS (SELECT 1 FROM cut.feature_state s
    JOIN cut.image_metadata c ON c.id = s.image_id JOIN cut.roots cr ON cr.id = c.root_id
    WHERE cr.path = m_state.root_path AND c.file_path = m_state.file_path
    AND s.feature_type = m_state.feature_type AND s.state IS m_state.state AND s.error IS m_state.error)"""
_COPIED_ATTR = """DELETE FROM temp.m_attrs WHERE EXISTS (SELECT 1 FROM cut.sample_attributes a
    JOIN cut.image_metadata c ON c.id = a.image_id JOIN cut.roots cr ON cr.id = c.root_id
    WHERE cr.path = m_attrs.root_path AND c.file_path = m_attrs.file_path
    AND a.name = m_attrs.name AND a.value IS m_attrs.value)"""
_CUT_TABLE = "m_cut"
_CUT_INDEX = "CREATE UNIQUE INDEX temp.m_cut_key ON m_cut (root_path, file_path)"


def _same(content: Sequence[str], left: str, right: str, left_label: str) -> str:
    return " AND ".join(f"{left_label if c == 'label' else left + '.' + c} IS {right}.{c}" for c in content)


def drop_copies(conn: sqlite3.Connection, cut: Path, content: Sequence[str]) -> None:
    """Drop the staged part rows equal to the cut's, and keep the cut's version of the rest
    (``temp.m_cut``). Runs outside a transaction, after the parts are staged."""
    conn.execute("ATTACH DATABASE ? AS cut", (os.fspath(cut),))
    try:
        conn.execute("BEGIN")
        conn.execute(
            f"DELETE FROM temp.m_rows WHERE EXISTS (SELECT 1 {_CUT_ROW} WHERE {_KEY.format(m='m_rows')} AND "
            f"{_same(content, 'c', 'm_rows', _CUT_LABEL)})"
        )
        for statement in (_COPIED_VECTOR, _COPIED_STATE, _COPIED_ATTR, merge_texts.DROP_COPIES):
            conn.execute(statement)
        columns = ", ".join(_CUT_LABEL + " AS label" if c == "label" else "c." + c for c in content)
        conn.execute(
            f"CREATE TEMP TABLE {_CUT_TABLE} AS SELECT DISTINCT m.root_path, m.file_path, {columns} "
            f"FROM temp.m_rows m JOIN cut.roots cr ON cr.path = m.root_path "
            "JOIN cut.image_metadata c ON c.root_id = cr.id AND c.file_path = m.file_path "
            "LEFT JOIN cut.labels cl ON cl.id = c.label_id"
        )
        conn.execute(_CUT_INDEX)
        conn.execute("COMMIT")
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.execute("DETACH DATABASE cut")


def drop_overtaken(conn: sqlite3.Connection, content: Sequence[str]) -> int:
    """Inside the merge's transaction: drop part rows of samples the target changed after the
    cut (its row differs from the cut's, or is new, or is gone); how many."""
    target = "FROM main.image_metadata t JOIN main.roots tr ON tr.id = t.root_id LEFT JOIN main.labels tl ON tl.id = t.label_id"
    key = "tr.path = m_rows.root_path AND t.file_path = m_rows.file_path"
    statement = f"""DELETE FROM temp.m_rows WHERE CASE
        WHEN EXISTS (SELECT 1 FROM temp.m_cut k WHERE k.root_path = m_rows.root_path AND k.file_path = m_rows.file_path)
        THEN NOT EXISTS (SELECT 1 {target} JOIN temp.m_cut k ON k.root_path = tr.path AND k.file_path = t.file_path
            WHERE {key} AND {_same(content, "t", "k", "tl.name")})
        ELSE EXISTS (SELECT 1 {target} WHERE {key}) END"""
    return conn.execute(statement).rowcount


def drop_cut(conn: sqlite3.Connection) -> None:
    conn.execute(f"DROP TABLE IF EXISTS temp.{_CUT_TABLE}")
