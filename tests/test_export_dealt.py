"""``export --format jsonl --split NAME=FRACTION,...`` in one pass: each row's line goes to its
split's shard as the selection streams (manifest.write_jsonl_splits, the upper half of the ids
in a second process), with the bytes, counts and shards of a statement a split."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from dlindex import Catalog
from dlindex.export import halves, hashsplit, plan, run
from dlindex.export.dealing import Dealing
from dlindex.query.spec import QuerySpec

from .conftest import export
from .synthetic import generated_catalog

# Odd hashes (upper case, short, empty, not hex, on a bound) and NULL: split_of decides them.
ODD = ["ABCDEF0123456789ABCDEF0123456789", "e6", "", "zz" * 16, "ffffffffffffffff", "e666666666666666", None]


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated catalog (hostile names, a train/ + val/ tree) with odd hashes."""
    db = generated_catalog(tmp_path_factory.mktemp("dealt") / "c.db", chunk=500, rows=1_500, hostile=0.02)
    with Catalog(db) as c:
        for k, digest in enumerate(ODD):
            c.conn.execute("UPDATE image_metadata SET xxh3_128 = ? WHERE id = ?", (digest, 10 + 7 * k))
    return db


def _files(out: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(out.iterdir())}


@pytest.mark.parametrize("halves_min", [10**9, 1, 0])
@pytest.mark.parametrize(
    "options",
    [
        {"split": "train=0.9,val=0.1"},
        {"split": "a=0.5,b=0.4,c=0.1"},
        {"split": "a=0.5,b=0.4,c=0.1", "shuffle": True, "seed": 3},
        {"split": "train=0.9,val=0.1", "query": QuerySpec(limit=700)},
        {"split": "train=0.9,val=0.1", "query": QuerySpec(per_label=2), "seed": 1},
        {"split": "a=0.9999999,b=0.0000001"},  # b gets nothing
    ],
)
def test_dealing_writes_the_bytes_of_a_statement_a_split(
    catalog: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any], halves_min: int
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    monkeypatch.setattr(plan, "HALVES_MIN_IDS", halves_min)  # 0, 1: a second process, as if the ids were many
    db = tmp_path / "c.db"
    shutil.copy(catalog, db)
    dealt: list[bool] = []

    def never(*args: Any) -> Any:  # a statement a split, as before
        dealt.append(False)
        return False

    def counted(*args: Any) -> Any:
        dealt.append(True)
        return hashsplit.dealt_rows(*args)

    monkeypatch.setattr(run, "dealt_rows", never)
    old = export(db, tmp_path / "old", **options)
    monkeypatch.setattr(run, "dealt_rows", counted)
    new = export(db, tmp_path / "new", **options)
    assert dealt == [False, True]
    assert (new.splits, new.samples, new.shards, new.bytes) == (old.splits, old.samples, old.shards, old.bytes)
    assert _files(tmp_path / "new") == _files(tmp_path / "old")  # index.json too: counts, shards, hashes


def test_one_second_process_deals_every_split(catalog: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The upper half of the ids goes to one process, which writes a part a split; nothing of
    them is left in the export."""
    started: list[Any] = []
    start = halves.start

    def counted(*args: Any) -> Any:
        started.append(args[3:])
        return start(*args)

    monkeypatch.setattr(plan, "HALVES_MIN_IDS", 1)
    monkeypatch.setattr(halves, "start", counted)
    summary = export(catalog, tmp_path / "out", split="a=0.5,b=0.4,c=0.1")
    assert started == [(Dealing(("a", "b", "c"), (("a", 0.5), ("b", 0.4), ("c", 0.1))),)]
    assert sum(summary.splits.values()) == summary.samples == summary.selected
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "a-000000.jsonl",
        "b-000000.jsonl",
        "c-000000.jsonl",
        "index.json",
    ]


def test_a_failing_second_process_fails_the_export(
    catalog: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its error is the export's, and nothing is left: no export, no part files."""
    from dlindex.export.plan import ExportError, UpperHalf

    start = halves.start

    def broken(ctx: Any, group: Any, upper: UpperHalf, *rest: Any) -> Any:
        return start(ctx, group, UpperHalf(upper.db, "SELECT * FROM no_such_table", {}), *rest)

    monkeypatch.setattr(plan, "HALVES_MIN_IDS", 1)
    monkeypatch.setattr(halves, "start", broken)
    with pytest.raises(ExportError, match=r"the second export process failed: .*no_such_table"):
        export(catalog, tmp_path / "out", split="train=0.9,val=0.1")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("punches", [True, False])
def test_a_part_file_is_drained_chunk_by_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, punches: bool) -> None:
    """The second process's part is appended with its blocks freed as they are copied (the
    export needs no room for a second copy of it); where holes cannot be punched, a plain
    copy. Either way the bytes are exact and the part is gone."""
    import os

    from dlindex.export import files

    part = tmp_path / "part"
    data = os.urandom(1 << 20)
    part.write_bytes(data)
    os.sync()
    if not punches:
        monkeypatch.setattr(files, "_hole_puncher", lambda: lambda fd, offset, length: False)
    elif files._hole_puncher() is None:
        pytest.skip("no fallocate in this libc")
    blocks: list[int] = []
    out = bytearray()

    def write(chunk: bytes) -> None:
        blocks.append(os.stat(part).st_blocks)
        out.extend(chunk)

    files.drain_into(part, write, chunk=1 << 16)
    assert bytes(out) == data and not part.exists()
    if punches:
        if blocks[1] == blocks[0]:
            pytest.skip("this file system keeps the blocks (no hole punching)")
        assert blocks == sorted(blocks, reverse=True) and blocks[-1] <= blocks[0] // 8
    else:
        assert len(set(blocks)) == 1  # nothing freed until the file is removed
