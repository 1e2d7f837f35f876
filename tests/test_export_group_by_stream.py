"""``export --group-by`` in bounded memory: each row's value is read with the row (no map of
every sample), the splits are those a map would give, and the group counts come from SQL."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from dlindex import Catalog
from dlindex.export.groups import Grouping, group_points, value_point
from dlindex.export.plan import content_point, split_of
from dlindex.scan import labels

from .conftest import export
from .synthetic import generated_catalog

FRACTIONS = {"train": 0.7, "val": 0.2, "test": 0.1}


@pytest.fixture(scope="module")
def attr_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2,000 generated rows, 60% of them in `source` groups of 20 (bench/make_catalog.py)."""
    db = generated_catalog(
        tmp_path_factory.mktemp("groupby") / "c.db", chunk=500, rows=2_000, attributes=0.6, dups=0.02
    )
    return db


def _no_map(*args: object) -> None:
    raise AssertionError("--group-by built a map of every sample's value")


@pytest.mark.parametrize(
    "case",
    [{}, {"world_size": 3, "shuffle": True, "seed": 5}, {"world_size": 2, "memory_budget": "64KiB"}],
    ids=["plain", "ranks-shuffled", "spilled"],
)
def test_group_by_splits_as_the_value_map_did(
    attr_catalog: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: dict[str, object]
) -> None:
    with Catalog(attr_catalog) as c:
        values = labels.attribute_values(c, "source")
        rows = c.conn.execute("SELECT id, xxh3_128 FROM image_metadata").fetchall()
    assert 0 < len(values) < len(rows)
    points = {i: value_point(v) for i, v in values.items()}  # the map the export used to hold
    assign = split_of(FRACTIONS, points)
    monkeypatch.setattr(labels, "attribute_values", _no_map)
    export(attr_catalog, tmp_path / "out", group_by="source", split="train=0.7,val=0.2,test=0.1", **case)
    seen = 0
    hashes = dict(rows)
    for f in (tmp_path / "out").glob("*.jsonl"):
        split = f.name.split("-")[0]
        for line in f.read_text().splitlines():
            i = json.loads(line)["id"]
            row = (i, None, None, None, None, None, None, None, None, hashes[i])
            assert assign(row) == split, (i, split)
            seen += 1
    assert seen >= 1_900
    with Catalog(attr_catalog) as c:  # whole groups: every value in one split
        by_value: dict[str, set[str]] = {}
        for f in (tmp_path / "out").glob("*.jsonl"):
            for line in f.read_text().splitlines():
                i = json.loads(line)["id"]
                if i in values:
                    by_value.setdefault(values[i], set()).add(f.name.split("-")[0])
    assert by_value and all(len(s) == 1 for s in by_value.values())


def test_group_counts_come_from_sql(attr_catalog: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Catalog(attr_catalog) as c:
        sizes = Counter(labels.attribute_values(c, "source").values())
        monkeypatch.setattr(labels, "attribute_values", _no_map)
        found = group_points(c, Grouping("column", column="source"))
    assert found.groups == len(sizes) and found.largest == max(sizes.values())
    assert callable(found.points)
    no_value = (7, None, None, None, None, None, None, None, None, "ab" * 16, None)
    assert found.points(no_value) == content_point(no_value)
