"""`dlindex similar` through the CLI: one sample by id or path, batch mode, formats, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dlindex.cli import app

from .backends import ON_BOTH_BACKENDS
from .conftest import brute_force, catalog_with
from .synthetic import ROOT

pytestmark = ON_BOTH_BACKENDS


@pytest.fixture
def cli_db(tmp_path: Path) -> tuple[Path, np.ndarray, list[str]]:
    vectors = np.random.default_rng(4).standard_normal((30, 5)).astype(np.float32)
    db, labels = catalog_with(tmp_path, vectors)
    return db, vectors, labels


def test_cli_one_sample_by_id_and_by_path(runner: CliRunner, cli_db: tuple[Path, np.ndarray, list[str]]) -> None:
    db, vectors, labels = cli_db
    result = runner.invoke(app, ["similar", "2", "--type", "v", "-k", "3", "--db", str(db)])
    assert result.exit_code == 0 and result.stderr == "", result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["id"], r["distance"]) for r in lines] == brute_force(vectors, labels, 2, 3, "cosine")
    assert list(lines[0]) == ["query", "rank", "id", "distance", "label", "path"]
    assert lines[0]["query"] == 2 and [r["rank"] for r in lines] == [1, 2, 3]
    assert lines[0]["path"] == f"{ROOT}/{lines[0]['label']}/" + lines[0]["path"].rsplit("/", 1)[1]
    by_path = runner.invoke(app, ["similar", "b/0001.png", "--type", "v", "-k", "3", "--db", str(db)])
    by_abs = runner.invoke(app, ["similar", f"{ROOT}/b/0001.png", "--type", "v", "-k", "3", "--db", str(db)])
    assert by_path.stdout == by_abs.stdout == result.stdout  # b/0001.png is sample 2
    paths = runner.invoke(app, ["similar", "2", "--type", "v", "-k", "2", "--other-labels", "--metric", "l2",
                                "--format", "paths", "--db", str(db)])  # fmt: skip
    expected = brute_force(vectors, labels, 2, 2, "l2", other_labels=True)
    assert [p.rsplit("/", 2)[1] for p in paths.stdout.splitlines()] == [labels[i - 1] for i, _ in expected]


def test_cli_batch_mode(runner: CliRunner, cli_db: tuple[Path, np.ndarray, list[str]], tmp_path: Path) -> None:
    db, vectors, labels = cli_db
    (tmp_path / "q.txt").write_text("1\n5\n\n9\n")
    result = runner.invoke(app, ["similar", "--type", "v", "--ids", str(tmp_path / "q.txt"), "-k", "4",
                                 "--format", "jsonl", "--label", "a", "--label", "c", "--db", str(db)])  # fmt: skip
    assert result.exit_code == 0, result.output
    got = [json.loads(line) for line in result.stdout.splitlines()]
    allowed = {i for i in range(1, 31) if labels[i - 1] in ("a", "c")}
    for q in (1, 5, 9):
        mine = [(r["id"], r["distance"]) for r in got if r["query"] == q]
        assert mine == brute_force(vectors, labels, q, 4, "cosine", allowed)
    stdin = runner.invoke(
        app, ["similar", "--type", "v", "--ids", "-", "-k", "4", "--format", "csv", "--db", str(db)], input="3\n"
    )
    assert stdin.exit_code == 0 and stdin.stdout.splitlines()[0] == "query,rank,id,distance,label,path"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["2", "--type", "nope"], 1, "Error: unknown feature type 'nope'; known types: v"),
        (["999", "--type", "v"], 1, "Error: no sample with id 999"),
        (["x/nothing.png", "--type", "v"], 1, "Error: x/nothing.png is not in the catalog"),
        (["--type", "v"], 2, "give one sample"),
        (["2", "--type", "v", "-k", "0"], 2, "-k"),
        (["2", "--type", "v", "--metric", "dot"], 2, "--metric"),
    ],
)
def test_cli_errors(
    runner: CliRunner, cli_db: tuple[Path, np.ndarray, list[str]], args: list[str], code: int, message: str
) -> None:
    result = runner.invoke(app, ["similar", *args, "--db", str(cli_db[0])])
    assert result.exit_code == code and message in result.stderr, result.output
    assert "Traceback" not in result.output


def test_cli_ids_file_lines_are_bounded(
    runner: CliRunner, cli_db: tuple[Path, np.ndarray, list[str]], tmp_path: Path
) -> None:
    db = cli_db[0]
    (tmp_path / "big.txt").write_bytes(b"1" * (3 << 20))  # one 3 MiB line, no newline: never read whole
    result = runner.invoke(app, ["similar", "--type", "v", "--ids", str(tmp_path / "big.txt"), "--db", str(db)])
    assert result.exit_code == 1 and result.stdout == "", result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "line 1" in result.stderr, result.stderr
