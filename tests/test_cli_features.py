"""`dlindex features ...` through the CLI: data on stdout, messages on stderr, exit codes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from dlindex.cli import app

from .backends import ON_BOTH_BACKENDS
from .conftest import DLINDEX, rows

pytestmark = ON_BOTH_BACKENDS


def invoke(runner: CliRunner, db: Path, *args: str, input: str | None = None):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["features", *args, "--db", str(db)], input=input)


def test_compute_json_summary_and_no_progress_off_a_terminal(runner: CliRunner, scanned_db: Path) -> None:
    result = invoke(runner, scanned_db, "compute", "--type", "dhash", "--workers", "1", "--json")
    assert result.exit_code == 0 and result.stderr == "", result.output
    summary = json.loads(result.stdout)
    assert {k: summary[k] for k in ("feature_type", "extractor", "dim", "dtype", "selected", "computed", "failed")} == {
        "feature_type": "dhash", "extractor": "dhash", "dim": 64, "dtype": "float32", "selected": 6, "computed": 6, "failed": 0,
    }  # fmt: skip
    human = invoke(runner, scanned_db, "compute", "--type", "dhash", "--workers", "1")
    assert "already done 6" in human.stdout and human.stderr == ""


def test_compute_with_filters_and_strict(runner: CliRunner, scanned_db: Path) -> None:
    result = invoke(runner, scanned_db, "compute", "--type", "colorhist", "-w", "1", "--status", "corrupt", "--strict")
    assert result.exit_code == 3
    assert "failed: id" in result.stderr and "UnidentifiedImageError" in result.stderr
    label = invoke(
        runner, scanned_db, "compute", "--type", "colorhist", "-w", "1", "--label", "cat", "--limit", "2", "--json"
    )
    assert json.loads(label.stdout)["computed"] == 2


def test_compute_errors_are_one_line(runner: CliRunner, scanned_db: Path) -> None:
    result = invoke(runner, scanned_db, "compute", "--type", "mine", "--extractor", "not_a_module_q:fn")
    assert result.exit_code == 1
    assert (
        result.stderr.startswith("Error: cannot import extractor 'not_a_module_q:fn'")
        and result.stderr.count("\n") == 1
    )
    bad = invoke(runner, scanned_db, "compute", "--type", "no-good", "--extractor", "colorhist")
    assert bad.exit_code == 1 and bad.stderr.startswith("Error: invalid feature type name 'no-good'")
    dtype = invoke(runner, scanned_db, "compute", "--type", "x", "--extractor", "colorhist", "--dtype", "float64")
    assert dtype.exit_code == 2
    assert rows(scanned_db, "SELECT count(*) FROM feature_types") == [(0,)]


def test_import_export_list_show_drop(runner: CliRunner, scanned_db: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "v.npy", np.arange(12, dtype=np.float64).reshape(6, 2))
    ids = [int(i) for (i,) in rows(scanned_db, "SELECT id FROM image_metadata WHERE status = 'ok' ORDER BY id")]
    (tmp_path / "ids.txt").write_text("\n".join(map(str, ids)) + "\n")
    result = invoke(
        runner,
        scanned_db,
        "import",
        str(tmp_path / "v.npy"),
        "--type",
        "emb",
        "--ids",
        str(tmp_path / "ids.txt"),
        "--json",
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["imported"] == 6
    again = invoke(
        runner,
        scanned_db,
        "import",
        str(tmp_path / "v.npy"),
        "--type",
        "emb",
        "--ids",
        str(tmp_path / "ids.txt"),
        "--concurrent",
        "--json",
    )
    assert (json.loads(again.stdout)["imported"], json.loads(again.stdout)["journal"]) == (6, "wal")
    listed = invoke(runner, scanned_db, "list", "--format", "jsonl")
    (entry,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert (entry["name"], entry["dim"], entry["vectors"], entry["extractor"]) == ("emb", 2, 6, "import")
    shown = invoke(runner, scanned_db, "show", str(ids[1]), "--json")
    assert json.loads(shown.stdout)["vectors"]["emb"]["vector"] == [2.0, 3.0]
    text = invoke(runner, scanned_db, "show", "cat/001.png")
    assert text.exit_code == 0 and "emb: dim 2 float32" in text.stdout
    out = tmp_path / "out.npz"
    exported = invoke(runner, scanned_db, "export", str(out), "--type", "emb")
    assert exported.exit_code == 0 and "wrote 6 vectors" in exported.stdout
    with np.load(out) as data:
        assert data["ids"].tolist() == ids and data["vectors"][1].tolist() == [2.0, 3.0]
    refused = invoke(runner, scanned_db, "compute", "--type", "emb")
    assert refused.exit_code == 1 and "was imported; it has no extractor" in refused.stderr
    dropped = invoke(runner, scanned_db, "drop", "--type", "emb", "--json")
    assert json.loads(dropped.stdout) == {"feature_type": "emb", "vectors": 6, "failed": 0}
    gone = invoke(runner, scanned_db, "drop", "--type", "emb")
    assert (
        gone.exit_code == 1
        and gone.stderr
        == "Error: unknown feature type 'emb': the catalog has none yet; run dlindex features compute --type emb --extractor colorhist (or features import)\n"
    )


def test_import_bad_input_exit_1(runner: CliRunner, scanned_db: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "v.npz", ids=[1, 2], vectors=np.array([[1.0, np.nan], [0, 0]]))
    result = invoke(runner, scanned_db, "import", str(tmp_path / "v.npz"), "--type", "emb")
    assert result.exit_code == 1 and "has NaN or infinite values" in result.stderr and "Traceback" not in result.output
    assert rows(scanned_db, "SELECT count(*) FROM image_features") == [(0,)]


def test_an_import_of_unknown_ids_is_one_error_line(cats: Path, tmp_path: Path) -> None:
    """On a server catalog the refused bulk insert ends a psycopg pipeline, which logs what it
    ignored: in a real process (pytest's own log handlers would swallow it) that must not reach
    stderr beside the one error line."""
    np.savez(tmp_path / "u.npz", ids=np.array([1, 2, 99, 100]), vectors=np.ones((4, 3), np.float32))
    done = subprocess.run([*DLINDEX, "features", "import", str(tmp_path / "u.npz"), "--type", "u", "--db", str(cats)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"Error: {tmp_path / 'u.npz'}: 2 unknown id(s): 99, 100; nothing was imported"]
    assert rows(cats, "SELECT count(*) FROM feature_types WHERE name = 'u'") == [(0,)]


def test_export_takes_no_log_like_every_command(runner: CliRunner, scanned_db: Path, tmp_path: Path) -> None:
    assert invoke(runner, scanned_db, "compute", "--type", "dhash", "-w", "1", "-q").exit_code == 0
    before = rows(scanned_db, "SELECT count(*), coalesce(sum(calls), 0) FROM query_log")
    quiet = invoke(runner, scanned_db, "export", str(tmp_path / "a.npz"), "--type", "dhash", "--no-log")
    assert (quiet.exit_code, quiet.stderr) == (0, ""), quiet.output
    assert rows(scanned_db, "SELECT count(*), coalesce(sum(calls), 0) FROM query_log") == before
