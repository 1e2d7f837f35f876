"""mark: ids, paths and JSON lines; counts; malformed input; pipelines; concurrent writers."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlindex import Catalog, InputError, mark_samples
from dlindex.cli import app

from .conftest import make_png, rows
from .synthetic import ROOT, Row, balanced, make_catalog

DLINDEX = f"{shlex.quote(sys.executable)} -m dlindex"


@pytest.fixture
def cats(tmp_path: Path) -> Path:
    return balanced(tmp_path / "c.db", {"cat": 4, "dog": 4})  # cat: ids 1-4, dog: ids 5-8


def processed(db: Path) -> list[int]:
    return [int(r[0]) for r in rows(db, "SELECT id FROM image_metadata WHERE processed = 1 ORDER BY id")]


def mark(db: Path, records: list[str], **options: object) -> object:
    with Catalog(db) as catalog:
        return mark_samples(catalog, records, **options)  # type: ignore[arg-type]


def test_mark_ids_counts_matched_updated_unknown(cats: Path) -> None:
    result = mark(cats, ["1\n", " 2 ", "2", "", "99\n", "3"], processed=True)
    assert (result.inputs, result.matched, result.updated, result.unknown) == (5, 3, 3, 1)  # type: ignore[attr-defined]
    assert result.unknown_examples == ("99",)  # type: ignore[attr-defined]
    assert processed(cats) == [1, 2, 3]
    again = mark(cats, ["1", "2"], processed=True)
    assert (again.matched, again.updated) == (2, 0)  # type: ignore[attr-defined]
    undo = mark(cats, ["1", "2"], processed=False)
    assert undo.updated == 2 and processed(cats) == [3]  # type: ignore[attr-defined]


def test_mark_status_and_error(cats: Path) -> None:
    mark(cats, ["5", "6"], processing_status="failed", error="decoder crashed")
    assert rows(cats, "SELECT id, processing_status, error, processed FROM image_metadata WHERE id IN (5, 6, 7)") == [
        (5, "failed", "decoder crashed", 0), (6, "failed", "decoder crashed", 0), (7, None, None, 0),
    ]  # fmt: skip
    result = mark(cats, ["5"], processing_status="completed", processed=True)
    assert result.updated == 1  # type: ignore[attr-defined]
    assert rows(cats, "SELECT processing_status, processed FROM image_metadata WHERE id = 5") == [("completed", 1)]


def test_mark_updates_updated_at_only_for_changed_rows(cats: Path) -> None:
    conn_rows = "SELECT id, updated_at FROM image_metadata WHERE id IN (1, 2) ORDER BY id"
    with Catalog(cats) as catalog, catalog.write_transaction() as conn:
        conn.execute("UPDATE image_metadata SET updated_at = '2000-01-01 00:00:00', processed = 1 WHERE id = 1")
    mark(cats, ["1", "2"], processed=True)
    (one, first), (two, second) = rows(cats, conn_rows)
    assert first == "2000-01-01 00:00:00" and second != "2000-01-01 00:00:00"


def test_mark_by_path_absolute_and_relative(cats: Path) -> None:
    result = mark(
        cats,
        [f"{ROOT}/cat/0001.png\n", "cat/0002.png", "./dog/0001.png", f"{ROOT}/cat/nope.png", "/elsewhere/x.png",
         f"{ROOT}//cat/./0003.png"],
        processed=True, by="path",
    )  # fmt: skip
    assert (result.matched, result.updated, result.unknown) == (4, 4, 2)  # type: ignore[attr-defined]
    assert sorted(result.unknown_examples) == [f"{ROOT}/cat/nope.png", "/elsewhere/x.png"]  # type: ignore[attr-defined]
    assert processed(cats) == [1, 2, 3, 5]


def test_mark_json_lines_with_id_path_or_file_path(cats: Path) -> None:
    lines = [
        json.dumps({"id": 1, "path": "ignored when there is an id"}),
        json.dumps({"path": f"{ROOT}/cat/0002.png", "label": "cat"}),
        json.dumps({"file_path": "dog/0004.png"}),
        "7",
    ]
    result = mark(cats, lines, processed=True)
    assert (result.matched, result.updated, result.unknown) == (4, 4, 0)  # type: ignore[attr-defined]
    assert processed(cats) == [1, 2, 7, 8]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("abc", r"line 3: 'abc' is not a sample id"),
        ("{not json", r"line 3: not valid JSON"),
        ("[1, 2]", r"line 3: '\[1, 2\]' is not a sample id"),
        ('{"id": "4"}', r'line 3: "id" must be an integer'),
        ('{"id": true}', r'line 3: "id" must be an integer'),
        ('{"name": "x"}', r'line 3: a JSON object needs "id", "path" or "file_path"'),
        ('"5"', r"line 3: .* is not a sample id"),
        ("4.5", r"line 3: '4.5' is not a sample id"),
    ],
)
def test_malformed_line_changes_nothing(cats: Path, bad: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        mark(cats, ["1", "2", bad, "4"], processed=True)
    assert processed(cats) == []


def test_mark_needs_something_to_set(cats: Path) -> None:
    with pytest.raises(InputError, match="nothing to set"):
        mark(cats, ["1"])
    with pytest.raises(InputError, match="unknown status"):
        mark(cats, ["1"], processing_status="done")


def test_mark_moves_the_change_counter_and_is_logged(cats: Path) -> None:
    with Catalog(cats) as catalog:
        before = catalog.changes()
        mark_samples(catalog, ["1", "2"], processed=True)
        assert catalog.changes() == before + 1
    logged = rows(cats, "SELECT kind, table_name, calls, rows FROM query_log WHERE sql LIKE 'UPDATE image_metadata%'")
    assert logged == [("write", "image_metadata", 1, 2)]


# CLI


def test_cli_mark_stdin(runner: CliRunner, cats: Path) -> None:
    result = runner.invoke(app, ["mark", "--processed", "--db", str(cats)], input="1\n2\n")
    assert result.exit_code == 0, result.output
    assert "matched 2  updated 2  unknown 0" in result.stdout
    assert result.stderr == ""
    assert processed(cats) == [1, 2]


def test_cli_mark_json_and_strict(runner: CliRunner, cats: Path) -> None:
    result = runner.invoke(app, ["mark", "-", "--status", "queued", "--json", "--strict", "--db", str(cats)], input="3\n42\n")
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
    assert processed(cats) == [1, 6]


def test_cli_mark_errors(runner: CliRunner, cats: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["mark", "-", "--processed", "--db", str(cats)], input="1\nfoo\n")
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "Error: line 2: 'foo' is not a sample id (for paths use --by path); nothing was changed"
    ]
    assert processed(cats) == []
    missing = runner.invoke(app, ["mark", str(tmp_path / "nope.txt"), "--processed", "--db", str(cats)])
    assert missing.exit_code == 1 and missing.stderr.startswith("Error: cannot read")
    nothing = runner.invoke(app, ["mark", "--db", str(cats)], input="1\n")
    assert nothing.exit_code == 2
    no_db = runner.invoke(app, ["mark", "--processed", "--db", str(tmp_path / "none.db")], input="1\n")
    assert no_db.exit_code == 1 and no_db.stderr.startswith("Error: no catalog at")
    assert "Traceback" not in result.output + missing.output + no_db.output


# Pipelines through a real shell


def _shell(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, shell=True, capture_output=True, text=True, timeout=120, executable="/bin/bash")


def test_pipeline_query_jsonl_into_mark(cats: Path) -> None:
    db = shlex.quote(str(cats))
    done = _shell(f"set -o pipefail; {DLINDEX} query --db {db} --label cat --format jsonl | {DLINDEX} mark --processed - --db {db}")
    assert done.returncode == 0, done.stderr
    assert "matched 4  updated 4  unknown 0" in done.stdout
    assert processed(cats) == [1, 2, 3, 4]
    left = _shell(f"set -o pipefail; {DLINDEX} query --db {db} --unprocessed --format jsonl | wc -l")
    assert left.stdout.strip() == "4"


def test_pipeline_paths_and_nul_paths_into_mark(cats: Path) -> None:
    db = shlex.quote(str(cats))
    plain = _shell(f"set -o pipefail; {DLINDEX} query --db {db} --label dog --limit 2 --format paths"
                   f" | {DLINDEX} mark --by path --status completed - --db {db} --json")  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout)["updated"] == 2
    nul = _shell(f"set -o pipefail; {DLINDEX} query --db {db} --label cat -0 | {DLINDEX} mark -0 --by path --processed --db {db}")
    assert nul.returncode == 0, nul.stderr
    assert processed(cats) == [1, 2, 3, 4]
    assert rows(cats, "SELECT id FROM image_metadata WHERE processing_status = 'completed'") == [(5,), (6,)]


# Concurrency


def test_concurrent_marks_and_scan_lose_nothing(tmp_path: Path) -> None:
    db = make_catalog(tmp_path / "c.db", [Row("a") for _ in range(3000)])
    tree = tmp_path / "tree"
    for i in range(600):
        make_png(tree / f"l{i % 3}" / f"{i:04d}.png", (8, 8))
    scan = subprocess.Popen(
        [sys.executable, "-m", "dlindex", "scan", str(tree), "--db", str(db), "--workers", "1", "-q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    while scan.poll() is None and rows(db, "SELECT count(*) FROM scans") == [(0,)]:
        pass  # mark while the scan writes, not before it starts
    cli_mark = subprocess.Popen(
        [sys.executable, "-m", "dlindex", "mark", "--status", "completed", "--db", str(db)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    errors: list[BaseException] = []
    marked: list[int] = []

    def marker(first: int) -> None:
        round_ = 0
        try:
            while round_ < 3 or (scan.poll() is None and round_ < 20):
                batch = list(range(first + round_ * 50, first + round_ * 50 + 50))
                with Catalog(db) as catalog:
                    result = mark_samples(catalog, [str(i) for i in batch], processed=True)
                assert result.updated == 50
                marked.extend(batch)
                round_ += 1
        except BaseException as e:  # collected: a thread's failure must fail the test
            errors.append(e)

    threads = [threading.Thread(target=marker, args=(1,)), threading.Thread(target=marker, args=(1501,))]
    for t in threads:
        t.start()
    _, err = cli_mark.communicate("\n".join(str(i) for i in range(1, 3001)), timeout=120)
    for t in threads:
        t.join(timeout=120)
    _, scan_err = scan.communicate(timeout=120)
    assert errors == []
    assert cli_mark.returncode == 0 and "locked" not in err, err
    assert scan.returncode == 0 and "locked" not in scan_err, scan_err
    assert processed(db) == sorted(marked)
    assert rows(db, "SELECT count(*) FROM image_metadata WHERE processing_status = 'completed'") == [(3000,)]
    assert rows(db, "SELECT count(*) FROM image_metadata WHERE root_id != 1") == [(600,)]
