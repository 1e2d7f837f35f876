"""The export's one-pass plan (dlindex.export.spill): the same groups, rows and bytes as the list
plan it replaced, memory bounded by a budget, and nothing left behind by a full disk or kill -9."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dlindex.export import ExportError, spill
from dlindex.export.plan import DEFAULT_SPLIT, make_plan, split_of

from .conftest import REPO, export, invoke, one_error_line
from .synthetic import generated_catalog

ROWS = 3_000
SMALL = "160KiB"  # 256 rows for a few groups: every multi-group export below spills many chunks


def reference_groups(
    rows: list[tuple[Any, ...]], split: Mapping[str, float] | None, world_size: int, drop_last: bool
) -> list[tuple[str, int, list[tuple[Any, ...]], int, range]]:
    """The plan before it streamed (dlindex 0.2's make_plan): every row in lists, cut per rank."""
    if split:
        assign = split_of(split)
        by_split: dict[str, list[tuple[Any, ...]]] = {name: [] for name in split}
        for row in rows:
            by_split[assign(row)].append(row)
    else:
        by_split = {DEFAULT_SPLIT: list(rows)}
    groups = []
    for name, members in by_split.items():
        n = len(members)
        if world_size > 1:
            if drop_last:
                members = members[: n // world_size * world_size]
            elif n % world_size:
                members = members + [members[i % n] for i in range(world_size - n % world_size)]
        total = len(members)
        for rank in range(world_size):
            positions = range(rank, total, world_size)
            groups.append((name, rank, members[rank::world_size], sum(1 for p in positions if p >= n), positions))
    return groups


def fake_rows(n: int) -> list[tuple[Any, ...]]:
    return [(i, 1, f"c/{i}.png", None, i % 7, 8, 8, "PNG", 100 + i, f"{(i * 2654435761) % (1 << 128):032x}")
            for i in range(1, n + 1)]  # fmt: skip


@pytest.mark.parametrize("n", [0, 1, 5, 37, 1000])
@pytest.mark.parametrize("split", [None, {"train": 0.9, "val": 0.1}, {"a": 0.5, "b": 0.3, "c": 0.2}])
@pytest.mark.parametrize(("world_size", "drop_last"), [(1, False), (3, False), (3, True), (8, False), (8, True)])
@pytest.mark.parametrize("spilled", [False, True])
def test_the_plan_is_the_list_plans_row_for_row(
    tmp_path: Path, n: int, split: dict[str, float] | None, world_size: int, drop_last: bool, spilled: bool
) -> None:
    rows = fake_rows(n)
    groups = len(split or "x") * world_size
    held = groups if world_size > 1 else 0
    budget = (groups * spill.MIN_GROUP_ROWS + held + 10) * spill.ROW_BYTES  # about the least it takes
    plan = make_plan(
        iter(rows), ["x"] * 7, {k: k for k in range(7)}, {1: ("/r", b"/r/")}, split=split, world_size=world_size,
        drop_last=drop_last, absolute_paths=False, stream=False, spill_dir=tmp_path if spilled else None,
        memory_budget=budget,
    )  # fmt: skip
    expected = reference_groups(rows, split, world_size, drop_last)
    got = [(g.split, g.rank, list(g.rows), g.padded, g.positions) for g in plan.groups]
    assert got == expected
    assert [len(g.rows) for g in plan.groups] == [len(e[2]) for e in expected]  # type: ignore[arg-type]
    assert [list(g.rows) for g in plan.groups] == [e[2] for e in expected]  # read twice (dali does)
    assert plan.selected == n
    assert plan.padded == sum(e[3] for e in expected)
    assert list(tmp_path.iterdir()) == []  # the spill file has no name


def test_the_buffers_never_hold_more_than_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held: list[int] = []
    flush = spill.Spill.flush

    def watched(self: spill.Spill) -> None:
        held.append(sum(map(len, self.buffers)))
        flush(self)

    monkeypatch.setattr(spill.Spill, "flush", watched)
    budget = 1000 * spill.ROW_BYTES  # spill forced every 1,000 rows
    plan = make_plan(
        iter(fake_rows(10_000)), ["x"] * 7, {k: k for k in range(7)}, {1: ("/r", b"/r/")},
        split={"train": 0.9, "val": 0.1}, world_size=2, drop_last=False, absolute_paths=False, stream=False,
        spill_dir=tmp_path, memory_budget=budget,
    )  # fmt: skip
    assert len(held) >= 10 and max(held) <= 1000
    assert isinstance(plan.groups[0].rows, spill.SpilledRows)


@pytest.mark.parametrize(("rows", "budget"), [(0, 10_000), (10_000, 1 << 16)])
def test_a_budget_too_small_is_one_line(tmp_path: Path, rows: int, budget: int) -> None:
    """Before a row is read where --pad's repeats alone pass it; else once the rows must spill
    in chunks too small to read back."""
    with pytest.raises(ExportError, match=r"memory budget .* too small .* 16 \(split, rank\) group"):
        make_plan(
            iter(fake_rows(rows)), ["x"] * 7, {k: k for k in range(7)}, {1: ("/r", b"/r/")},
            split={"train": 0.5, "val": 0.5}, world_size=8, drop_last=False, absolute_paths=False, stream=False,
            spill_dir=tmp_path, memory_budget=budget,
        )  # fmt: skip
    make_plan(
        iter(fake_rows(50)), ["x"] * 7, {k: k for k in range(7)}, {1: ("/r", b"/r/")},
        split={"train": 0.5, "val": 0.5}, world_size=8, drop_last=False, absolute_paths=False, stream=False,
        spill_dir=tmp_path, memory_budget=1 << 16,
    )  # fmt: skip  # a small export at the same budget: it fits without spilling


@pytest.fixture(scope="module")
def bench_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated catalog (bench/make_catalog.py): val/ folders, hostile names, repeated content."""
    db = generated_catalog(tmp_path_factory.mktemp("stream") / "c.db", chunk=1000, rows=ROWS, hostile=0.01, dups=0.02)
    return db


def _files(out: Path) -> Iterator[tuple[str, bytes]]:
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name.endswith("index.json"):
            data = b"\n".join(line for line in data.split(b"\n") if b'"created_at"' not in line)
        yield str(path.relative_to(out)), data


CASES = [
    {"format": "jsonl", "split": "train=0.9,val=0.1"},
    {"format": "jsonl", "shuffle": True, "seed": 3, "split": "a=0.8,b=0.15,c=0.05", "world_size": 8},
    {"format": "csv", "shuffle": True, "world_size": 8, "drop_last": True, "split": "train=0.9,val=0.1"},
    {"format": "jsonl", "world_size": 3, "shard_size": 400, "split": "train=0.5,val=0.5"},
    {"format": "parquet", "shuffle": True, "split": "train=0.9,val=0.1", "world_size": 2},
    {"format": "dali", "split": "train=0.9,val=0.1", "world_size": 2, "shard_size": 300},
    {"format": "dali"},
    {"format": "csv", "world_size": 5},  # the tree's train/ and val/ folders as splits
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_a_spilled_export_is_byte_identical_to_one_held_in_memory(
    bench_catalog: Path, tmp_path: Path, case: dict[str, Any]
) -> None:
    held = export(bench_catalog, tmp_path / "held", memory_budget="1GiB", **case)
    spilled = export(bench_catalog, tmp_path / "spilled", memory_budget=SMALL, **case)
    assert held.splits == spilled.splits and held.samples == spilled.samples
    assert dict(_files(tmp_path / "held")) == dict(_files(tmp_path / "spilled"))


@pytest.mark.parametrize("row_group", [1 << 20, 25_000])
def test_parquet_written_a_row_group_at_a_time_is_the_one_table_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, row_group: int
) -> None:
    """60,000 rows: the hash column's dictionary passes its 1 MB page limit (the writer falls
    back to plain pages), which a table in 4096-row chunks would do at another place."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from dlindex.export import parquet
    from dlindex.export.shards import Context

    monkeypatch.setattr(parquet, "ROW_GROUP", row_group)
    rows = fake_rows(60_000)
    plan = make_plan(iter(rows), [f"c{k}" for k in range(7)], {k: k for k in range(7)}, {1: ("/r", b"/r/")},
                     split=None, world_size=1, drop_last=False, absolute_paths=False)  # fmt: skip
    ctx = Context.make(plan, tmp_path, shard_size=None, shard_bytes=None)
    (shard,) = parquet.write_parquet(ctx, plan.groups[0], 0)
    written = (tmp_path / shard.file).read_bytes()
    whole = parquet.ParquetWriter(ctx, plan.groups[0], 0).table(rows)
    assert isinstance(whole, pa.Table) and whole.num_rows == 60_000
    pq.write_table(whole, tmp_path / "whole.parquet", compression="zstd", row_group_size=row_group)
    assert written == (tmp_path / "whole.parquet").read_bytes()
    assert pq.ParquetFile(tmp_path / shard.file).num_row_groups == -(-60_000 // row_group)


def test_the_cli_refuses_a_budget_it_cannot_keep(
    bench_catalog: Path, tmp_path: Path, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    args = ["export", str(out), "--db", str(bench_catalog), "--split", "train=0.9,val=0.1", "--world-size", "256"]
    line = one_error_line(invoke(runner, *args, "--memory-budget", "1MiB"))
    assert "memory budget 1.0 MiB is too small" in line and "512 (split, rank) group(s)" in line
    assert list(tmp_path.iterdir()) == []
    line = one_error_line(invoke(runner, *args, "--memory-budget", "lots"))
    assert "size 'lots'" in line
    monkeypatch.setenv("DLINDEX_MEMORY_BUDGET", "2MiB")
    line = one_error_line(invoke(runner, *args))
    assert "memory budget 2.0 MiB is too small" in line


class _FillingFile:
    """A spill file on a disk that fills after its second chunk."""

    def __init__(self, real: Any) -> None:
        self.real, self.writes = real, 0

    def write(self, data: bytes) -> int:
        self.writes += 1
        if self.writes > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return int(self.real.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_full_disk_while_spilling_is_one_line_and_leaves_nothing(
    bench_catalog: Path, tmp_path: Path, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = tempfile.TemporaryFile
    monkeypatch.setattr(tempfile, "TemporaryFile", lambda **kw: _FillingFile(made(**kw)))
    out = tmp_path / "out"
    result = invoke(runner, "export", str(out), "--db", str(bench_catalog), "--shuffle", "--world-size", "2",
                    "--split", "train=0.9,val=0.1", "--memory-budget", SMALL)  # fmt: skip  # ranks: dealt, spilled
    assert result.exit_code == 4  # ExitCode.DISK_FULL
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: disk full: no space left writing "), result.stderr
    assert f"{tmp_path}/.out." in lines[0]  # the export's temporary folder, where the rows spill
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_while_a_row_group_is_encoded_is_one_line_and_leaves_nothing(
    bench_catalog: Path, tmp_path: Path, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row groups are encoded on a thread of their own (export/parquet.py): its error is the export's."""
    import threading

    pq = pytest.importorskip("pyarrow.parquet")
    from dlindex.export import parquet

    monkeypatch.setattr(parquet, "ROW_GROUP", 500)
    real, calls = pq.ParquetWriter.write_table, []

    def filling(self: Any, table: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(threading.current_thread().name)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", filling)
    out = tmp_path / "out"
    result = invoke(runner, "export", str(out), "--db", str(bench_catalog), "--format", "parquet")
    assert result.exit_code == 4, result.output  # ExitCode.DISK_FULL
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: disk full: no space left writing "), result.stderr
    assert list(tmp_path.iterdir()) == []
    assert calls and all(name.startswith("dlindex-parquet") for name in calls)
    assert not [t for t in threading.enumerate() if t.name.startswith("dlindex-parquet")]


def test_kill_9_mid_spill_leaves_no_export_and_no_spill(bench_catalog: Path, tmp_path: Path) -> None:
    code = f"""
import os
from pathlib import Path
from dlindex import Catalog
from dlindex.export import export_catalog, ExportOptions, spill
flush = spill.Spill.flush
def dying(self):
    flush(self)
    if self.size > 50_000:
        print(sorted(os.listdir(self.folder)), flush=True)  # the spill file is in no folder
        os.kill(os.getpid(), 9)
spill.Spill.flush = dying
with Catalog({str(bench_catalog)!r}) as c:
    export_catalog(c, Path('out'), ExportOptions(format='jsonl', shuffle=True, split='train=0.9,val=0.1',
                                                 world_size=4, memory_budget={SMALL!r}))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, timeout=120)
    assert done.returncode == -9, done.stderr
    assert done.stdout.decode().strip() == "[]"
    left = [p for p in tmp_path.iterdir()]
    assert not (tmp_path / "out").exists()
    assert len(left) == 1 and left[0].name.startswith(".out.") and left[0].name.endswith(".tmp")
    assert list(left[0].iterdir()) == []  # no shard begun, no spill file by any name
    export(bench_catalog, tmp_path / "out", shuffle=True, split="train=0.9,val=0.1")  # removes the leftover
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.fixture(scope="module")
def packed_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scanned tree of 90 tiny images in three classes: enough to spill under the least budget."""
    from dlindex import Catalog, ScanOptions, scan_tree

    from .conftest import make_png

    root = tmp_path_factory.mktemp("packed") / "images"
    for i in range(90):
        make_png(root / f"c{i % 3}" / f"{i:03d}.png", (8 + i % 5, 8), (i, 2 * i, 0))
    db = root.parent / "c.db"
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    return db


@pytest.mark.parametrize("fmt", ["wds", "mds"])
def test_packed_exports_spilled_are_byte_identical(packed_catalog: Path, tmp_path: Path, fmt: str) -> None:
    if fmt == "mds":
        pytest.importorskip("streaming")
    case = {"format": fmt, "shuffle": True, "split": "train=0.7,val=0.3", "world_size": 2, "shard_size": 7}
    least = (4 * spill.MIN_GROUP_ROWS + 4 + 10) * spill.ROW_BYTES  # 4 groups: chunks of a few rows
    held = export(packed_catalog, tmp_path / "held", **case)
    spilled = export(packed_catalog, tmp_path / "spilled", memory_budget=least, **case)
    assert held.samples == spilled.samples == 90 + held.padded
    assert dict(_files(tmp_path / "held")) == dict(_files(tmp_path / "spilled"))


def test_a_parts_plan_digest_is_the_same_spilled(tmp_path: Path) -> None:
    """``--part I/N``: every part must compute the same plan digest, whatever its budget."""
    from dlindex.export.part import owners, plan_digest

    def plan(spill_dir: Path | None) -> Any:
        return make_plan(
            iter(fake_rows(5000)), ["x"] * 7, {k: k for k in range(7)}, {1: ("/r", b"/r/")},
            split={"train": 0.8, "val": 0.2}, world_size=3, drop_last=False, absolute_paths=False, stream=False,
            spill_dir=spill_dir, memory_budget=50_000 * 8,
        )  # fmt: skip

    held, spilled = plan(None), plan(tmp_path)
    assert isinstance(spilled.groups[0].rows, spill.SpilledRows)
    assert plan_digest(held) == plan_digest(spilled)
    assert owners(held, 4) == owners(spilled, 4)


@pytest.mark.usefixtures("catalog_backend")
def test_a_spilled_export_on_either_backend(tmp_path: Path) -> None:
    """A server catalog's rows (psycopg types) spill and read back as a file catalog's do."""
    from dlindex import Catalog, ScanOptions, scan_tree

    from .backends import where
    from .conftest import make_png

    root = tmp_path / "images"
    for i in range(40):
        make_png(root / f"c{i % 2}" / f"{i:03d}.png", (8 + i % 3, 8), (i, 0, 0))
    db: Any = where(tmp_path / "c.db")  # a file, or a postgresql:// URL (export takes either)
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    case = {"format": "jsonl", "shuffle": True, "split": "train=0.6,val=0.4", "world_size": 2}
    least = (4 * spill.MIN_GROUP_ROWS + 4 + 2) * spill.ROW_BYTES  # 4 groups: 34 rows held, 40 rows spill
    held = export(db, tmp_path / "held", **case)
    spilled = export(db, tmp_path / "spilled", memory_budget=least, **case)
    assert held.samples == spilled.samples >= 40
    assert dict(_files(tmp_path / "held")) == dict(_files(tmp_path / "spilled"))
