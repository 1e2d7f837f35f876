"""``export --limit N`` on a pre-split tree: N samples in all (as ``query --limit N`` lists
them), each in its own folder's split, read without counting the whole selection."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dlindex import Catalog, sample_ids
from dlindex.export import run
from dlindex.query.spec import QuerySpec

from .conftest import export
from .synthetic import generated_catalog

ROWS = 2_000


@pytest.fixture(scope="module")
def tree_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated catalog (bench/make_catalog.py) of a train/ + val/ tree, val a quarter."""
    db = generated_catalog(tmp_path_factory.mktemp("limits") / "c.db", chunk=500, rows=ROWS, val=0.25, hostile=0.01)
    return db


def _written(out: Path) -> dict[str, list[int]]:
    return {
        f.name.split("-")[0]: [json.loads(line)["id"] for line in f.read_text().splitlines()]
        for f in sorted(out.glob("*.jsonl"))
    }


def _splits(db: Path, ids: list[int]) -> dict[int, str]:
    with Catalog(db) as c:
        marks = ",".join("?" * len(ids))
        return dict(c.conn.execute(f"SELECT id, split FROM image_metadata WHERE id IN ({marks})", ids).fetchall())


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("limit", [1, 20, 700])
def test_a_limit_caps_the_whole_export_as_query_does(
    tree_catalog: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shuffle: bool, limit: int
) -> None:
    def full_count(*args: object) -> None:
        raise AssertionError("a --limit export counted the whole selection")

    monkeypatch.setattr(run, "split_counts", full_count)
    summary = export(tree_catalog, tmp_path / "out", query=QuerySpec(limit=limit), shuffle=shuffle, seed=4)
    assert summary.samples == limit
    with Catalog(tree_catalog) as c:
        listed = sample_ids(c, has_class=True, limit=limit, order="random" if shuffle else "id", seed=4)
    written = _written(tmp_path / "out")
    assert sorted(i for ids in written.values() for i in ids) == sorted(listed)
    where = _splits(tree_catalog, listed)
    for name, ids in written.items():  # each in its own folder's split, in the selection's order
        assert ids == [i for i in listed if where[i] == name]
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["counts"]["samples"] == index["counts"]["selected"] == limit


@pytest.mark.parametrize(
    "case",
    [{"format": "jsonl"}, {"format": "csv", "shuffle": True, "seed": 2, "world_size": 3}, {"format": "dali"}],
    ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()),
)
def test_a_limit_above_the_selection_changes_no_byte(
    tree_catalog: Path, tmp_path: Path, case: dict[str, object]
) -> None:
    whole = export(tree_catalog, tmp_path / "whole", **case)
    capped = export(tree_catalog, tmp_path / "capped", query=QuerySpec(limit=10 * ROWS), **case)
    assert whole.splits == capped.splits and whole.samples == capped.samples
    for f in sorted((tmp_path / "whole").iterdir()):
        if f.name != "index.json":
            assert f.read_bytes() == (tmp_path / "capped" / f.name).read_bytes(), f.name


def test_a_limit_with_fractions_is_still_one_cap(tree_catalog: Path, tmp_path: Path) -> None:
    summary = export(tree_catalog, tmp_path / "out", query=QuerySpec(limit=100), split="train=0.8,val=0.2")
    assert summary.samples == 100 and sum(summary.splits.values()) == 100


ODD = ["ABCDEF0123456789ABCDEF0123456789", "e6", "", "zz" * 16, "ffffffffffffffff", "e666666666666666"]


def test_each_split_statement_holds_exactly_its_rows(tree_catalog: Path, tmp_path: Path) -> None:
    """Odd hashes (upper case, short, empty, not hex, on a bound) and NULL ones: each split's
    statement gives exactly the rows, in order, that dealing the whole selection would."""
    import shutil

    from dlindex.export.hashsplit import split_streams
    from dlindex.export.plan import select_rows, split_of

    db = tmp_path / "odd.db"
    shutil.copy(tree_catalog, db)
    with Catalog(db) as c:
        for k, digest in enumerate([*ODD, None]):
            c.conn.execute("UPDATE image_metadata SET xxh3_128 = ? WHERE id = ?", (digest, 10 + 7 * k))
        c.conn.commit()
        fractions = {"a": 0.5, "b": 0.4, "c": 0.1}
        for shuffle in (False, True):
            spec = QuerySpec(has_class=True)
            every, _ = select_rows(c, spec, shuffle, 3)
            assign = split_of(fractions)
            dealt: dict[str, list[tuple[object, ...]]] = {name: [] for name in fractions}
            for row in every:
                dealt[assign(row)].append(row)
            streams, _, _ = split_streams(c, spec, shuffle, 3, fractions)
            assert {name: list(rows) for name, rows in streams.items()} == dealt


@pytest.mark.parametrize("split", [None, "train=0.9,val=0.1"])
def test_two_processes_write_the_same_bytes(
    tree_catalog: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: str | None
) -> None:
    """jsonl of the tree's splits (each split's upper half by a second process) or of fractions
    (the upper half of the ids by one, dealt to the splits)."""
    from dlindex.export import halves, plan

    one = export(tree_catalog, tmp_path / "one", split=split)
    started: list[str] = []
    start = halves.start
    monkeypatch.setattr(plan, "HALVES_MIN_IDS", 1)  # as if the id range were large

    def counted(*args: Any) -> Any:
        started.append(args[1].split)
        return start(*args)

    monkeypatch.setattr(halves, "start", counted)
    two = export(tree_catalog, tmp_path / "two", split=split)
    assert len(started) == 1  # one deals every split (folder or fraction)
    assert one.splits == two.splits
    for f in sorted((tmp_path / "one").iterdir()):
        if f.name != "index.json":
            assert f.read_bytes() == (tmp_path / "two" / f.name).read_bytes(), f.name
