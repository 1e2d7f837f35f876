"""`dlindex export` through the CLI: options, output, errors and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dlindex.cli import app
from dlindex.export import load_index
from dlindex.exported.index import listed_shards

from .backends import ON_BOTH_BACKENDS
from .conftest import invoke, make_png

pytestmark = ON_BOTH_BACKENDS


def test_default_is_one_jsonl_manifest(runner: CliRunner, scanned_db: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", str(tmp_path / "o"), "--db", str(scanned_db), "--quiet"])
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", ""), result.output
    assert [s["file"] for s in listed_shards(load_index(tmp_path / "o"))] == ["train-000000.jsonl"]


def test_json_summary(runner: CliRunner, scanned_db: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, [
        "export", str(tmp_path / "o"), "--db", str(scanned_db), "--format", "wds", "--split", "train=0.5,val=0.5",
        "--world-size", "2", "--shuffle", "--seed", "4", "--shard-size", "1", "--json", "--quiet",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["format"] == "wds" and summary["selected"] == 6
    assert sum(summary["splits"].values()) == summary["samples"] == 6 + summary["padded"]
    assert summary["shards"] == summary["samples"]


def test_filters_are_the_query_options(runner: CliRunner, scanned_db: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, [
        "export", str(tmp_path / "o"), "--db", str(scanned_db), "-l", "dog", "--min-width", "17", "--json", "-q",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["samples"] == 2
    assert load_index(tmp_path / "o")["labels"] == {"0": "dog"}


def test_human_summary_on_stdout(runner: CliRunner, scanned_db: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", str(tmp_path / "o"), "--db", str(scanned_db), "-f", "csv"])
    assert result.exit_code == 0, result.output
    assert "exported 6 samples (csv)" in result.stdout


def test_verify_ok_and_modified(runner: CliRunner, scanned_db: Path, image_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert invoke(runner, "export", str(out), "--db", str(scanned_db), "-q").exit_code == 0
    ok = runner.invoke(app, ["export", "--verify", str(out), "--json", "-q"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["ok"] is True, ok.output
    make_png(image_tree / "cat" / "001.png", (5, 5), (1, 1, 1))
    bad = runner.invoke(app, ["export", "--verify", str(out), "-q"])
    assert bad.exit_code == 1
    lines = bad.stderr.splitlines()
    assert "cat/001.png" in lines[0] and lines[-1] == f"Error: 1 problem(s) in {out}"


def test_verify_of_a_folder_that_is_no_export(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", "--verify", str(tmp_path)])
    assert result.exit_code == 1 and result.stderr == f"Error: {tmp_path} is not a dlindex export: no index.json\n"


def test_bad_input_is_one_error_line_and_writes_nothing(runner: CliRunner, scanned_db: Path, tmp_path: Path) -> None:
    cases = [
        (["--split", "train=0.9"], 1, "Error: split fractions must add up to 1, not 0.9\n"),
        (["--label", "cta"], 1, "Error: unknown label 'cta'; did you mean 'cat'?\n"),
        (["--shard-bytes", "big"], 1, None),
        (["--features", "clip"], 1, None),
        (["--min-width", "999"], 1, "Error: no samples match the filters; nothing exported\n"),
    ]
    for args, code, stderr in cases:
        result = runner.invoke(app, ["export", str(tmp_path / "o"), "--db", str(scanned_db), *args])
        assert result.exit_code == code, (args, result.output)
        assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1, result.stderr
        if stderr is not None:
            assert result.stderr == stderr
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith((".o", "o"))] == []


def test_usage_errors_exit_2(runner: CliRunner, scanned_db: Path, tmp_path: Path) -> None:
    for args in (["--shard-size", "2", "--shard-bytes", "1MB"], ["--format", "zip"], ["--world-size", "0"]):
        result = runner.invoke(app, ["export", str(tmp_path / "o"), "--db", str(scanned_db), *args])
        assert result.exit_code == 2, (args, result.output)


def test_no_catalog(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", str(tmp_path / "o"), "--db", str(tmp_path / "none.db")])
    assert result.exit_code == 1 and result.stderr.startswith("Error: no catalog at")
    assert not (tmp_path / "o").exists()


def test_existing_output_needs_overwrite(runner: CliRunner, scanned_db: Path, tmp_path: Path) -> None:
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["export", str(tmp_path / "o"), "--db", str(scanned_db)])
    assert result.exit_code == 1 and "--overwrite" in result.stderr
    assert (tmp_path / "o" / "keep.txt").read_text() == "mine"
    # --overwrite replaces only an export: a folder of the user's own files is refused, kept.
    result = runner.invoke(app, ["export", str(tmp_path / "o"), "--db", str(scanned_db), "--overwrite", "-q"])
    assert result.exit_code == 1 and "it has no index.json, so it is not a dlindex export" in result.stderr
    assert (tmp_path / "o" / "keep.txt").read_text() == "mine"
    (tmp_path / "o" / "keep.txt").unlink()
    assert runner.invoke(app, ["export", str(tmp_path / "o"), "--db", str(scanned_db), "-q"]).exit_code == 0
    result = runner.invoke(
        app, ["export", str(tmp_path / "o"), "--db", str(scanned_db), "--overwrite", "-q", "-f", "csv"]
    )
    assert result.exit_code == 0 and sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "index.json",
        "train-000000.csv",
    ]
