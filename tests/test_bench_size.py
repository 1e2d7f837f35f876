"""bench/bench_size.py on a tiny generated catalog: results saved per (rows, case), the shared
catalog never written except by `mark`, which puts every row back as it was."""

from __future__ import annotations

import hashlib
import importlib
import json
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from dlindex.catalog.sqlite.history_schema import ROW_COLUMNS

from .conftest import REPO

ROWS = 2_000


@pytest.fixture(scope="module")
def bench() -> Iterator[tuple[ModuleType, ModuleType]]:
    pytest.importorskip("numpy")
    sys.path.insert(0, str(REPO / "bench"))
    try:
        yield importlib.import_module("make_catalog"), importlib.import_module("bench_size")
    finally:
        sys.path.remove(str(REPO / "bench"))


def _digest(db: Path) -> tuple[str, list[tuple[str, ...]]]:
    conn = sqlite3.connect(db)
    try:
        # what a row says, not since which state it says it (valid_from: a mark and its undo are two versions)
        shown = ", ".join(ROW_COLUMNS)
        rows = hashlib.sha256(repr(conn.execute(f"SELECT {shown} FROM image_metadata ORDER BY id").fetchall()).encode())
        return rows.hexdigest(), conn.execute("SELECT type, name FROM sqlite_master ORDER BY name").fetchall()
    finally:
        conn.close()


def test_cases_save_results_and_leave_the_catalog_as_it_was(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_catalog, bench_size = bench
    # The 8 GB the runner keeps free is for catalogs of 10^8 rows; these are kilobytes, and the
    # test must not depend on the machine's free disk (it failed once with 6.9 GB free)
    monkeypatch.setattr(bench_size, "MIN_FREE", 0)
    db = tmp_path / "c.db"
    make_catalog.make_sqlite(db, make_catalog.CatalogSpec(rows=ROWS), chunk=700)
    before = _digest(db)
    results, scratch = tmp_path / "results", tmp_path / "scratch"
    common = ["--rows", str(ROWS), "--catalog", str(db), "--results", str(results), "--scratch", str(scratch)]
    bench_size.main([*common, "--only", "stats,per-label,export-jsonl-split", "--no-docs"])
    assert _digest(db) == before  # the writing cases wrote into a copy
    bench_size.main([*common, "--only", "mark,export-parquet", "--in-place", "--no-docs"])
    assert _digest(db) == before  # mark put the flags and updated_at back; the export was skipped
    assert not [p for p in scratch.iterdir() if p.suffix in (".db", ".ids")]  # copies and outputs removed

    saved = {p.stem: json.loads(p.read_text()) for p in (results / str(ROWS)).glob("*.json")}
    assert set(saved) == {"stats", "per-label", "export-jsonl-split", "mark", "export-parquet"}
    for name in ("stats", "per-label", "export-jsonl-split", "mark"):
        figures = saved[name]["figures"]
        assert figures["cpu_s"] > 0 and figures["peak_rss_mb"] > 0, name
        assert saved[name]["baseline"]["cpu_s"] > 0, name
    assert saved["mark"]["extra"]["restored"] and saved["mark"]["extra"]["ids"] > 0
    assert saved["export-jsonl-split"]["extra"]["selected"] > 0
    assert "with --allow-writes" in saved["export-parquet"]["skipped"]

    section = importlib.import_module("size_report").render(results)
    assert section.startswith("<!-- bench_size:start -->") and "`mark --unprocessed`" in section
