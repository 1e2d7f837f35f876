"""`dlindex.torch.DataLoader` over a real catalog with real torch: shares, resume, failures, features."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dlindex import Catalog, QuerySpec, ScanOptions, mark_samples, scan_tree  # noqa: E402
from dlindex.errors import DlindexError, InputError  # noqa: E402
from dlindex.torch import CatalogDataset, DataLoader  # noqa: E402

from .backends import ON_BOTH_BACKENDS, raw, where  # noqa: E402
from .conftest import compute, export, make_jpeg  # noqa: E402

pytestmark = ON_BOTH_BACKENDS

CLASSES = ("ant", "bee", "cow")
N = 45


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "imgs"
    for i in range(N):
        make_jpeg(root / CLASSES[i % 3] / f"{i:03d}.jpg", (24 + i % 7, 20 + i % 5), (i * 5 % 255, 40, 90))
    return root


@pytest.fixture
def db(tree: Path, tmp_path: Path) -> Path:
    path = where(tmp_path / "train.db")
    with Catalog(path, create=True) as catalog:
        scan_tree(catalog, tree, ScanOptions(workers=1))
    return path


def all_ids(db: Path) -> set[int]:
    with raw(db) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM image_metadata")}


def read(loader: Any, batches: int | None = None) -> list[dict[str, Any]]:
    out = []
    for batch in loader:  # stop right after the last wanted batch: each one handed out counts as seen
        out.append(batch)
        if len(out) == batches:
            break
    return out


def ids_of(batches: list[dict[str, Any]]) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]


def test_the_seed_call_gives_every_sample_once_as_tensors(db: Path) -> None:
    loader = DataLoader(database_path=db, batch_size=4, num_workers=2, image_size=(16, 16), seed=0)
    batches = read(loader)
    assert sorted(ids_of(batches)) == sorted(all_ids(db))
    first = batches[0]
    assert first["image"].dtype == torch.uint8 and tuple(first["image"].shape[1:]) == (3, 16, 16)
    assert first["id"].dtype == torch.int64 and first["label"].dtype == torch.int64
    assert len(loader) == len(batches) == -(-N // 4)
    stats = loader.stats()
    assert stats["samples"] == N and stats["skipped"] == 0 and stats["source"] == "files"
    assert stats["l1_misses"] == N and stats["l1_hit_rate"] == 0.0


def test_labels_are_the_catalog_classes(db: Path) -> None:
    loader = DataLoader(database_path=db, batch_size=5, image_size=8)
    with raw(db) as conn:
        names = dict(conn.execute("SELECT image_metadata.id, labels.name FROM image_metadata JOIN labels "
                                  "ON labels.id = image_metadata.label_id"))  # fmt: skip
    for batch in loader:
        for i, label in zip(batch["id"].tolist(), batch["label"].tolist(), strict=True):
            assert CLASSES[label] == names[i]


def test_per_label_is_balanced_deterministic_and_new_every_epoch(db: Path) -> None:
    def epoch_ids(epoch: int) -> list[int]:
        loader = DataLoader(database_path=db, batch_size=4, num_workers=2, per_label=4, seed=7, image_size=8)
        loader.set_epoch(epoch)
        batches = read(loader)
        assert Counter(int(x) for b in batches for x in b["label"]) == {0: 4, 1: 4, 2: 4}
        return sorted(ids_of(batches))

    assert epoch_ids(0) == epoch_ids(0)
    assert epoch_ids(0) != epoch_ids(1) or epoch_ids(0) != epoch_ids(2)


def test_two_ranks_get_equal_disjoint_shares(db: Path) -> None:
    shares = [ids_of(read(DataLoader(database_path=db, batch_size=4, num_workers=2, rank=r, world_size=2,
                                     drop_last=True, image_size=8))) for r in range(2)]  # fmt: skip
    assert len(shares[0]) == len(shares[1]) == N // 2 // 4 * 4
    assert not set(shares[0]) & set(shares[1])
    padded = [ids_of(read(DataLoader(database_path=db, batch_size=4, rank=r, world_size=2, image_size=8)))
              for r in range(2)]  # fmt: skip
    assert len(padded[0]) == len(padded[1]) == -(-N // 2)
    assert set(padded[0]) | set(padded[1]) == all_ids(db)


@pytest.mark.parametrize("new_world", [1, 2, 3])
def test_resume_at_a_random_point_reads_exactly_the_rest(db: Path, new_world: int) -> None:
    cut = random.Random(new_world).randrange(1, 5)
    first = DataLoader(database_path=db, batch_size=4, num_workers=2, image_size=8, seed=3)
    first.set_epoch(2)
    seen = ids_of(read(first, cut))
    state = first.state_dict()
    rest: list[int] = []
    for r in range(new_world):
        again = DataLoader(database_path=db, batch_size=3, num_workers=1 + r % 2, image_size=8, seed=3,
                           rank=r, world_size=new_world)  # fmt: skip
        again.load_state_dict(state)
        again.set_epoch(2)
        rest += ids_of(read(again))
    assert not set(seen) & set(rest)
    assert set(seen) | set(rest) == all_ids(db)
    assert len(rest) - len(set(rest)) < new_world  # padding repeats only, fewer than one a rank


def test_resume_from_two_ranks_onto_one(db: Path) -> None:
    seen: list[int] = []
    states = []
    for r in range(2):
        loader = DataLoader(database_path=db, batch_size=2, num_workers=2, image_size=8, rank=r, world_size=2)
        seen += ids_of(read(loader, 3))
        states.append(loader.state_dict())
    assert states[0]["generations"] == states[1]["generations"]
    again = DataLoader(database_path=db, batch_size=5, num_workers=2, image_size=8, rank=0, world_size=1)
    again.load_state_dict(states[0])
    rest = ids_of(read(again))
    assert not set(seen) & set(rest) and set(seen) | set(rest) == all_ids(db)
    assert again.state_dict()["generations"][0]["world"] == 2


def test_a_resume_across_an_append_reads_exactly_the_rest_then_the_next_epoch_the_new(db: Path, tree: Path) -> None:
    """Two ranks save mid-epoch; files are added and the catalog rescanned; three ranks resume:
    they read exactly what the two had not (the catalog as the epoch planned it, by its saved
    state), and the next epoch reads the new files too."""
    seen: list[int] = []
    states = []
    for r in range(2):
        loader = DataLoader(database_path=db, batch_size=2, num_workers=2, image_size=8, rank=r, world_size=2, seed=4)
        seen += ids_of(read(loader, 3))
        states.append(loader.state_dict())
    before = all_ids(db)
    for i in range(5):
        make_jpeg(tree / "ant" / f"new{i}.jpg", (30, 30), (i, 200, 3))
    with Catalog(db) as catalog:
        scan_tree(catalog, tree, ScanOptions(workers=1))
    added = all_ids(db) - before
    assert len(added) == 5
    rest: list[int] = []
    for r in range(3):
        again = DataLoader(database_path=db, batch_size=3, num_workers=1, image_size=8, rank=r, world_size=3, seed=4)
        again.load_state_dict(states[0])
        rest += ids_of(read(again))
    assert not set(seen) & set(rest) and set(seen) | set(rest) == before  # nothing new, nothing twice
    everything = DataLoader(database_path=db, batch_size=4, image_size=8, seed=4)
    everything.set_epoch(1)
    assert added <= set(ids_of(read(everything)))
    with pytest.raises(InputError, match="seed"):
        DataLoader(database_path=db, batch_size=4, seed=9).load_state_dict(states[0])


def test_a_state_without_the_catalogs_state_is_checked_against_the_selection(db: Path, tree: Path) -> None:
    """A state saved before versions were kept: resume is exact only over the same samples."""
    loader = DataLoader(database_path=db, batch_size=4, image_size=8)
    read(loader, 2)
    state = loader.state_dict()
    del state["catalog_state"]
    make_jpeg(tree / "ant" / "new.jpg")
    with Catalog(db) as catalog:
        scan_tree(catalog, tree, ScanOptions(workers=1))
    again = DataLoader(database_path=db, batch_size=4, image_size=8)
    again.load_state_dict(state)
    with pytest.raises(DlindexError, match="differs"):
        read(again)


def test_a_loader_at_a_version_reads_that_version(db: Path, tree: Path) -> None:
    with Catalog(db) as catalog:
        mark_samples(catalog, [str(i) for i in sorted(all_ids(db))[:10]], excluded=True)
    now = ids_of(read(DataLoader(database_path=db, batch_size=4, image_size=8)))
    then = ids_of(read(DataLoader(database_path=db, batch_size=4, image_size=8, at="1")))
    assert len(now) == N - 10 and sorted(then) == sorted(all_ids(db))
    # a file deleted since: skipped and recorded in today's catalog, as any read failure
    (tree / "ant" / "000.jpg").unlink()
    loader = DataLoader(database_path=db, batch_size=4, image_size=8, at="1")
    assert len(ids_of(read(loader))) == N - 1 and loader.stats()["failed"] == 1
    with raw(db) as conn:
        assert conn.execute("SELECT count(*) FROM image_metadata WHERE processing_status = 'failed'").fetchone()[0] == 1


@pytest.mark.parametrize("on_error", ["skip", "replace"])
def test_a_corrupt_image_mid_epoch_is_counted_and_recorded(db: Path, tree: Path, on_error: str) -> None:
    bad = tree / "bee" / "010.jpg"
    bad.write_bytes(bad.read_bytes()[:40])  # truncated after the scan
    loader = DataLoader(database_path=db, batch_size=4, num_workers=2, image_size=8, on_error=on_error)
    got = ids_of(read(loader))
    stats = loader.stats()
    with raw(db) as conn:
        (bad_id,) = conn.execute("SELECT id FROM image_metadata WHERE file_path = 'bee/010.jpg'").fetchone()
    assert stats["failed"] == 1 and stats["errors"][0].startswith(f"sample {bad_id}: ")
    if on_error == "skip":
        assert len(got) == N - 1 and stats["skipped"] == 1
    else:
        assert len(got) == N and stats["replaced"] == 1 and len(set(got)) == N - 1
    with raw(db) as conn:
        status, error = conn.execute("SELECT processing_status, error FROM image_metadata "
                                     "WHERE file_path = 'bee/010.jpg'").fetchone()  # fmt: skip
    assert status == "failed" and error


def test_missing_vectors_are_skipped_raised_or_computed(db: Path) -> None:
    compute(db, "colorhist", QuerySpec(labels=["ant", "bee"]))
    skip = DataLoader(database_path=db, feature_type="colorhist", batch_size=8)
    batches = read(skip)
    assert len(ids_of(batches)) == 30 and skip.stats()["missing_features"] == 15
    assert "image" not in batches[0] and batches[0]["features"].shape[0] == batches[0]["id"].shape[0]
    with pytest.raises(InputError, match="15 of the 45"):
        read(DataLoader(database_path=db, feature_type="colorhist", batch_size=8, missing_features="raise"))
    both = DataLoader(database_path=db, feature_type="colorhist", images=True, image_size=8, batch_size=8,
                      missing_features="compute")  # fmt: skip
    batches = read(both)
    assert len(ids_of(batches)) == N and both.stats()["missing_features"] == 15
    assert batches[0]["image"].shape[0] == batches[0]["features"].shape[0]


def test_vectors_are_the_catalogs(db: Path) -> None:
    compute(db, "colorhist")
    from dlindex.features.storage import feature_vectors

    for batch in DataLoader(database_path=db, feature_type="colorhist", batch_size=7, num_workers=2):
        with Catalog(db) as catalog:
            want = feature_vectors(catalog, batch["id"].numpy(), "colorhist")
        assert np.array_equal(batch["features"].numpy(), want)


def test_a_wds_export_is_found_and_read(db: Path, tree: Path, tmp_path: Path) -> None:
    export(db, tmp_path / "shards", format="wds", shard_size=10)
    loader = DataLoader(database_path=db, batch_size=4, num_workers=2, image_size=8)
    wds = read(loader)
    assert loader.stats()["source"] == "wds" and loader.stats()["export_fallbacks"] == 0
    files = read(DataLoader(database_path=db, batch_size=4, num_workers=2, image_size=8, source="files"))
    by_id = {int(i): img for b in files for i, img in zip(b["id"], b["image"], strict=True)}
    assert sorted(ids_of(wds)) == sorted(by_id)
    for b in wds:
        for i, img in zip(b["id"], b["image"], strict=True):
            assert torch.equal(img, by_id[int(i)])
    changed = tree / "cow" / "002.jpg"  # rescanned after the export: the member is stale
    make_jpeg(changed, (30, 30), (250, 0, 0))
    with Catalog(db) as catalog:
        scan_tree(catalog, tree, ScanOptions(workers=1))
    loader = DataLoader(database_path=db, batch_size=4, image_size=8, source=tmp_path / "shards")
    assert len(ids_of(read(loader))) == N and loader.stats()["export_fallbacks"] == 1


def test_the_dataset_works_with_torchs_own_dataloader(db: Path) -> None:
    dataset = CatalogDataset(db, image_size=(12, 10), labels=["cow"])
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2)
    batches = list(loader)
    assert sum(len(b["id"]) for b in batches) == 15
    assert tuple(batches[0]["image"].shape[1:]) == (3, 12, 10)


def test_bad_options_are_one_clear_error(db: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown option"):
        DataLoader(database_path=db, colour="red")
    with pytest.raises(InputError, match="no catalog"):
        DataLoader(database_path=tmp_path / "none.db")
    with pytest.raises(InputError, match="on_error"):
        DataLoader(database_path=db, on_error="ignore")
    with pytest.raises(InputError, match="unknown label"):
        read(DataLoader(database_path=db, labels=["yak"]))


def test_a_damaged_export_falls_back_to_the_files(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "shards"
    export(db, out, format="wds", shard_size=10)
    shard = sorted(out.glob("*.tar"))[1]
    shard.write_bytes(shard.read_bytes()[:3000])  # cut mid-member
    loader = DataLoader(database_path=db, batch_size=4, image_size=8, source=out)
    assert sorted(ids_of(read(loader))) == sorted(all_ids(db))
    assert loader.stats()["export_fallbacks"] >= 1
    index = json.loads((out / "index.json").read_text())
    index["dlindex_shards"][0]["file"] = "../../escape.tar"
    (out / "index.json").write_text(json.dumps(index))
    with pytest.raises(DlindexError):
        read(DataLoader(database_path=db, batch_size=4, image_size=8, source=out))
    auto = DataLoader(database_path=db, batch_size=4, image_size=8)  # a damaged export is passed over
    assert len(ids_of(read(auto))) == N and auto.stats()["source"] == "files"


def test_a_worker_decodes_one_batch_before_handing_it_over(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch asks a worker for at most prefetch_factor batches ahead: a worker that decoded its
    # whole shuffle window before the first batch would sit idle while the training step runs
    import dlindex.loader.worker as worker

    decoded: list[int] = []
    real = worker.decode_image
    monkeypatch.setattr(worker, "decode_image", lambda data, spec, **kw: decoded.append(1) or real(data, spec, **kw))
    dataset = CatalogDataset(db, batch_size=4, shuffle_buffer=32, image_size=8)
    batches = iter(dataset)
    assert len(next(batches)["id"]) == 4
    assert len(decoded) == 4
    assert len(next(batches)["id"]) == 4
    assert len(decoded) == 8
