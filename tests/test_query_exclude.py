"""`dups --rest | mark --exclude`: the samples set aside leave query, export and the DataLoader."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlindex import Catalog, query_rows

from .backends import ON_BOTH_BACKENDS, schema_before, where
from .conftest import invoke, make_png, rows

pytestmark = ON_BOTH_BACKENDS


@pytest.fixture
def copies_db(tmp_path: Path, runner: CliRunner) -> Path:
    """Six files in two classes, two of them byte copies of another: four distinct images."""
    root = tmp_path / "images"
    for i, label in enumerate(("a", "a", "b", "b")):
        make_png(root / label / f"{i}.png", (16 + i, 16), (60 * i, 10, 10))
    shutil.copyfile(root / "a" / "0.png", root / "a" / "0_copy.png")
    shutil.copyfile(root / "b" / "2.png", root / "b" / "2_copy.png")
    db = where(tmp_path / "c.db")
    assert invoke(runner, "scan", str(root), "--db", str(db), "--workers", "1", "-q").exit_code == 0
    return db


def ids(text: str) -> set[int]:
    return {int(json.loads(line)["id"]) for line in text.splitlines()}


def wds_ids(out: Path) -> list[int]:
    """The sample ids of every member of an export's shards, read with tarfile."""
    found = []
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as tar:
            found += [int(m.name.split(".")[0].split("_")[0]) for m in tar.getmembers() if m.name.endswith(".cls")]
    return found


def test_the_readme_pipeline_trains_on_one_copy_of_each(copies_db: Path, runner: CliRunner, tmp_path: Path) -> None:
    db = str(copies_db)
    everything = {int(str(i)) for (i,) in rows(copies_db, "SELECT id FROM image_metadata")}
    before = tmp_path / "before"  # an export made before the marking: the loader may read its bytes
    assert invoke(runner, "export", str(before), "--format", "wds", "--db", db, "-q").exit_code == 0
    rest = invoke(runner, "dups", "--rest", "--db", db)
    assert rest.exit_code == 0, rest.output
    dropped = {int(i) for i in rest.stdout.split()}
    assert len(dropped) == 2
    marked = invoke(runner, "mark", "--exclude", "--json", "--db", db, input=rest.stdout)
    assert marked.exit_code == 0, marked.output
    assert json.loads(marked.stdout)["updated"] == 2
    kept = everything - dropped

    query = invoke(runner, "query", "-c", "id", "--db", db)
    assert ids(query.stdout) == kept
    assert ids(invoke(runner, "query", "-c", "id", "--excluded", "only", "--db", db).stdout) == dropped
    assert ids(invoke(runner, "query", "-c", "id", "--excluded", "include", "--db", db).stdout) == everything
    assert (invoke(runner, "dups", "--rest", "--db", db).stdout) == ""  # nothing left to set aside
    with Catalog(copies_db) as catalog:
        assert {r["id"] for r in query_rows(catalog, columns="id")} == kept

    out = tmp_path / "shards"
    assert invoke(runner, "export", str(out), "--format", "wds", "--db", db, "-q").exit_code == 0
    assert sorted(wds_ids(out)) == sorted(kept)
    assert json.loads((out / "index.json").read_text())["filters"]["excluded"] is False
    manifest = tmp_path / "manifest"
    assert invoke(runner, "export", str(manifest), "--db", db, "-q").exit_code == 0
    assert ids((manifest / "train-000000.jsonl").read_text()) == kept

    pytest.importorskip("torch")
    from dlindex.torch import DataLoader

    for source in ("files", "auto", before):
        loader = DataLoader(database_path=copies_db, batch_size=2, image_size=8, source=source)
        assert sorted(int(i) for batch in loader for i in batch["id"]) == sorted(kept), source

    back = invoke(runner, "mark", "--include", "--db", db, input="\n".join(map(str, dropped)))
    assert back.exit_code == 0, back.output
    assert ids(invoke(runner, "query", "-c", "id", "--db", db).stdout) == everything


def test_mark_status_and_query_status_cannot_be_confused(copies_db: Path, runner: CliRunner) -> None:
    db = str(copies_db)
    cases = {
        ("mark", "--status", "failed"): "mark --status is now --processing-status failed",
        ("mark", "--processing-status", "ok"): "'ok' is a scan status, which only scan sets",
        ("query", "--status", "failed"): "'failed' is a processing status, not a scan status",
        ("query", "--processing-status", "corrupt"): "'corrupt' is a scan status, not a processing status",
        ("export", "out", "--status", "queued"): "'queued' is a processing status, not a scan status",
    }
    for args, message in cases.items():
        result = invoke(runner, *args, "--db", db, input="1\n")
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and message in lines[0], (args, result.stderr)
        assert result.stdout == ""
    assert rows(copies_db, "SELECT count(*) FROM image_metadata WHERE processing_status IS NOT NULL") == [(0,)]
    marked = invoke(runner, "mark", "--processing-status", "failed", "--db", db, input="1\n")
    assert marked.exit_code == 0, marked.output
    selected = {
        status: ids(invoke(runner, "query", "-c", "id", "--processing-status", status, "--db", db).stdout)
        for status in ("failed", "none")
    }
    assert selected["failed"] == {1} and 1 not in selected["none"] and len(selected["none"]) == 5
    cleared = invoke(runner, "mark", "--processing-status", "none", "--db", db, input="1\n")
    assert cleared.exit_code == 0 and rows(copies_db, "SELECT processing_status FROM image_metadata WHERE id = 1") == [
        (None,)
    ]


def test_a_catalog_from_before_the_column_gains_it_with_nothing_set_aside(copies_db: Path, runner: CliRunner) -> None:
    from dlindex.catalog.sqlite.migrations import m014_excluded

    schema_before(copies_db, m014_excluded)
    assert len(invoke(runner, "query", "-c", "id", "--db", str(copies_db)).stdout.splitlines()) == 6
    assert rows(copies_db, "SELECT count(*) FROM image_metadata WHERE excluded = 0") == [(6,)]
