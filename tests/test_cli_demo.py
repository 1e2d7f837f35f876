"""`dlindex demo` through the CLI: the whole tour runs end to end."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from dlindex.cli import app


def test_demo_runs_end_to_end(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", str(tmp_path / "demo"), "--images", "60"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "demo" / "catalog.db").exists()
    assert "unchanged 64" in result.stdout  # the rescan step: 60 images + 4 odd names
