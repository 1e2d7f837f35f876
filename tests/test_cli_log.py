"""`dlindex log show|import|clear` through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlindex.cli import app

from .backends import ON_BOTH_BACKENDS
from .conftest import rows
from .synthetic import Row, make_catalog

pytestmark = ON_BOTH_BACKENDS


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return make_catalog(tmp_path / "c.db", [Row("cat", processed=1), Row("cat"), Row("dog"), Row("bird")])


def test_log_show_import_clear(runner: CliRunner, db: Path, tmp_path: Path) -> None:
    assert runner.invoke(app, ["query", "--db", str(db), "--label", "cat"]).exit_code == 0
    assert runner.invoke(app, ["mark", "--processed", "--db", str(db)], input="2\n").exit_code == 0
    trace = tmp_path / "trace.sql"
    trace.write_text("SELECT id FROM image_metadata WHERE processed = 1; -- duration_ms=500\nDROP TABLE labels;\n")
    imported = runner.invoke(app, ["log", "import", str(trace), "--db", str(db), "--json"])
    assert imported.exit_code == 0, imported.output
    assert json.loads(imported.stdout) == {
        "imported": 1, "skipped": 1,
        "skipped_lines": [{"line": 2, "reason": "not a single SELECT, INSERT, UPDATE or DELETE statement"}],
    }  # fmt: skip
    assert "line 2: skipped" in imported.stderr
    assert rows(db, "SELECT count(*) FROM labels") == [(3,)]

    shown = runner.invoke(app, ["log", "show", "--db", str(db), "--json", "--top", "50"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    top = data["fingerprints"][0]
    assert top["sql"] == "SELECT id FROM image_metadata WHERE processed = 1" and top["total_ms"] == 500.0
    kinds = {(f["kind"], f["plan"]) for f in data["fingerprints"]}
    assert ("read", "scan") in kinds and ("write", "none") in kinds
    assert any(
        f["sql"].startswith("UPDATE image_metadata SET processed") and f["rows"] == 1 for f in data["fingerprints"]
    )
    human = runner.invoke(app, ["log", "show", "--db", str(db), "--top", "2"])
    assert human.exit_code == 0 and "fingerprint" in human.stdout and "log entries" in human.stdout

    cleared = runner.invoke(app, ["log", "clear", "--db", str(db), "--json"])
    assert cleared.exit_code == 0 and json.loads(cleared.stdout)["removed"] == data["entries"]
    empty = runner.invoke(app, ["log", "show", "--db", str(db)])
    assert "the query log is empty" in empty.stdout


def test_log_import_errors(runner: CliRunner, db: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["log", "import", str(tmp_path / "nope.sql"), "--db", str(db)])
    assert result.exit_code == 1 and result.stderr.startswith("Error: cannot read")
    stdin = runner.invoke(app, ["log", "import", "-", "--db", str(db)], input="SELECT 1\nSELECT 2\n")
    assert stdin.exit_code == 0 and "imported 2 statements" in stdin.stdout
