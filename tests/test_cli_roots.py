"""`dlindex roots list|move` through the CLI: rows, --json, errors and exit codes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from typer.testing import CliRunner

from dlindex.cli import app

from .backends import ON_BOTH_BACKENDS

pytestmark = ON_BOTH_BACKENDS


def test_list_then_move_and_errors(runner: CliRunner, scanned_db: Path, image_tree: Path, tmp_path: Path) -> None:
    listed = runner.invoke(app, ["roots", "list", "--format", "jsonl", "--db", str(scanned_db)])
    assert listed.exit_code == 0, listed.output
    assert [json.loads(line) for line in listed.stdout.splitlines()] == [
        {"id": 1, "path": str(image_tree), "images": 7, "ok": 6, "exists": True}
    ]
    new = tmp_path / "new"
    os.rename(image_tree, new)
    moved = runner.invoke(app, ["roots", "move", str(image_tree), str(new), "--json", "--db", str(scanned_db)])
    assert moved.exit_code == 0, moved.output
    assert json.loads(moved.stdout) == {"id": 1, "old": str(image_tree), "new": str(new), "checked": 6}
    bad = runner.invoke(app, ["roots", "move", str(new), str(tmp_path / "gone"), "--db", str(scanned_db)])
    assert bad.exit_code == 1 and bad.stderr.startswith("Error: ") and len(bad.stderr.splitlines()) == 1
    assert runner.invoke(app, ["roots", "move", "1", str(new), "--check", "-1", "--db", str(scanned_db)]).exit_code == 2
