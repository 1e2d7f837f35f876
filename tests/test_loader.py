"""`dlindex.loader`: datasets over exports, with and without torch."""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from dlindex import Catalog, ScanOptions, scan_tree
from dlindex.loader import ManifestDataset, WdsDataset, iter_tar

from .backends import ON_BOTH_BACKENDS, where
from .conftest import exported, make_png

pytestmark = ON_BOTH_BACKENDS


@pytest.fixture
def db(tmp_path: Path) -> Path:
    root = tmp_path / "imgs"
    for i in range(24):
        make_png(root / ("ant", "bee", "cow")[i % 3] / f"{i:03d}.png", (8 + i, 8), (i * 10, 0, 0))
    path = where(tmp_path / "l.db")
    with Catalog(path, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    return path


def widths(items: list[tuple[Any, int]]) -> list[int]:
    return sorted(image.size[0] for image, _ in items)


def test_importing_the_loader_needs_no_torch(db: Path, tmp_path: Path) -> None:
    out = exported(db, tmp_path / "w", format="wds", shard_size=5)
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now fails
        "from dlindex.loader import WdsDataset, ManifestDataset\n"
        f"items = list(WdsDataset({str(out)!r}, decode=False))\n"
        "assert len(items) == 24 and all(isinstance(b, bytes) for b, _ in items), len(items)\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout == "ok\n", result.stderr


@pytest.mark.parametrize("fmt", ("jsonl", "csv", "parquet", "dali"))
def test_manifest_dataset(db: Path, tmp_path: Path, fmt: str) -> None:
    out = exported(db, tmp_path / fmt, format=fmt, shuffle=True, seed=2)
    dataset = ManifestDataset(out)
    assert len(dataset) == 24 and dataset.classes == ["ant", "bee", "cow"]
    items = [dataset[i] for i in range(len(dataset))]
    assert widths(items) == list(range(8, 32))
    assert all(isinstance(image, Image.Image) and image.mode == "RGB" for image, _ in items)
    for i, (image, label) in enumerate(items):
        meta = dataset.metadata(i)
        assert meta is not None and meta["label"] == dataset.classes[label] and meta["width"] == image.size[0]
    dataset.metadata(0)
    assert dataset.cache.get.cache_info().hits >= 1  # the LRU cache answered the repeat
    raw = ManifestDataset(out, decode=False, transform=len)
    assert raw[0][0] == (Path(dataset.index["file_root"]) / dataset.paths[0].decode().split("/imgs/")[1]).stat().st_size


def test_manifest_dataset_by_split_and_rank(db: Path, tmp_path: Path) -> None:
    out = exported(db, tmp_path / "o", split="train=0.5,val=0.5", world_size=2)
    sizes = {(s, r): len(ManifestDataset(out, s, r)) for s in ("train", "val") for r in (0, 1)}
    assert sizes[("train", 0)] == sizes[("train", 1)] and sizes[("val", 0)] == sizes[("val", 1)]


def test_wds_dataset_plain_iteration(db: Path, tmp_path: Path) -> None:
    out = exported(db, tmp_path / "w", format="wds", shard_size=7)
    dataset = WdsDataset(out, transform=lambda im: im.size)
    items = list(dataset)
    assert sorted(w for (w, _), _ in items) == list(range(8, 32))
    assert Counter(dataset.classes[label] for _, label in items) == {"ant": 8, "bee": 8, "cow": 8}
    with_meta = list(WdsDataset(out, with_metadata=True, decode=False))
    assert all(len(b) == meta["bytes"] and meta["__key__"] == f"{meta['id']:012d}" for b, _, meta in with_meta)


def test_wds_ranks_split_the_shards(db: Path, tmp_path: Path) -> None:
    pinned = exported(db, tmp_path / "pinned", format="wds", world_size=2, shard_size=4)
    free = exported(db, tmp_path / "free", format="wds", shard_size=4)
    for out in (pinned, free):
        with warnings.catch_warnings():
            warnings.simplefilter("error" if out is pinned else "ignore")  # only `free` is read with another world size
            seen = [sorted(b for b, _ in WdsDataset(out, rank=r, world_size=2, decode=False)) for r in (0, 1)]
            assert len(seen[0]) + len(seen[1]) == 24 and not set(seen[0]) & set(seen[1])
            assert len(WdsDataset(out, rank=0, world_size=2)) == len(seen[0])


@pytest.mark.parametrize("shard_size", (3, 100))  # many shards per worker; fewer shards than workers
def test_wds_with_a_torch_dataloader_and_two_workers(db: Path, tmp_path: Path, shard_size: int) -> None:
    torch = pytest.importorskip("torch")
    out = exported(db, tmp_path / "w", format="wds", shard_size=shard_size, shuffle=True, seed=1)

    def to_tensor(image: Image.Image) -> Any:
        return torch.tensor(image.size)

    dataset = WdsDataset(out, transform=to_tensor)
    assert isinstance(dataset, torch.utils.data.IterableDataset)
    loader = torch.utils.data.DataLoader(dataset, batch_size=5, num_workers=2)
    sizes, labels = [], []
    for batch, label in loader:
        sizes += batch[:, 0].tolist()
        labels += label.tolist()
    assert sorted(sizes) == list(range(8, 32))  # each sample exactly once over both workers
    assert Counter(labels) == {0: 8, 1: 8, 2: 8}


def test_manifest_dataset_with_a_torch_dataloader(db: Path, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    out = exported(db, tmp_path / "o", format="parquet")
    dataset = ManifestDataset(out, transform=lambda im: torch.tensor(im.size))
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2, shuffle=True)
    sizes = sorted(w for batch, _ in loader for w in batch[:, 0].tolist())
    assert sizes == list(range(8, 32))


def test_iter_tar_can_skip_samples(db: Path, tmp_path: Path) -> None:
    out = exported(db, tmp_path / "w", format="wds", workers=1)
    tar = out / "train-000000.tar"
    every = list(iter_tar(tar))
    odd = list(iter_tar(tar, keep=lambda n: n % 2 == 1))
    assert len(every) == 24 and [s["__key__"] for s in odd] == [s["__key__"] for s in every[1::2]]
    assert set(every[0]) == {"__key__", "png", "cls", "json"}


def test_wrong_export_kind(db: Path, tmp_path: Path) -> None:
    from dlindex import DlindexError

    out = exported(db, tmp_path / "o", format="jsonl")
    with pytest.raises(DlindexError, match="WdsDataset reads wds exports"):
        WdsDataset(out)
    wds_out = exported(db, tmp_path / "w", format="wds")
    with pytest.raises(DlindexError, match="no manifest shards"):
        ManifestDataset(wds_out)
