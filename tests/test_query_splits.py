"""`--split NAME` where it selects nothing says so in one line; the loader reads one split of an export."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlindex.errors import DlindexError, InputError

from .backends import ON_BOTH_BACKENDS, where
from .conftest import invoke, make_png, one_error_line

pytestmark = ON_BOTH_BACKENDS

NO_SPLITS = "this catalog has no split folders"


def scanned(runner: CliRunner, root: Path, db: Path) -> str:
    assert invoke(runner, "scan", str(root), "--db", str(db), "--workers", "1", "-q").exit_code == 0
    return str(db)


@pytest.fixture
def flat_db(tmp_path: Path, runner: CliRunner) -> str:
    """Twelve files in two classes, no split folders."""
    for i in range(12):
        make_png(tmp_path / "flat" / "ab"[i % 2] / f"{i}.png", (16 + i, 16), (30 * i, 0, 0))
    return scanned(runner, tmp_path / "flat", where(tmp_path / "flat.db"))


def test_a_tree_split_on_a_catalog_without_split_folders_is_one_error(
    flat_db: str, runner: CliRunner, tmp_path: Path
) -> None:
    assert NO_SPLITS in one_error_line(invoke(runner, "query", "--split", "train", "--db", flat_db))
    for split in ("train", "val,test", "tree"):
        out = tmp_path / "out"
        line = one_error_line(invoke(runner, "export", str(out), "--split", split, "--db", flat_db))
        assert NO_SPLITS in line and not out.exists(), line
    pytest.importorskip("torch")
    from dlindex.torch import DataLoader

    with pytest.raises(InputError, match=NO_SPLITS):
        list(DataLoader(database_path=flat_db, batch_size=2, split="train"))


def test_a_split_folder_the_selection_lacks_is_one_error(tmp_path: Path, runner: CliRunner) -> None:
    for i, split in enumerate(("train", "train", "val")):
        make_png(tmp_path / "pre" / split / "a" / f"{i}.png", (16 + i, 16))
    db = scanned(runner, tmp_path / "pre", where(tmp_path / "pre.db"))
    line = one_error_line(invoke(runner, "export", str(tmp_path / "out"), "--split", "test", "--db", db))
    assert "--split test: no selected sample is in such a split folder" in line
    assert len(invoke(runner, "query", "--split", "val", "-c", "id", "--db", db).stdout.splitlines()) == 1


def shard_ids(out: Path, split: str) -> set[int]:
    """The ids in one split's shards, read with tarfile."""
    found = set()
    for shard in out.glob(f"{split}-*.tar"):
        with tarfile.open(shard) as tar:
            found |= {int(m.name.split(".")[0].split("_")[0]) for m in tar.getmembers()}
    return found


def test_the_loader_reads_only_the_named_split_of_an_export(flat_db: str, runner: CliRunner, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from dlindex.torch import DataLoader

    out = tmp_path / "shards"
    made = invoke(runner, "export", str(out), "-f", "wds", "--split", "train=0.5,val=0.5", "--db", flat_db, "--json")
    assert made.exit_code == 0, made.output
    assert set(json.loads(made.stdout)["splits"]) == {"train", "val"}

    def read(**options: object) -> set[int]:
        loader = DataLoader(database_path=flat_db, batch_size=2, image_size=8, source=out, **options)
        return {int(i) for batch in loader for i in batch["id"]}

    train, val = shard_ids(out, "train"), shard_ids(out, "val")
    assert train and val and not train & val
    assert read(split="train") == train
    assert read(split="val") == val
    assert read(split=["train", "val"]) == train | val
    with pytest.raises(DlindexError, match="holds the splits train, val: name the one to read"):
        read()
    with pytest.raises(DlindexError, match="has no split 'test'; its splits are: train, val"):
        read(split="test")
