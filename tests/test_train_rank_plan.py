"""A rank's own epoch plan (#34): the query spilled to a file, only the rank's share gathered, in the
order the whole plan gives; a spill that does not fit is one line, and leaves no file."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dlindex import Catalog
from dlindex.loader import shared_plan
from dlindex.loader.catalog_dataset import CatalogDataset
from dlindex.loader.epoch import EpochOptions, Generation, make_plan
from dlindex.loader.layout import Layout, chunk_order, rank_runs
from dlindex.query.spec import QuerySpec

from .synthetic import Row, make_catalog

CLASSES = ("ant", "bee", "cow", "dog", "eel")


def catalog(tmp_path: Path, n: int) -> Path:
    rows = [Row(CLASSES[(i * 3) % len(CLASSES)]) for i in range(n)]
    return Path(str(make_catalog(tmp_path / "c.db", rows)))


def test_rank_runs_are_the_rank_positions_of_the_whole_order() -> None:
    rng = np.random.default_rng(5)
    for _ in range(300):
        n, run, world = int(rng.integers(0, 300)), int(rng.choice([1, 5, 16])), int(rng.integers(1, 11))
        seed, epoch, shuffle, drop = int(rng.integers(0, 2**40)), int(rng.integers(0, 4)), bool(rng.integers(2)), bool(rng.integers(2))  # fmt: skip
        order = chunk_order(np.arange(0, n, run, dtype=np.int64), n, seed, epoch, shuffle)
        layout = Layout(order=order, world=world, workers=1, batch_size=1, window=1, drop_last=drop, seed=seed,
                        epoch=epoch)  # fmt: skip
        for rank in range(world):
            src, length, dst = rank_runs(n, run, seed, epoch, shuffle, rank, layout.share())
            got = np.full(layout.share(), -1, dtype=np.int64)
            for s, k, d in zip(src.tolist(), length.tolist(), dst.tolist(), strict=True):
                got[d : d + k] = np.arange(s, s + k)
            assert got.tolist() == layout.rank_positions(rank).tolist()


def streams(plan: Any, rank: int, workers: int) -> list[list[int]]:
    return [plan.selection.ids[plan.layout.stream(rank, w)].tolist() for w in range(workers)]


@pytest.mark.parametrize(
    ("n", "world", "workers", "shuffle", "drop_last", "filters"),
    [(437, 8, 2, True, False, {}), (437, 3, 3, True, True, {}), (437, 4, 2, False, False, {}),
     (5, 8, 1, True, False, {}), (437, 3, 2, True, False, {"per_label": 17}),
     (437, 2, 1, True, False, {"labels": ["bee", "eel"]})],
)  # fmt: skip
def test_every_rank_reads_what_the_whole_plan_gives_it(tmp_path: Path, plans: Path, n: int, world: int,
                                                      workers: int, shuffle: bool, drop_last: bool,
                                                      filters: dict[str, Any]) -> None:  # fmt: skip
    db = catalog(tmp_path, n)
    options = EpochOptions(filters=QuerySpec(**filters), seed=9, shuffle=shuffle, window=12, drop_last=drop_last,
                           feature_type=None, missing_features="skip", source="auto")  # fmt: skip
    now = Generation(world, workers, 4)
    with Catalog(db) as c:
        for epoch in (0, 1):
            whole = make_plan(c, options, epoch, (), now)
            assert whole.layout.only_rank == -1
            for rank in range(world):
                mine = make_plan(c, options, epoch, (), now, rank=rank)
                assert mine.layout.only_rank == rank and len(mine.selection) == whole.layout.share()
                assert mine.selected == len(whole.selection) and mine.digest == whole.digest
                assert mine.layout.batches() == whole.layout.batches()
                assert streams(mine, rank, workers) == streams(whole, rank, workers)
                assert (
                    mine.selection.labels.tolist() == whole.selection.labels[whole.layout.rank_positions(rank)].tolist()
                )
                with pytest.raises(Exception, match="share only"):
                    mine.layout.stream((rank + 1) % world, 0) if world > 1 else mine.layout.consumed([0] * workers)
    assert [p for p in os.listdir(plans) if not p.startswith("dlindex-plan-")] == []


def test_a_rank_plan_holds_its_share_only_and_no_spill_is_left(tmp_path: Path, plans: Path) -> None:
    ds = CatalogDataset(catalog(tmp_path, 800), world_size=8, rank=3, batch_size=10)
    plan = ds.plan(2)
    assert len(plan.selection) == 100 and plan.selected == 800 and plan.layout.batches() == 10
    assert plan.shared is not None and plan.shared.size < 100 * 12 + 128  # ids and classes of the share
    assert os.listdir(plans) == [os.path.basename(plan.shared.path)]  # the spill is gone


def test_resume_still_plans_the_whole_epoch(tmp_path: Path, plans: Path) -> None:
    options = EpochOptions(filters=QuerySpec(), seed=1, shuffle=True, window=8, drop_last=False,
                           feature_type=None, missing_features="skip", source="auto")  # fmt: skip
    with Catalog(catalog(tmp_path, 300)) as c:
        plan = make_plan(c, options, 0, (Generation(2, 1, 4, (8,)),), Generation(2, 1, 4), rank=1)
    assert plan.layout.only_rank == -1 and plan.layout.generation == 1


def test_a_spill_the_file_size_limit_stops_is_one_line_and_no_file(tmp_path: Path, plans: Path) -> None:
    """A real write failure (RLIMIT_FSIZE: the spill's write fails with EFBIG), not a patched check."""
    db = catalog(tmp_path, 6000)  # 48 kB of ids: past the limit, which leaves SQLite its 32 kB -shm
    script = textwrap.dedent(f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (40000, 40000))
        from dlindex.errors import DlindexError
        from dlindex.loader.catalog_dataset import CatalogDataset
        try:
            CatalogDataset({str(db)!r}, world_size=2, rank=0, batch_size=4).plan(1)
        except DlindexError as e:
            print(e, file=sys.stderr)
            sys.exit(1)
    """)
    env = {**os.environ, "DLINDEX_NO_LOG": "1", shared_plan.ENV: str(plans)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(plans) in lines[0] and shared_plan.ENV in lines[0], done.stderr
    assert "spill could not be written" in lines[0] and "File too large" in lines[0]
    assert os.listdir(plans) == []


def test_the_spills_of_killed_processes_are_swept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spills = tmp_path / "tmp"
    spills.mkdir()
    monkeypatch.delenv(shared_plan.ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(spills))  # the spill's folder without DLINDEX_PLAN_DIR
    dead = [spills / "dlindex-plan-999999999-0a0b.ids.bin", spills / "dlindex-plan-999999999-0a0b.labels.bin"]
    for path in dead:
        path.write_bytes(b"\0" * 64)
    plan = CatalogDataset(catalog(tmp_path, 100), world_size=2, rank=1, batch_size=8).plan(1)
    assert len(plan.selection) == 50 and os.listdir(spills) == []
