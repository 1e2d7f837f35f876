"""`dlindex stats` through the CLI: --json and human summaries, a missing catalog, whole lines in a pipe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlindex.cli import app

from .backends import ON_BOTH_BACKENDS, SQLITE_ONLY
from .synthetic import Row, make_catalog

pytestmark = ON_BOTH_BACKENDS

ROOT = "/data/" + "/".join(f"level_{i:02d}" for i in range(12))  # a 107-character root


def _catalog(tmp_path: Path) -> Path:
    labels = [f"n0{i:07d}_a_rather_long_class_name" for i in range(8)]
    return make_catalog(
        tmp_path / "s.db", [Row(label) for n, label in enumerate(labels) for _ in range(n + 1)], root=ROOT
    )


def test_piped_stats_lines_are_not_wrapped(runner: CliRunner, tmp_path: Path) -> None:
    db = _catalog(tmp_path)
    result = runner.invoke(app, ["stats", "--db", str(db), "--top", "8"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    largest = next(line for line in lines if line.startswith("  largest:"))
    assert largest.count("_a_rather_long_class_name") == 8 and len(largest) > 80
    assert f"roots {ROOT}" in lines
    assert all(line.split()[0] in {"images", "processed", "processing", "labels", "largest:", "smallest:", "image",
                                   "indexes", "roots", "last"} for line in lines), lines  # fmt: skip


def test_stats_through_a_real_pipe(tmp_path: Path) -> None:
    db = _catalog(tmp_path)
    done = subprocess.run([sys.executable, "-m", "dlindex", "stats", "--db", str(db), "--top", "8"],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "COLUMNS": "80",
                          "PYTHONPATH": str(Path(__file__).resolve().parents[1])})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert any(len(line) > 80 for line in done.stdout.splitlines())
    assert f"roots {ROOT}\n" in done.stdout


def test_quiet_silences_import_summaries(runner: CliRunner, tmp_path: Path) -> None:
    db = _catalog(tmp_path)
    trace = tmp_path / "trace.sql"
    trace.write_text("SELECT id FROM image_metadata WHERE label_id = 1;\nVACUUM;\n")
    quiet = runner.invoke(app, ["log", "import", str(trace), "--db", str(db), "-q"])
    assert (quiet.exit_code, quiet.stdout) == (0, "")
    assert quiet.stderr.startswith("line 2: skipped")  # warnings still print
    loud = runner.invoke(app, ["log", "import", str(trace), "--db", str(db)])
    assert loud.stdout.startswith("imported 1 statements")
    vectors = tmp_path / "v.jsonl"
    vectors.write_text("".join(f'{{"id": {i}, "vector": [1, {i}]}}\n' for i in range(1, 37)))
    quiet = runner.invoke(app, ["features", "import", "--type", "t", str(vectors), "--db", str(db), "-q"])
    assert (quiet.exit_code, quiet.stdout, quiet.stderr) == (0, "", ""), quiet.output


@SQLITE_ONLY
def test_stats_without_catalog(runner: CliRunner, db_path: Path) -> None:
    result = runner.invoke(app, ["stats", "--db", str(db_path)])
    assert result.exit_code == 1
    assert "no catalog at" in result.stderr and "dlindex scan" in result.stderr
    assert not db_path.exists()


def test_stats_json(runner: CliRunner, scanned_db: Path) -> None:
    result = runner.invoke(app, ["stats", "--db", str(scanned_db), "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    assert stats["images"] == 7
    assert stats["by_status"] == {"ok": 6, "corrupt": 1, "missing": 0}
    assert (stats["processed"], stats["unprocessed"], stats["labels"]) == (0, 7, 2)
    assert stats["largest_labels"][0] == {"label": "cat", "images": 3}
    assert stats["last_scans"][0]["new"] == 7
    assert stats["catalog_bytes"] > 0
    assert stats["indexes"] == []


def test_stats_human(runner: CliRunner, scanned_db: Path) -> None:
    result = runner.invoke(app, ["stats", "--db", str(scanned_db)])
    assert result.exit_code == 0
    assert "images 7" in result.stdout


def test_a_big_catalog_estimates_from_a_sample_and_exact_counts(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [Row("cat", processed=i % 2) for i in range(300)] + [Row("dog", status="corrupt") for _ in range(100)]
    db = make_catalog(tmp_path / "e.db", rows)
    exact = json.loads(runner.invoke(app, ["stats", "--db", str(db), "--json"]).stdout)
    assert (exact["estimated"], exact["images"], exact["by_status"]["ok"], exact["processed"]) == (False, 400, 300, 150)
    monkeypatch.setattr("dlindex.stats.ESTIMATE_ABOVE", 100)
    monkeypatch.setattr("dlindex.stats.SAMPLE_ROWS", 160)  # ten runs of 16 ids
    sampled = json.loads(runner.invoke(app, ["stats", "--db", str(db), "--json"]).stdout)
    assert sampled["estimated"] and sampled["sampled_rows"] == 160 and sampled["smallest_labels"] == []
    assert sampled["images"] == 400  # ids 1..400 all present: every probe hits
    assert 200 < sampled["by_status"]["ok"] < 400 and 0 < sampled["by_status"]["corrupt"] < 200
    text = runner.invoke(app, ["stats", "--db", str(db)]).stdout
    assert text.startswith("images ~400 (ok ~") and "~ estimated from 160 sampled rows; --exact" in text
    again = json.loads(runner.invoke(app, ["stats", "--db", str(db), "--json", "--exact"]).stdout)
    assert {**again, "catalog_bytes": 0} == {**exact, "catalog_bytes": 0}  # the query log grew
