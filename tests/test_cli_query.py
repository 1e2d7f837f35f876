"""`dlindex query` through the CLI: formats, options, errors and exit codes."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from dlindex.cli import _output, app

from .backends import ON_BOTH_BACKENDS, on_postgresql
from .conftest import rows
from .synthetic import ROOT, Row, make_catalog

pytestmark = ON_BOTH_BACKENDS


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return make_catalog(
        tmp_path / "c.db",
        [
            Row("cat", processed=1, width=64),
            Row("cat"),
            Row("dog", processed=1),
            Row("dog", status="corrupt"),
            Row("bird"),
        ],
    )


def test_jsonl_is_the_default_off_a_terminal(runner: CliRunner, db: Path) -> None:
    result = runner.invoke(app, ["query", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["id"] for r in lines] == [1, 2, 3, 5]
    assert lines[0] == {
        "id": 1, "path": f"{ROOT}/cat/0001.png", "label": "cat", "width": 64, "height": 32, "status": "ok",
        "processed": 1, "processing_status": None, "created_at": lines[0]["created_at"],
    }  # fmt: skip


def test_every_format_has_the_same_keys(runner: CliRunner, db: Path) -> None:
    columns = "id,label,file_path,processed,processing_status"
    outputs = {}
    for fmt in ("jsonl", "csv", "tsv"):
        result = runner.invoke(app, ["query", "--db", str(db), "--columns", columns, "--format", fmt])
        assert result.exit_code == 0, result.output
        outputs[fmt] = result.stdout
    jsonl = [json.loads(line) for line in outputs["jsonl"].splitlines()]
    as_csv = list(csv.DictReader(io.StringIO(outputs["csv"])))
    as_tsv = list(csv.DictReader(io.StringIO(outputs["tsv"]), delimiter="\t"))
    assert list(jsonl[0]) == list(as_csv[0]) == list(as_tsv[0]) == columns.split(",")
    assert [str(r["id"]) for r in jsonl] == [r["id"] for r in as_csv] == [r["id"] for r in as_tsv]
    assert as_csv[1]["processing_status"] == ""  # NULL is an empty field


def test_table_format(runner: CliRunner, db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    monkeypatch.setattr(_output, "stdout_console", console)
    assert _output.resolve_format(None) is _output.OutputFormat.table
    result = runner.invoke(app, ["query", "--db", str(db), "--columns", "id,label", "--label", "dog"])
    assert result.exit_code == 0, result.output
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "label" in text and "dog" in text and "cat" not in text


def test_paths_and_nul(runner: CliRunner, db: Path) -> None:
    result = runner.invoke(app, ["query", "--db", str(db), "--format", "paths", "--label", "cat"])
    assert result.stdout == f"{ROOT}/cat/0001.png\n{ROOT}/cat/0002.png\n"
    nul = runner.invoke(app, ["query", "--db", str(db), "-0", "--label", "cat"])
    assert nul.stdout_bytes == f"{ROOT}/cat/0001.png\0{ROOT}/cat/0002.png\0".encode()
    bad = runner.invoke(app, ["query", "--db", str(db), "-0", "--format", "csv"])
    assert bad.exit_code == 2


def test_filters_from_the_command_line(runner: CliRunner, db: Path) -> None:
    def ids(*args: str) -> list[int]:
        result = runner.invoke(app, ["query", "--db", str(db), "--columns", "id", *args])
        assert result.exit_code == 0, result.output
        return [json.loads(line)["id"] for line in result.stdout.splitlines()]

    assert ids("--label", "cat", "--label", "bird") == [1, 2, 5]
    assert ids("--status", "corrupt") == [4]
    assert ids("--status", "ok", "--status", "corrupt", "--processed") == [1, 3]
    assert ids("--unprocessed") == [2, 5]
    assert ids("--min-width", "64") == [1]
    assert ids("--min-height", "33") == []
    assert ids("--since", "7d", "--until", "2h") == [1, 2, 3, 5]
    assert ids("--limit", "2") == [1, 2]
    assert ids("--per-label", "1", "--seed", "3") == ids("--per-label", "1", "--seed", "3", "--no-cache")
    assert len(ids("--per-label", "1")) == 3
    assert sorted(ids("--order", "random", "--seed", "2")) == [1, 2, 3, 5]
    assert ids("--processing-status", "failed") == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--label", "cta"], "Error: unknown label 'cta'; did you mean 'cat'?"),
        (["--columns", "id,size"], "Error: unknown column 'size'; choose from: id, path, root,"),
        (["--columns", "lable"], "Error: unknown column 'lable' (did you mean 'label'?); choose from: id, path,"),
        (
            ["--columns", "id,processing_stat"],
            "Error: unknown column 'processing_stat' (did you mean 'processing_status'?)",
        ),
        (["--since", "3 parsecs"], "Error: --since '3 parsecs' is neither an ISO date-time"),
        (["--since", "2024-05-02", "--until", "2024-05-01"], "Error: empty time range"),
        (["--limit", str(2**64)], "Error: --limit must be at most 9223372036854775807, not 18446744073709551616"),
        (["--offset", str(2**64)], "Error: --offset must be at most 9223372036854775807"),
        (["--per-label", str(2**63)], "Error: --per-label must be at most 9223372036854775807"),
        (["--min-width", "9" * 40], "Error: --min-width must be at most 9223372036854775807"),
        (["--min-height", str(2**63)], "Error: --min-height must be at most"),
        (["--since", "99999999999d"], "Error: --since '99999999999d' is outside the years 1 to 9999"),
        (["--since", "0001-01-01T00:00:00+01:00"], "Error: --since '0001-01-01T00:00:00+01:00' is outside the years"),
        (["--until", "9999-12-31T23:59:59-05:00"], "Error: --until '9999-12-31T23:59:59-05:00' is outside the years"),
        (["--since", "9" * 400 + "d"], "Error: --since '9999"),
    ],
)
def test_bad_input_is_one_line_on_stderr(runner: CliRunner, db: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["query", "--db", str(db), *args])
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), result.stderr


def test_usage_errors_exit_2(runner: CliRunner, db: Path) -> None:
    for args in (["--status", "weird"], ["--per-label", "0"], ["--order", "sideways"], ["--format", "xml"]):
        result = runner.invoke(app, ["query", "--db", str(db), *args])
        assert result.exit_code == 2, args


def test_missing_and_empty_catalogs(runner: CliRunner, tmp_path: Path) -> None:
    missing = runner.invoke(app, ["query", "--db", str(tmp_path / "none.db")])
    assert missing.exit_code == 1 and missing.stderr.startswith("Error: no catalog at")
    empty = make_catalog(tmp_path / "empty.db", [])
    result = runner.invoke(app, ["query", "--db", str(empty), "--per-label", "4"])
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")


def test_explain_prints_sql_params_and_plan(runner: CliRunner, db: Path) -> None:
    result = runner.invoke(app, ["query", "--db", str(db), "--explain", "--label", "dog", "--processed"])
    assert result.exit_code == 0, result.output
    sql, params, *plan = result.stdout.splitlines()
    assert sql.startswith("SELECT ") and sql.endswith(";") and "dog" not in sql
    assert json.loads(params.removeprefix("-- params: ")) == {"label_id": 3}
    if on_postgresql():  # each planner's words
        assert any(line.startswith("-- Seq Scan on image_metadata") for line in plan), plan
    else:
        assert "-- SCAN image_metadata" in plan


def test_no_log_and_no_cache(runner: CliRunner, db: Path) -> None:
    for _ in range(2):
        assert runner.invoke(app, ["query", "--db", str(db), "--per-label", "1", "--no-cache"]).exit_code == 0
    assert rows(db, "SELECT count(*), sum(cached) FROM query_log WHERE sql LIKE '%ROW_NUMBER%'") == [(2, 0)]
    assert runner.invoke(app, ["query", "--db", str(db), "--per-label", "1", "--no-log"]).exit_code == 0
    assert rows(db, "SELECT count(*) FROM query_log WHERE sql LIKE '%ROW_NUMBER%'") == [(2,)]
    assert (
        runner.invoke(app, ["query", "--db", str(db), "--per-label", "1"], env={"DLINDEX_NO_LOG": "1"}).exit_code == 0
    )
    assert rows(db, "SELECT count(*) FROM query_log WHERE sql LIKE '%ROW_NUMBER%'") == [(2,)]


def test_query_into_head_exits_quietly(db: Path) -> None:
    done = subprocess.run(
        f"{sys.executable} -m dlindex query --db {db} --format paths | head -1",
        shell=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.stdout == f"{ROOT}/cat/0001.png\n"
    assert "Traceback" not in done.stderr, done.stderr


def test_offset_pages_through_a_stable_order(runner: CliRunner, db: Path) -> None:
    def ids(*args: str) -> list[int]:
        result = runner.invoke(
            app, ["query", "--db", str(db), "-c", "id", "--status", "ok", "--status", "corrupt", *args]
        )
        assert result.exit_code == 0, result.output
        return [json.loads(line)["id"] for line in result.stdout.splitlines()]

    assert ids() == [1, 2, 3, 4, 5]
    assert ids("--offset", "3") == [4, 5]
    assert ids("--offset", "1", "--limit", "2") == [2, 3]
    assert ids("--offset", "9") == []
    pages = [ids("--order", "random", "--seed", "3", "--limit", "2", "--offset", str(k)) for k in (0, 2, 4)]
    assert [i for page in pages for i in page] == ids("--order", "random", "--seed", "3")


def test_out_of_range_sample_ids_are_one_line(runner: CliRunner, db: Path) -> None:
    for args, input in ((["similar", str(2**64), "--type", "x"], None), (["similar", "--ids", "-", "--type", "x"], f"1\n{2**64}\n"),
                        (["features", "show", "9" * 30], None)):  # fmt: skip
        result = runner.invoke(app, [*args, "--db", str(db)], input=input)
        assert result.exit_code == 1, result.output
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: "), result.stderr
        assert "9223372036854775807" in result.stderr or "'18446744073709551616' is not a sample id" in result.stderr
