"""--per-label N: the ring rule on path_hash, and the index-served shape giving the window's sample (#34).

On both backends: a server catalog's index-served shape is SERVER_SEEK (lateral arcs per label).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from dlindex import Catalog, QuerySpec, sample_ids
from dlindex.query.per_label import pivot
from dlindex.query.rows import explain

from .backends import ON_BOTH_BACKENDS, Location, raw
from .synthetic import Row, balanced, make_catalog

pytestmark = ON_BOTH_BACKENDS

# id last: PostgreSQL then reads the arc of rows without a hash in id order from the index too
# (SQLite's indexes end with the rowid anyway); what `dlindex index --suggest` proposes on both
_INDEX = "CREATE INDEX per_label ON image_metadata (label_id, path_hash, id) WHERE status = 'ok' AND excluded = 0"


def reference(db: Location, per_label: int, seed: int, where: str = "status = 'ok' AND excluded = 0") -> list[int]:
    """The sample by the documented rule, in Python: from the seed's pivot round the ring, ids break ties."""
    start = pivot(seed)
    by_label: dict[object, list[tuple[int, int, int]]] = defaultdict(list)
    with raw(db) as conn:
        for id_, label, key in conn.execute(f"SELECT id, label_id, path_hash FROM image_metadata WHERE {where}"):
            arc = 2 if key is None else 0 if key >= start else 1
            by_label[label].append((arc, key or 0, id_))
    return sorted(i for ranked in by_label.values() for _, _, i in sorted(ranked)[:per_label])


def ids(db: Location, **options: object) -> list[int]:
    with Catalog(db, log=False) as catalog:
        return sample_ids(catalog, cache=False, **options)  # type: ignore[arg-type]


def shape(db: Location, **options: object) -> str:
    with Catalog(db, log=False) as catalog:
        return explain(catalog, QuerySpec(**options)).sql  # type: ignore[arg-type]


def test_the_sample_follows_the_seed_round_the_path_hash_ring(tmp_path: Path) -> None:
    db = balanced(tmp_path / "b.db", {"a": 60, "b": 25, "c": 3})
    for seed in (0, 1, 7):
        assert ids(db, per_label=5, seed=seed) == reference(db, 5, seed)
    assert ids(db, per_label=5, seed=0) != ids(db, per_label=5, seed=1)


def test_an_index_on_label_and_path_hash_serves_it_with_the_same_sample(tmp_path: Path) -> None:
    # rows enough that a server's planner reads a label's first rows from the index, not the table
    rows = [Row("a") for _ in range(3000)] + [Row("b", processed=1) for _ in range(300)]
    rows += [Row("c", status="corrupt"), *(Row("d") for _ in range(20))]
    db = make_catalog(tmp_path / "m.db", rows)
    with raw(db) as conn:  # some rows no scan wrote, and rows without a class
        # few enough (as after a scan) that a server's planner reads them from the index too, not by walking ids
        conn.execute("UPDATE image_metadata SET path_hash = NULL WHERE id % 97 = 0 OR id > 3315")
        conn.execute("UPDATE image_metadata SET label_id = NULL WHERE id % 11 = 0")
    cases: list[dict[str, object]] = [
        {"per_label": 4, "seed": 3},
        {"per_label": 40, "seed": 5},  # more than the arc after the pivot: wraps round, then NULL hashes
        {"per_label": 2, "seed": 1, "processed": True},
        {"per_label": 3, "seed": 2, "labels": "a", "order": "random"},
    ]
    before = [ids(db, **case) for case in cases]
    assert "ROW_NUMBER()" in shape(db, per_label=4)
    with raw(db) as conn:
        conn.execute(_INDEX)
        conn.execute("ANALYZE")
    assert "ROW_NUMBER()" not in shape(db, per_label=4)
    assert "ROW_NUMBER()" in shape(db, per_label=4, status="corrupt")  # the partial index cannot serve it
    assert [ids(db, **case) for case in cases] == before
    assert before[0] == reference(db, 4, 3)
    assert before[1] == reference(db, 40, 5)
