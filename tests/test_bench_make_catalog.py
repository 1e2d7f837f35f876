"""bench/make_catalog.py: a generated catalog is one dlindex accepts as if `dlindex scan` had made it."""

from __future__ import annotations

import importlib
import json
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from dlindex.cli import app

from .conftest import REPO, scan

ROWS = 2_000


@pytest.fixture(scope="module")
def make_catalog() -> Iterator[ModuleType]:
    pytest.importorskip("numpy")
    sys.path.insert(0, str(REPO / "bench"))
    try:
        yield importlib.import_module("make_catalog")
    finally:
        sys.path.remove(str(REPO / "bench"))


def _generate(make_catalog: ModuleType, db: Path, **spec: object) -> dict[str, object]:
    figures: dict[str, object] = make_catalog.make_sqlite(db, make_catalog.CatalogSpec(rows=ROWS, **spec), chunk=700)
    return figures


def _schema(db: Path) -> tuple[object, ...]:
    conn = sqlite3.connect(db)
    try:
        master = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").fetchall()
        pragmas = [conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("user_version", "application_id", "page_size")]
        return (master, pragmas, conn.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        conn.close()


def test_generated_catalog_has_a_scanned_catalogs_schema(
    make_catalog: ModuleType, tmp_path: Path, image_tree: Path
) -> None:
    _generate(make_catalog, tmp_path / "g.db")
    scan(tmp_path / "s.db", image_tree)
    assert _schema(tmp_path / "g.db") == _schema(tmp_path / "s.db")


def test_commands_accept_the_generated_catalog(make_catalog: ModuleType, tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    figures = _generate(make_catalog, db, hostile=0.05, attributes=0.5)
    runner = CliRunner()

    def ok(*args: str) -> str:
        result = runner.invoke(app, [*args, "--db", str(db)])
        assert result.exit_code == 0, (args, result.output)
        return result.stdout

    ok("check")
    assert f"images {ROWS:,}" in ok("stats")
    lines = ok("query", "--limit", "5").splitlines()
    assert len(lines) == 5 and all(json.loads(line)["id"] for line in lines)
    ok("query", "--per-label", "2", "--seed", "1", "--limit", "10")
    for fmt, limit in (("jsonl", []), ("csv", ["--limit", "50"])):  # jsonl: every row, hostile names too
        ok("export", str(tmp_path / f"out-{fmt}"), "--format", fmt, *limit)
        assert (tmp_path / f"out-{fmt}" / "index.json").is_file()
    assert '"vectors": ' in ok("features", "list")
    ok("export", str(tmp_path / "grouped"), "--split", "train=0.8,val=0.2", "--group-by", "source")
    conn = sqlite3.connect(db)
    try:
        (statuses,) = conn.execute("SELECT count(DISTINCT status) FROM image_metadata").fetchone()
        (raw,) = conn.execute("SELECT count(*) FROM image_metadata WHERE file_path_bytes IS NOT NULL").fetchone()
        (vectors,) = conn.execute("SELECT count(*) FROM image_features").fetchone()
        (counter,) = conn.execute("SELECT counter FROM catalog_changes").fetchone()
    finally:
        conn.close()
    assert statuses == 3 and raw > 0 and counter > 0
    assert vectors == figures["features"] and vectors > 0


def test_same_seed_same_rows(make_catalog: ModuleType, tmp_path: Path) -> None:
    def content(db: Path) -> list[tuple[object, ...]]:
        conn = sqlite3.connect(db)
        try:
            return (
                conn.execute("SELECT * FROM image_metadata ORDER BY id").fetchall()
                + conn.execute("SELECT * FROM image_features ORDER BY image_id").fetchall()
            )
        finally:
            conn.close()

    for name, seed in (("a.db", 0), ("b.db", 0), ("c.db", 1)):
        _generate(make_catalog, tmp_path / name, seed=seed)
    assert content(tmp_path / "a.db") == content(tmp_path / "b.db") != content(tmp_path / "c.db")


def test_generated_server_catalog(make_catalog: ModuleType, tmp_path: Path, pg_url: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    make_pg = importlib.import_module("make_catalog_pg")  # bench/ is on sys.path (the make_catalog fixture)
    spec = make_catalog.CatalogSpec(rows=300, root=str(tmp_path / "root"))
    figures = make_pg.make_postgres(pg_url, spec, chunk=100)
    assert figures["rows"] == 300
    with psycopg.connect(pg_url) as conn:  # a later insert gets a fresh id: the sequences moved on
        (id_,) = conn.execute("INSERT INTO labels (name) VALUES ('new') RETURNING id").fetchone() or (0,)
        assert id_ == spec.labels + 1
    runner = CliRunner()
    # `check` reads catalog files only; a server keeps its own pages whole
    for args in (["stats"], ["query", "--limit", "5"], ["export", str(tmp_path / "out"), "--format", "jsonl"]):
        result = runner.invoke(app, [*args, "--db", pg_url])
        assert result.exit_code == 0, (args, result.output)
