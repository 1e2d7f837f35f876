"""merge in bounded memory (#34): SQLite's caches and sorter are capped whatever the rows."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from dlindex.catalog import merge_rows
from dlindex.catalog.connection import Catalog
from dlindex.catalog.merge import merge_catalogs

from .synthetic import Row, make_catalog

BOUND_KIB = 256 * 1024  # SQLite's share of merge's memory: the default memory budget's size


def _kib(conn: sqlite3.Connection, schema: str) -> int:
    size = int(conn.execute(f"PRAGMA {schema}.cache_size").fetchone()[0])
    page = int(conn.execute(f"PRAGMA {schema}.page_size").fetchone()[0])
    return -size if size < 0 else size * page // 1024


def test_merge_caps_sqlites_caches_and_sorter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    part = make_catalog(tmp_path / "part.db", [Row(label) for label in ("a", "b", "a", "c")])
    seen: dict[str, int] = {}
    real = merge_rows.apply

    def spy(conn: sqlite3.Connection, paths: list[Path]) -> Any:
        seen.update(main=_kib(conn, "main"), temp=_kib(conn, "temp"))
        return real(conn, paths)

    monkeypatch.setattr(merge_rows, "apply", spy)
    summary = merge_catalogs([str(part)], tmp_path / "merged.db")
    assert summary.parts == 1
    # main's page cache, temp's, and the sorter, which SQLite limits by main's cache_size
    assert 2 * seen["main"] + seen["temp"] <= BOUND_KIB, seen
    with Catalog(tmp_path / "merged.db") as c:
        assert c.conn.execute("SELECT count(*) FROM image_metadata").fetchone()[0] == 4
