"""The epoch plan in a shared file (#34): the same samples in the same order as the plan held in row
lists, a pickle that does not grow with the catalog, the file removed with its plan, and too little
room one line naming the folder."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dlindex import Catalog
from dlindex.errors import DlindexError
from dlindex.loader import shared_plan
from dlindex.loader.catalog_dataset import CatalogDataset
from dlindex.loader.layout import Layout
from dlindex.loader.selection import epoch_spec
from dlindex.query.rows import query_rows
from dlindex.query.spec import QuerySpec

from .synthetic import Row, make_catalog

CLASSES = ("ant", "bee", "cow", "dog")


def catalog(tmp_path: Path, n: int, name: str = "c.db") -> Path:
    rows = [Row(CLASSES[(i * 7) % len(CLASSES)]) for i in range(n)]
    return Path(str(make_catalog(tmp_path / name, rows)))


def reference_streams(db: Path, seed: int, epoch: int, world: int, rank: int, workers: int, batch: int,
                      window: int, filters: dict[str, Any]) -> list[list[int]]:  # fmt: skip
    """What the plan of rows held in lists gave (dlindex before #34), computed from its parts: the
    query's rows as dicts, sorted by id, chunks of 16 in a seeded order, laid out over the ranks."""
    spec = epoch_spec(QuerySpec(**filters), seed, epoch)
    with Catalog(db) as c:
        ids = np.asarray(sorted(row["id"] for row in query_rows(c, spec)), dtype=np.int64)
    n = ids.size
    positions = np.arange(n, dtype=np.int64)
    starts = np.arange(0, n, 16, dtype=np.int64)
    bounds = np.append(starts, n)
    rng = np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32, epoch, 0x636875])
    order = np.concatenate([positions[bounds[k] : bounds[k + 1]] for k in rng.permutation(starts.size)])
    win = max(batch, round(window / batch) * batch)
    layout = Layout(order=order, world=world, workers=workers, batch_size=batch, window=win, drop_last=False,
                    seed=seed, epoch=epoch)  # fmt: skip
    return [ids[layout.stream(rank, w)].tolist() for w in range(workers)]


@pytest.mark.parametrize(
    ("seed", "world", "rank", "workers", "filters"),
    [(0, 1, 0, 1, {}), (7, 2, 1, 2, {}), (2**40 + 3, 8, 3, 2, {}), (5, 3, 2, 3, {"per_label": 20}),
     (11, 8, 7, 1, {"labels": ["bee", "dog"]})],
)  # fmt: skip
def test_the_order_is_the_row_list_plans(tmp_path: Path, plans: Path, seed: int, world: int, rank: int,
                                         workers: int, filters: dict[str, Any]) -> None:  # fmt: skip
    db = catalog(tmp_path, 437)
    for epoch in (0, 1):
        ds = CatalogDataset(db, seed=seed, world_size=world, rank=rank, batch_size=4, shuffle_buffer=24, **filters)
        ds.set_epoch(epoch)
        plan = ds.plan(workers)
        got = [plan.selection.ids[plan.layout.stream(rank, w)].tolist() for w in range(workers)]
        assert got == reference_streams(db, seed, epoch, world, rank, workers, 4, 24, filters)


def test_a_pickled_dataset_carries_the_file_not_the_arrays(tmp_path: Path, plans: Path) -> None:
    sizes = []
    for n in (100, 5000):
        ds = CatalogDataset(catalog(tmp_path, n, f"c{n}.db"), world_size=2, rank=1, batch_size=8)
        plan = ds.plan(2)
        assert plan.shared is not None and os.path.dirname(plan.shared.path) == str(plans)
        blob = pickle.dumps(ds)
        sizes.append(len(blob))
        again = pickle.loads(blob).plan(2)  # a spawned worker: maps the same file, read-only
        assert again.shared == plan.shared
        assert np.array_equal(again.selection.ids, plan.selection.ids)
        assert np.array_equal(again.layout.stream(1, 1), plan.layout.stream(1, 1))
        assert not again.selection.ids.flags.writeable
    assert abs(sizes[1] - sizes[0]) < 200, sizes  # 50x the samples, the same pickle


def test_the_file_goes_with_its_plan_and_at_exit(tmp_path: Path, plans: Path) -> None:
    db = catalog(tmp_path, 120)
    ds = CatalogDataset(db, batch_size=8)
    first = ds.plan(1).shared
    assert first is not None and os.listdir(plans) == [os.path.basename(first.path)]
    assert os.path.getsize(first.path) == first.size
    ds.set_epoch(1)
    second = ds.plan(1).shared
    gc.collect()
    assert second is not None and os.listdir(plans) == [os.path.basename(second.path)]
    del ds
    gc.collect()
    assert os.listdir(plans) == []
    code = f"from dlindex.loader.catalog_dataset import CatalogDataset; print(len(CatalogDataset({str(db)!r})))"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(done.stdout) == 120 and os.listdir(plans) == []


def test_a_plan_made_in_a_worker_leaves_no_file(tmp_path: Path, plans: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from dlindex.loader import catalog_dataset

    monkeypatch.setattr(catalog_dataset, "_in_worker", lambda: True)  # torch's own DataLoader: planned there
    ds = CatalogDataset(catalog(tmp_path, 200), batch_size=8)
    plan = ds.plan(1)
    assert os.listdir(plans) == [] and plan.shared is None
    assert sorted(plan.selection.ids.tolist()) == list(range(1, 201))
    assert np.array_equal(pickle.loads(pickle.dumps(ds)).plan(1).layout.order, plan.layout.order)


def test_the_plans_of_killed_processes_are_swept(tmp_path: Path, plans: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = plans / f"dlindex-plan-{int(dead.stdout)}-0123456789ab.bin"
    stale.write_bytes(b"x" * 64)
    mine = plans / f"dlindex-plan-{os.getpid()}-0123456789ab.bin"
    mine.write_bytes(b"x" * 64)
    CatalogDataset(catalog(tmp_path, 40), batch_size=8).plan(1)
    assert not stale.exists() and mine.exists()


def test_too_little_room_is_one_line_naming_the_folder(tmp_path: Path, plans: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    ds = CatalogDataset(catalog(tmp_path, 300), batch_size=8)
    monkeypatch.setattr(shared_plan, "free_bytes", lambda folder: 3620)  # the spill fits, the plan not
    with pytest.raises(DlindexError) as caught:
        ds.plan(1)
    message = str(caught.value)
    assert "\n" not in message and str(plans) in message and "3,620 free" in message and shared_plan.ENV in message
    assert "the epoch plan needs 3,648 bytes" in message  # 300 ids and classes: 12 bytes a sample, aligned
    assert os.listdir(plans) == []


def test_too_little_room_for_the_spill_is_one_line_while_the_query_runs(tmp_path: Path, plans: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    ds = CatalogDataset(catalog(tmp_path, 300), batch_size=8, world_size=4, rank=1)
    monkeypatch.setattr(shared_plan, "free_bytes", lambda folder: 1000)
    with pytest.raises(shared_plan.PlanSpaceError) as caught:
        ds.plan(1)
    message = str(caught.value)
    assert "\n" not in message and str(plans) in message and "1,000 free" in message and shared_plan.ENV in message
    assert "the epoch plan's spill needs about 3,600 bytes" in message  # 300 ids and classes, 12 bytes each
    assert os.listdir(plans) == []


def test_a_plan_folder_that_is_not_there_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gone = tmp_path / "no-such-folder"
    monkeypatch.setenv(shared_plan.ENV, str(gone))
    with pytest.raises(DlindexError, match=f"^the epoch plan folder {gone} cannot be used"):
        CatalogDataset(catalog(tmp_path, 50), batch_size=8).plan(1)


def test_without_a_setting_the_plan_lives_in_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(shared_plan.ENV, raising=False)
    expected = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None
    assert shared_plan.plan_dir() == (expected or tempfile.gettempdir())
