"""`dlindex leaks`: formats, the summary on stderr, --fail-on-leak exit codes, errors."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from typer.testing import CliRunner

from .backends import ON_BOTH_BACKENDS
from .conftest import export, invoke, one_error_line
from .test_export_leaks import RULE, leaky  # noqa: F401  (the module fixture)

pytestmark = ON_BOTH_BACKENDS


def test_pairs_on_stdout_summary_on_stderr(runner: CliRunner, leaky: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "out"
    export(leaky, out, format="wds", split=RULE)
    db = str(leaky)
    result = invoke(runner, "leaks", str(out), "--type", "dhash", "--format", "jsonl", "--db", db)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows and all(r["split_a"] != r["split_b"] and r["kind"] == "near" for r in rows)
    assert set(rows[0]) == {"a", "b", "split_a", "split_b", "distance", "kind", "path_a", "path_b"}
    assert f"train/val: {len(rows)} pair(s) (0 exact, {len(rows)} near)" in result.stderr
    rule = invoke(runner, "leaks", "--split", RULE, "--type", "dhash", "--format", "csv", "--db", db)
    assert list(csv.DictReader(io.StringIO(rule.stdout))) == [{k: str(v) for k, v in r.items()} for r in rows]
    failed = invoke(runner, "leaks", str(out), "--type", "dhash", "--fail-on-leak", "--db", db)
    assert failed.exit_code == 1 and "leaking pair(s) (--fail-on-leak)" in failed.stderr
    clean = invoke(runner, "leaks", str(out), "--fail-on-leak", "--format", "jsonl", "--db", db)
    assert (clean.exit_code, clean.stdout) == (0, "")


def test_errors(runner: CliRunner, leaky: Path, tmp_path: Path) -> None:  # noqa: F811
    db = str(leaky)
    assert "not a dlindex export" in one_error_line(invoke(runner, "leaks", str(tmp_path), "--db", db))
    assert "use --max-distance" in one_error_line(
        invoke(runner, "leaks", "--split", RULE, "--type", "dhash", "--threshold", "0.1", "--db", db)
    )
    assert "must add up to 1" in one_error_line(invoke(runner, "leaks", "--split", "train=0.5", "--db", db))
    for args in (
        ["--db", db],
        [str(tmp_path), "--split", RULE, "--db", db],
        [str(tmp_path), "--label", "c0", "--db", db],
    ):
        assert invoke(runner, "leaks", *args).exit_code == 2
