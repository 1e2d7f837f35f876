"""`dlindex check` through the CLI: healthy and unhealthy catalogs, --json, --quick, errors.

Damage of every kind, recovery and the random-damage fuzz test are in test_faults_catalog.py.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from .conftest import invoke, one_error_line


def test_a_healthy_catalog_exits_0_and_its_json_has_every_key(runner: CliRunner, scanned_db: Path) -> None:
    plain = invoke(runner, "check", "--db", str(scanned_db))
    assert plain.exit_code == 0 and plain.stdout.strip().endswith("healthy"), plain.output
    result = invoke(runner, "check", "--quick", "--json", "--db", str(scanned_db))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["healthy"] is True and report["problems"] == [] and report["integrity"] == "ok"
    assert report["images"] == 7 and report["orphans"] == {} and report["interrupted_scans"] == []
    assert {"path", "schema_version", "dlindex_schema_version", "seconds"} <= set(report)


def test_problems_are_listed_one_per_line_and_exit_1(runner: CliRunner, scanned_db: Path) -> None:
    with sqlite3.connect(scanned_db) as conn:  # an image row whose root is gone
        conn.execute("INSERT INTO image_metadata (root_id, file_path) VALUES (99, 'x.png')")
    conn.close()
    result = invoke(runner, "check", "--db", str(scanned_db))
    assert result.exit_code == 1, result.output
    problems = [line for line in result.stdout.splitlines() if line.startswith("problem: ")]
    assert len(problems) == 1 and "image_metadata -> roots" in problems[0], result.stdout
    as_json = json.loads(invoke(runner, "check", "--json", "--db", str(scanned_db)).stdout)
    assert as_json["healthy"] is False and as_json["orphans"] == {"image_metadata -> roots": 1}


def test_no_catalog_is_one_error_line(runner: CliRunner, tmp_path: Path) -> None:
    result = invoke(runner, "check", "--db", str(tmp_path / "missing.db"))
    assert result.exit_code == 1 and result.stdout == ""
    assert "missing.db" in one_error_line(result)


def test_a_moved_or_unmounted_root_is_a_problem(runner: CliRunner, scanned_db: Path, image_tree: Path) -> None:
    image_tree.rename(image_tree.with_name("elsewhere"))
    gone = invoke(runner, "check", "--db", str(scanned_db))
    assert gone.exit_code == 1, gone.output
    (problem,) = [line for line in gone.stdout.splitlines() if line.startswith("problem: ")]
    assert problem.startswith(f"problem: root {image_tree.resolve()} is missing (moved or unmounted?)")
    # the catalog file is whole: copying its rows into a new file would not bring the tree back
    assert (
        "--recover-to" not in gone.stdout and gone.stdout.splitlines()[-1] == "1 problem(s); the catalog file is whole"
    )
    image_tree.mkdir()  # an empty mount point
    empty = json.loads(invoke(runner, "check", "--json", "--db", str(scanned_db)).stdout)
    assert empty["healthy"] is False and len(empty["problems"]) == 1
    assert "holds none of 6 catalogued files looked for" in empty["problems"][0]


class _OneOpcodeWalk(sqlite3.Connection):
    """PRAGMA quick_check walks every b-tree in one SQLite opcode, which a progress handler never
    interrupts: this walk takes ``walk_s`` unless ``interrupt()`` is called."""

    stop: threading.Event
    walk_s = 60.0
    dropped = 0  # interrupts to ignore first, as SQLite drops one that lands before the statement starts

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:  # type: ignore[override]
        if "quick_check" in sql:
            if not self.stop.wait(self.walk_s):
                return super().execute(sql, *args)  # type: ignore[arg-type]
            raise sqlite3.OperationalError("interrupted")
        return super().execute(sql, *args)  # type: ignore[arg-type]

    def interrupt(self) -> None:
        if self.dropped:
            self.dropped -= 1
            return
        self.stop.set()
        super().interrupt()


def test_the_check_before_a_first_write_keeps_its_time_budget_on_a_big_file(
    scanned_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budgeted quick_check read the whole file before every first write: 3 GB at 10^7 rows."""
    from dlindex.catalog import check

    conn = sqlite3.connect(scanned_db, factory=_OneOpcodeWalk, check_same_thread=False)
    conn.stop = threading.Event()
    try:
        conn.walk_s = 0.5
        assert check.quick_check(conn, budget_s=0.01) == []  # a small file: checked in full, healthy
        assert not conn.stop.is_set()
        monkeypatch.setattr(check, "_WHOLE_CHECK_BYTES", 0)  # as if it were larger than that
        conn.walk_s = 60.0
        assert check.quick_check(conn, budget_s=0.01) == []  # no verdict: the budget ran out
        assert conn.stop.is_set()
        conn.stop.clear()
        assert conn.execute("SELECT count(*) FROM image_metadata").fetchone() == (7,)  # a late timer hits nothing
        conn.stop.clear()
        conn.dropped, conn.walk_s = 1, 5.0  # a busy machine: the statement started after the first interrupt
        assert check.quick_check(conn, budget_s=0.01) == []
        assert conn.stop.is_set()  # interrupted all the same, not after the whole walk
    finally:
        conn.close()
