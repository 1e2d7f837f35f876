"""`dlindex mark` through the CLI: stdin, files, NUL records, --json, --strict, errors, real pipelines."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from dlindex.cli import app

from .backends import ON_BOTH_BACKENDS
from .conftest import processed_ids, rows
from .synthetic import ROOT

pytestmark = ON_BOTH_BACKENDS

DLINDEX = f"{shlex.quote(sys.executable)} -m dlindex"


def test_cli_mark_stdin(runner: CliRunner, cats: Path) -> None:
    result = runner.invoke(app, ["mark", "--processed", "--db", str(cats)], input="1\n2\n")
    assert result.exit_code == 0, result.output
    assert "matched 2  updated 2  unknown 0" in result.stdout
    assert result.stderr == ""
    assert processed_ids(cats) == [1, 2]


def test_cli_mark_json_and_strict(runner: CliRunner, cats: Path) -> None:
    result = runner.invoke(
        app, ["mark", "-", "--processing-status", "queued", "--json", "--strict", "--db", str(cats)], input="3\n42\n"
    )
    assert result.exit_code == 3
    data = json.loads(result.stdout)
    assert {k: data[k] for k in ("inputs", "matched", "updated", "unknown", "unknown_examples")} == {
        "inputs": 2, "matched": 1, "updated": 1, "unknown": 1, "unknown_examples": ["42"],
    }  # fmt: skip
    assert "1 not in the catalog: 42" in result.stderr
    assert rows(cats, "SELECT processing_status FROM image_metadata WHERE id = 3") == [("queued",)]
    relaxed = runner.invoke(app, ["mark", "-", "--processed", "--db", str(cats)], input="42\n")
    assert relaxed.exit_code == 0


def test_cli_mark_file_and_nul_separated(runner: CliRunner, cats: Path, tmp_path: Path) -> None:
    listing = tmp_path / "paths.txt"
    listing.write_bytes(f"{ROOT}/cat/0001.png\0dog/0002.png\0".encode())
    result = runner.invoke(app, ["mark", str(listing), "--by", "path", "-0", "--processed", "--db", str(cats)])
    assert result.exit_code == 0, result.output
    assert processed_ids(cats) == [1, 6]


def test_cli_mark_errors(runner: CliRunner, cats: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["mark", "-", "--processed", "--db", str(cats)], input="1\nfoo\n")
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "Error: line 2: 'foo' is not a sample id (for paths use --by path); nothing was changed"
    ]
    assert processed_ids(cats) == []
    missing = runner.invoke(app, ["mark", str(tmp_path / "nope.txt"), "--processed", "--db", str(cats)])
    assert missing.exit_code == 1 and missing.stderr.startswith("Error: cannot read")
    nothing = runner.invoke(app, ["mark", "--db", str(cats)], input="1\n")
    assert nothing.exit_code == 2
    no_db = runner.invoke(app, ["mark", "--processed", "--db", str(tmp_path / "none.db")], input="1\n")
    assert no_db.exit_code == 1 and no_db.stderr.startswith("Error: no catalog at")
    assert "Traceback" not in result.output + missing.output + no_db.output


def _shell(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, shell=True, capture_output=True, text=True, timeout=120, executable="/bin/bash")


def test_pipeline_query_jsonl_into_mark(cats: Path) -> None:
    db = shlex.quote(str(cats))
    done = _shell(
        f"set -o pipefail; {DLINDEX} query --db {db} --label cat --format jsonl | {DLINDEX} mark --processed - --db {db}"
    )
    assert done.returncode == 0, done.stderr
    assert "matched 4  updated 4  unknown 0" in done.stdout
    assert processed_ids(cats) == [1, 2, 3, 4]
    left = _shell(f"set -o pipefail; {DLINDEX} query --db {db} --unprocessed --format jsonl | wc -l")
    assert left.stdout.strip() == "4"


def test_pipeline_paths_and_nul_paths_into_mark(cats: Path) -> None:
    db = shlex.quote(str(cats))
    plain = _shell(f"set -o pipefail; {DLINDEX} query --db {db} --label dog --limit 2 --format paths"
                   f" | {DLINDEX} mark --by path --processing-status completed - --db {db} --json")  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout)["updated"] == 2
    nul = _shell(
        f"set -o pipefail; {DLINDEX} query --db {db} --label cat -0 | {DLINDEX} mark -0 --by path --processed --db {db}"
    )
    assert nul.returncode == 0, nul.stderr
    assert processed_ids(cats) == [1, 2, 3, 4]
    assert rows(cats, "SELECT id FROM image_metadata WHERE processing_status = 'completed' ORDER BY id") == [(5,), (6,)]
