"""The check before a first write, started ahead on its own thread (dlindex scan): the same
verdict as the check made at the write, nothing written into a damaged file, no thread left."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlindex import Catalog
from dlindex.catalog import check
from dlindex.catalog.sqlite.check_ahead import CheckAhead
from dlindex.cli import app
from dlindex.errors import DamagedCatalogError

from .synthetic import Row, make_catalog, present_root
from .test_faults_catalog import DAMAGE, _corrupt_page, one_line


@pytest.fixture
def catalog_file(tmp_path: Path) -> Path:
    rows = [Row(f"l{i % 5}", width=i) for i in range(3000)]  # image_metadata spans many pages
    db = make_catalog(tmp_path / "c.db", rows, root=present_root(tmp_path / "tree", rows))
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return db


def _inline_verdict(db: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return check.quick_check(conn, budget_s=60.0)
    finally:
        conn.close()


def _ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dlindex-check-ahead"]


def test_the_verdict_is_the_checks_own_on_a_healthy_and_a_damaged_file(catalog_file: Path) -> None:
    assert CheckAhead(str(catalog_file), 60.0).verdict() == [] == _inline_verdict(catalog_file)
    _corrupt_page(catalog_file)
    found = CheckAhead(str(catalog_file), 60.0).verdict()
    assert found and found == _inline_verdict(catalog_file)


def test_no_verdict_where_the_thread_could_not_check(tmp_path: Path) -> None:
    assert CheckAhead(str(tmp_path / "gone" / "c.db"), 60.0).verdict() is None


def test_a_cancelled_check_gives_no_verdict_and_leaves_no_thread(catalog_file: Path) -> None:
    ahead = CheckAhead(str(catalog_file), 60.0)
    ahead.cancel()
    assert ahead.verdict() is None
    assert not _ahead_threads()


def test_the_first_write_takes_the_verdict_instead_of_checking_again(
    catalog_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Catalog(catalog_file) as catalog:
        catalog.check_ahead()
        calls: list[object] = []
        monkeypatch.setattr(check, "quick_check", lambda *a, **k: calls.append(a) or [])  # the inline check
        with catalog.write_transaction() as conn:
            conn.execute("UPDATE image_metadata SET status = 'ok' WHERE id = 1")
        assert calls == []
    assert not _ahead_threads()


def test_without_a_verdict_the_first_write_checks_as_before(
    catalog_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(CheckAhead, "_run", lambda self: None)  # a thread that found nothing to say
    _corrupt_page(catalog_file)
    before = catalog_file.read_bytes()
    with Catalog(catalog_file) as catalog:
        catalog.check_ahead()
        with pytest.raises(DamagedCatalogError), catalog.write_transaction() as conn:
            conn.execute("UPDATE image_metadata SET status = 'ok' WHERE id = 1")
    assert catalog_file.read_bytes() == before


def test_a_catalog_closed_before_any_write_stops_its_check(catalog_file: Path) -> None:
    with Catalog(catalog_file) as catalog:
        catalog.check_ahead()
        catalog.check_ahead()  # once is enough
    assert not _ahead_threads()


@pytest.mark.parametrize("damage", sorted(set(DAMAGE) - {"zero length"}))  # an empty file: scan makes a catalog
def test_scan_into_a_damaged_catalog_is_one_line_and_writes_nothing(
    damage: str, catalog_file: Path, tmp_path: Path
) -> None:
    """`dlindex scan` starts the check ahead: a damaged file is still refused before any write."""
    DAMAGE[damage](catalog_file)
    before = catalog_file.read_bytes()
    result = CliRunner().invoke(app, ["scan", str(tmp_path / "tree"), "--db", str(catalog_file), "-q", "-w", "1"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code != 0, result.output
    one_line(result.stderr)
    assert catalog_file.read_bytes() == before
    assert not _ahead_threads()
