"""``export --format jsonl`` of a pre-split tree in one pass: each row's line goes to its split
folder's shard as the selection streams (dealing.Dealing by folder; the upper half of the ids
in a second process), with no count of the split folders first, and the bytes, counts, shards
and errors of a statement a split folder after that count."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlindex.export import halves, plan, run
from dlindex.export.dealing import Dealing
from dlindex.export.plan import ExportError
from dlindex.query import rows
from dlindex.query.spec import QuerySpec

from .conftest import export
from .synthetic import generated_catalog


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated catalog with a train/ + val/ tree and hostile names."""
    return generated_catalog(tmp_path_factory.mktemp("folders") / "c.db", chunk=500, rows=1_500, hostile=0.02)


def _files(out: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(out.iterdir())}


def _both(db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **options: Any) -> tuple[Any, Any, list[bool]]:
    """The export by a statement a split folder (as before), then dealt in one pass; which ran."""
    dealt: list[bool] = []
    deals = run._deals_tree_folders

    def never(*args: Any) -> bool:
        dealt.append(False)
        return False

    def counted(*args: Any) -> bool:
        dealt.append(deals(*args))
        return dealt[-1]

    monkeypatch.setattr(run, "_deals_tree_folders", never)
    try:
        old: Any = export(db, tmp_path / "old", **options)
    except ExportError as e:
        old = e
    monkeypatch.setattr(run, "_deals_tree_folders", counted)
    try:
        new: Any = export(db, tmp_path / "new", **options)
    except ExportError as e:
        new = e
    return old, new, dealt


FORMATS = [
    {"format": "jsonl"},  # two processes from HALVES_MIN_IDS ids
    {"format": "jsonl", "shard_size": 97},  # one process, shards cut by count
    {"format": "jsonl", "shard_bytes": "20KB"},
    {"format": "csv"},
    {"format": "csv", "shard_size": 250},
    {"format": "parquet"},  # row groups of 300 rows (below), cut across batches and folders
    {"format": "parquet", "shard_size": 700},
]


@pytest.mark.parametrize(
    "options",
    [
        {},  # a pre-split tree without --split: its folders
        {"split": "tree"},
        {"split": "val"},
        {"split": "train,test"},  # test has no folder here: dropped, as a count drops it
        {"shuffle": True, "seed": 3},
        {"query": QuerySpec(min_width=100)},
    ],
)
@pytest.mark.parametrize(
    ("fmt", "halves_min"),
    [(f, h) for f in FORMATS for h in ([10**9, 1, 0] if f == {"format": "jsonl"} else [1])],
    ids=str,
)
def test_dealing_by_folder_writes_the_bytes_of_a_statement_a_folder(
    catalog: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    options: dict[str, Any],
    halves_min: int,
    fmt: dict[str, Any],
) -> None:
    if fmt["format"] == "parquet":
        pytest.importorskip("pyarrow")
        from dlindex.export import parquet

        monkeypatch.setattr(parquet, "ROW_GROUP", 300)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    monkeypatch.setattr(plan, "HALVES_MIN_IDS", halves_min)  # 0, 1: a second process, as if the ids were many
    db = tmp_path / "c.db"
    shutil.copy(catalog, db)
    old, new, dealt = _both(db, tmp_path, monkeypatch, **options, **fmt)
    assert dealt == [False, True]
    assert (new.splits, new.samples, new.shards, new.bytes) == (old.splits, old.samples, old.shards, old.bytes)
    assert len(new.splits) == (1 if options.get("split") in ("val", "train,test") else 2)
    assert _files(tmp_path / "new") == _files(tmp_path / "old")  # index.json too: counts, shards, hashes
    if "shard_size" in fmt and "train" in new.splits:
        assert new.shards > len(new.splits)  # train's shards cut by count, as the statements cut them


def test_no_count_of_the_folders_is_made(catalog: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The selection is read once (twice in halves), not counted first; one second process
    deals both folders."""
    started: list[Any] = []
    start = halves.start

    def counting(*args: Any) -> Any:
        raise AssertionError("the split folders were counted")

    def counted(*args: Any) -> Any:
        started.append(args[3:])
        return start(*args)

    monkeypatch.setattr(run, "split_counts", counting)
    monkeypatch.setattr(plan, "HALVES_MIN_IDS", 1)
    monkeypatch.setattr(halves, "start", counted)
    summary = export(catalog, tmp_path / "out")
    assert started == [(Dealing(("train", "validation", "test")),)]
    assert sum(summary.splits.values()) == summary.samples == summary.selected > 1_000
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "index.json",
        "train-000000.jsonl",
        "validation-000000.jsonl",
    ]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
@pytest.mark.parametrize("halves_min", [10**9, 1])
@pytest.mark.parametrize("where", ["id = 1", "id = 1499", "id % 97 = 5"])
def test_a_sample_outside_the_folders_is_refused_with_the_counts_message(
    catalog: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, halves_min: int, fmt: str
) -> None:
    """Met in this process (the lower ids) or in the second (the upper ones): the message a
    count of the selection gives, and nothing is left (no export, no part files)."""
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    monkeypatch.setattr(plan, "HALVES_MIN_IDS", halves_min)
    db = tmp_path / "work" / "c.db"
    db.parent.mkdir()
    shutil.copy(catalog, db)
    with sqlite3.connect(db) as conn:
        outside = conn.execute(f"UPDATE image_metadata SET split = NULL WHERE {where}").rowcount
    conn.close()
    old, new, dealt = _both(db, tmp_path, monkeypatch, format=fmt)
    assert dealt == [False, True]
    assert isinstance(new, ExportError) and str(new) == str(old)
    count, rest = str(new).split(" ", 1)
    assert 0 < int(count) <= outside  # the selected ones among them
    assert rest.startswith("selected sample(s) are not in a split folder (train, validation); ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    assert sorted(p.name for p in db.parent.iterdir()) == ["c.db"]


def test_a_selection_in_no_folder_is_one_split_as_before(
    catalog: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pre-split root whose selected samples are all outside its folders: one split of them
    all, as ever (and the one-pass path is not taken)."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    db = tmp_path / "c.db"
    shutil.copy(catalog, db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE image_metadata SET split = NULL")
    conn.close()
    old, new, dealt = _both(db, tmp_path, monkeypatch)
    assert dealt == [False, True]
    assert list(new.splits) == list(old.splits) == ["train"]
    assert new.splits == old.splits
    assert _files(tmp_path / "new") == _files(tmp_path / "old")
    with pytest.raises(ExportError, match=r"^--split tree: no selected sample is in such a split folder"):
        export(db, tmp_path / "tree", split="tree")


def test_the_folder_check_stops_at_the_first_sample_in_a_folder(catalog: Path) -> None:
    from dlindex import Catalog

    with Catalog(catalog) as c:
        assert rows.any_in_split_folder(c, QuerySpec(has_class=True))
        assert not rows.any_in_split_folder(c, QuerySpec(has_class=True, min_width=10**6))
        plan_rows = c.conn.execute(
            "EXPLAIN QUERY PLAN SELECT EXISTS (SELECT 1 FROM image_metadata WHERE image_metadata.split IS NOT NULL)"
        ).fetchall()
    assert plan_rows  # a scan that EXISTS ends at its first row


@pytest.mark.parametrize("options", [{"query": QuerySpec(limit=700)}, {"query": QuerySpec(per_label=2)}])
def test_limits_over_the_whole_selection_keep_their_own_path(
    catalog: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    """--limit and --per-label apply to the whole selection: not dealt (their own statements)."""
    old, new, dealt = _both(catalog, tmp_path, monkeypatch, **options)
    assert dealt == [False, False]
    assert new.splits == old.splits


def test_the_collector_is_paused_while_rows_stream_and_back_after(
    catalog: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dlindex.export.gcpause: off while the rows are written, on again after an export and
    after a failed one; left off when the caller had it off."""
    import gc

    from dlindex.export import dealing

    seen: list[bool] = []
    write = dealing.write_dealt

    def spy(*args: Any) -> Any:
        seen.append(gc.isenabled())
        return write(*args)

    monkeypatch.setattr(run, "write_dealt", spy)
    assert gc.isenabled()
    export(catalog, tmp_path / "ok", format="csv")
    assert seen == [False] and gc.isenabled()
    with pytest.raises(ExportError):
        export(catalog, tmp_path / "bad", format="csv", split="test")  # no test folder here
    assert gc.isenabled()
    gc.disable()
    try:
        export(catalog, tmp_path / "off", format="csv")
        assert not gc.isenabled()
    finally:
        gc.enable()


@given(
    st.lists(st.sampled_from(["train", "validation", "test", None, "other"]), max_size=60),
    st.sampled_from([("train", "validation", "test"), ("validation",), ("train", "test")]),
)
@settings(max_examples=200, deadline=None)
def test_dealing_by_folder_keeps_every_row_once_in_order(splits: list[str | None], names: tuple[str, ...]) -> None:
    """Rows carrying their folder at EXTRA: refused iff one is outside ``names``; else each
    split's rows, cut back to ROW, are exactly those of that folder, in the batch's order."""
    from dlindex.export.dealing import OutsideSplit, partition
    from dlindex.export.plan import EXTRA

    batch = [(k, *range(1, EXTRA), split) for k, split in enumerate(splits)]
    dealer = Dealing(names).dealer()
    if any(s not in names for s in splits):
        with pytest.raises(OutsideSplit):
            dealer(batch)
        return
    rows, got = dealer(batch)
    assert got == splits and all(len(row) == EXTRA for row in rows)
    parts = dict(partition(rows, got, names))
    assert list(parts) == [n for n in names if n in splits]  # names order, empty splits left out
    for name, part in parts.items():
        assert [row[0] for row in part] == [k for k, s in enumerate(splits) if s == name]
    kept, _ = Dealing(names).dealer(strip=False)(batch)
    assert kept is batch  # a positional writer gets the rows as they are
