"""Read failures in `dlindex.torch.DataLoader`: counted exactly, an epoch with nothing readable is an
error, and the failures recorded in the catalog are cleared by a rescan once the files are back."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from dlindex import Catalog, ScanOptions, scan_tree  # noqa: E402
from dlindex.torch import CatalogDataset, DataLoader, NothingReadError  # noqa: E402

from .backends import ON_BOTH_BACKENDS, raw, where  # noqa: E402
from .conftest import make_jpeg  # noqa: E402

pytestmark = ON_BOTH_BACKENDS

N = 24  # ant/000 ... cow/023: 8 per class, catalogued in path order (ant, bee, cow)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "imgs"
    for i in range(N):
        make_jpeg(root / ("ant", "bee", "cow")[i * 3 // N] / f"{i:03d}.jpg", (12, 10), (i * 9, 40, 90))
    return root


@pytest.fixture
def db(tree: Path, tmp_path: Path) -> Path:
    path = where(tmp_path / "train.db")
    scan(path, tree)
    return path


def scan(db: Path, tree: Path) -> None:
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, tree, ScanOptions(workers=1))


def epoch(db: Path, workers: int) -> tuple[int, dict[str, Any]]:
    loader = DataLoader(database_path=db, batch_size=2, num_workers=workers, image_size=8, shuffle=False)
    samples = sum(len(batch["id"]) for batch in loader)
    return samples, loader.stats()


def failed_rows(db: Path) -> list[tuple[str, str]]:
    with raw(db) as conn:
        query = "SELECT file_path, error FROM image_metadata WHERE processing_status = 'failed' ORDER BY file_path"
        return [(r[0], r[1]) for r in conn.execute(query)]


@pytest.mark.parametrize("workers", [0, 2])
def test_failures_in_whole_batches_at_the_end_are_counted_exactly(db: Path, tree: Path, workers: int) -> None:
    # the last class is read last: every worker's stream ends in batches that fail whole, which
    # hand out nothing, and the counts used to travel only with the batches handed out
    shutil.rmtree(tree / "cow")
    for _ in range(2):  # the same exact figures every run
        samples, stats = epoch(db, workers)
        assert (samples, stats["samples"], stats["failed"], stats["skipped"]) == (16, 16, 8, 8)
        assert stats["batches"] == 8
    assert [path for path, _ in failed_rows(db)] == [f"cow/{i:03d}.jpg" for i in range(16, 24)]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_that_reads_nothing_is_an_error(db: Path, tree: Path, workers: int) -> None:
    shutil.rmtree(tree)
    loader = DataLoader(database_path=db, batch_size=2, num_workers=workers, image_size=8)
    with pytest.raises(NothingReadError, match=r"^epoch 0: none of its 24 samples could be read; first: sample \d+: "):
        for _ in loader:
            pass
    assert (loader.stats()["failed"], loader.stats()["samples"]) == (24, 0)


def test_the_dataset_alone_raises_too(db: Path, tree: Path) -> None:
    shutil.rmtree(tree)
    with pytest.raises(NothingReadError, match="none of its 24 samples"):
        list(CatalogDataset(db, batch_size=4))


def test_a_rescan_clears_the_failures_of_files_that_are_back(db: Path, tree: Path, tmp_path: Path) -> None:
    from dlindex.query.mark import mark_samples

    with raw(db) as conn:
        ids = dict(conn.execute("SELECT file_path, id FROM image_metadata").fetchall())
    with Catalog(db) as catalog:  # the user's own verdict on a sample the loader reads well
        mark_samples(catalog, [str(ids["ant/000.jpg"])], processing_status="failed", error="blurry")
    shutil.move(tree / "cow", tmp_path / "away")  # an outage: the files come back unchanged
    assert epoch(db, 0)[1]["failed"] == 8
    assert (
        len(failed_rows(db)) == 9
        and dict(failed_rows(db))["cow/016.jpg"] == f"loader: {tree}/cow/016.jpg: No such file or directory"
    )
    shutil.move(tmp_path / "away", tree / "cow")
    shutil.move(tree / "cow" / "023.jpg", tmp_path)  # all but one
    scan(db, tree)
    assert failed_rows(db) == [("ant/000.jpg", "blurry"), ("cow/023.jpg", dict(failed_rows(db))["cow/023.jpg"])]
    assert dict(failed_rows(db))["cow/023.jpg"].startswith("loader: ")  # still gone: still failed
    shutil.move(tmp_path / "023.jpg", tree / "cow")
    scan(db, tree)
    assert failed_rows(db) == [("ant/000.jpg", "blurry")]
    assert epoch(db, 2)[1]["failed"] == 0
