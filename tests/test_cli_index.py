"""`dlindex index` and `dlindex stats --slow` through the CLI runner."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlindex.cli import app

from .advisor_workload import copy_catalog, make_catalog, pin_logged_durations, run_workload, snapshot
from .conftest import rows


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = make_catalog(tmp_path_factory.mktemp("cli-index") / "logged.db", {"planted_wh": "width, height"})
    run_workload(path)
    return path


@pytest.fixture
def db(logged: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr("dlindex.advisor.suggest.RUNS", 2)  # keep the suite fast
    monkeypatch.setenv("DLINDEX_CACHE_DIR", str(tmp_path / "cache"))  # where --suggest keeps its advice for --apply
    return copy_catalog(logged, tmp_path / "catalog.db")


def index(runner: CliRunner, db: Path, *args: str, input: str | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, ["index", *args, "--db", str(db)], input=input)
    return result.exit_code, result.stdout, result.stderr


def test_suggest_prints_verified_suggestions_and_changes_nothing(runner: CliRunner, db: Path) -> None:
    before = snapshot(db)
    code, out, err = index(runner, db, "--suggest")
    assert (code, err) == (0, ""), err
    assert "CREATE INDEX idx_dlindex_image_metadata_label_id_" in out and "WHERE processed = 1" in out
    assert "planted_wh on image_metadata: no logged statement's plan uses it" in out
    assert "ORDER BY random()" in out
    assert snapshot(db) == before


def test_json_is_one_object(runner: CliRunner, db: Path) -> None:
    code, out, _ = index(runner, db, "--json", "--top", "5")
    data = json.loads(out)
    assert code == 0 and set(data) >= {"suggestions", "unused", "redundant", "hints", "rejected", "skipped", "workload"}
    first = data["suggestions"][0]
    assert set(first) >= {
        "sql",
        "served",
        "before_ms",
        "after_ms",
        "speedup",
        "size_bytes",
        "insert_10k_ms",
        "update_10k_ms",
    }
    assert len(data["workload"]["hot"]) <= 5


def test_log_files_are_read_and_hostile_lines_reported(runner: CliRunner, db: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.sql"
    trace.write_text("SELECT count(*) FROM image_metadata WHERE processing_status = 'failed' -- duration_ms=2\n"
                     "DROP TABLE image_metadata\nPRAGMA writable_schema = 1\nSELECT 1; DELETE FROM labels\n")  # fmt: skip
    before = snapshot(db)
    code, _out, err = index(runner, db, "--log", str(trace), "--log", "-", input="garbage here\n")
    assert code == 0, err
    assert f"{trace} line 2: skipped: not a read-only SELECT" in err
    assert f"{trace} line 3: skipped: not a read-only SELECT" in err
    assert f"{trace} line 4: skipped: not a read-only SELECT (several statements)" in err
    assert "- line 1: skipped: not a read-only SELECT" in err
    assert snapshot(db) == before


def test_apply_twice_then_revert(runner: CliRunner, db: Path) -> None:
    code, out, err = index(runner, db, "--apply")
    assert code == 0, err
    created = [line.split()[1] for line in out.splitlines() if line.startswith("created ")]
    assert created and "undo with: dlindex index --revert" in out
    code, out, _ = index(runner, db, "--apply")
    assert code == 0 and "nothing to change: no new index to create, none to drop" in out
    code, out, _ = index(runner, db, "--revert", "--json")
    assert code == 0 and sorted(json.loads(out)["dropped"]) == sorted(created)
    assert not rows(db, "SELECT name FROM sqlite_master WHERE name LIKE 'idx_dlindex_%'")
    code, out, _ = index(runner, db, "--revert")
    assert (code, out.strip()) == (0, "nothing to revert")


def test_drop_unused_needs_yes_without_a_terminal(runner: CliRunner, db: Path) -> None:
    code, _, err = index(runner, db, "--drop-unused")
    assert code == 2 and "--yes" in err
    code, _, err = index(runner, db, "--revert", "--apply")
    assert code == 2


def test_drop_unused_with_yes(runner: CliRunner, db: Path) -> None:
    conn = __import__("sqlite3").connect(db)
    conn.execute("CREATE INDEX idx_dlindex_image_metadata_height_0 ON image_metadata (height)")
    conn.commit()
    conn.close()
    code, out, err = index(runner, db, "--drop-unused", "--yes")
    assert code == 0, err
    assert "dropped idx_dlindex_image_metadata_height_0" in out
    assert rows(db, "SELECT name FROM sqlite_master WHERE name = 'planted_wh'")  # not ours: kept


def test_list(runner: CliRunner, db: Path) -> None:
    code, out, _ = index(runner, db, "--list", "--json")
    usage = {u["name"]: u for u in json.loads(out)["indexes"]}
    assert code == 0 and usage["planted_wh"]["calls"] == 0 and usage["planted_wh"]["origin"] == "manual"
    code, out, _ = index(runner, db, "--list")
    assert code == 0 and "planted_wh" in out and "never" in out


def test_missing_catalog_and_unreadable_log(runner: CliRunner, tmp_path: Path) -> None:
    code, _, err = index(runner, tmp_path / "none.db")
    assert code == 1 and err.startswith("Error: no catalog at")
    db = make_catalog(tmp_path / "empty-log.db")
    code, _, err = index(runner, db, "--log", str(tmp_path / "missing.sql"))
    assert code == 1 and "Error: cannot read" in err


def test_stats_slow_shows_plans_and_lock_waits(runner: CliRunner, db: Path) -> None:
    pin_logged_durations(db)  # which statements are slowest, however loaded the machine was
    with sqlite3.connect(db) as conn:  # and no lock wait: on a busy machine a BEGIN can take over 1 ms
        conn.execute("DELETE FROM query_log WHERE lock_wait_ms IS NOT NULL")
    conn.close()
    result = runner.invoke(app, ["stats", "--slow", "--top", "2", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("1. ") and "SCAN image_metadata" in result.stdout
    assert "lock waits: 0 write transaction(s)" in result.stdout
    result = runner.invoke(app, ["stats", "--slow", "--json", "--db", str(db)])
    data = json.loads(result.stdout)
    assert set(data) == {"queries", "lock_wait_transactions", "lock_wait_ms"} and data["queries"][0]["plan"]
