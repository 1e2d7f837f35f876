"""dlindex/advisor/server_sample.py and the per-label seek on a real PostgreSQL server (#34).

A server catalog larger than ``sample_rows`` is verified on temporary tables holding every
k-th row (the reads timed there, the winners built there), with the same advice; per-label
sampling's logged window earns the (label_id, path_hash) index its SERVER_SEEK needs, and
after --apply ``dlindex query --per-label`` runs that seek, with the same rows.
"""

from __future__ import annotations

from typing import Any

import pytest

from dlindex import Catalog, QuerySpec, sample_ids
from dlindex.advisor import apply_advice, suggest_indexes
from dlindex.advisor import server as server_module
from dlindex.query.rows import explain

from .test_advisor_postgres import _FILL, ROWS, make_server_catalog, run_workload

psycopg = pytest.importorskip("psycopg")

PER_LABEL_ROWS = 100_000
# a scan's path hashes (any spread values will do) and 40 labels of 2,500 rows: the window reads and
# sorts every row, the seek 40 x 3 short index ranges (at a few hundred rows a label, the outer
# lookups of the sampled ids weigh as much as the window's pass: no index earns its keep)
_PER_LABEL = """UPDATE image_metadata SET path_hash = (id::bigint * 2654435761) % 4294967296 * 268435456,
    label_id = label_id % 40 + 1"""


def per_label_catalog(url: str) -> None:
    with Catalog(url, create=True, log=False) as catalog:
        conn = catalog.conn
        conn.execute_raw("INSERT INTO roots (id, path) VALUES (1, '/data/train')")
        conn.execute_raw("INSERT INTO labels (id, name) SELECT i, 'class_' || i FROM generate_series(1, 200) i")
        conn.execute_raw(_FILL, (PER_LABEL_ROWS,))
        conn.execute_raw(_PER_LABEL)
        conn.execute_raw("DELETE FROM labels WHERE id > 40")
        conn.execute_raw("VACUUM ANALYZE")
        conn.execute_raw("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


def test_a_large_catalog_is_verified_on_a_sample_in_temporary_tables(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_server_catalog(pg_url, {"planted_width_height": "width, height"})
    run_workload(pg_url)
    with Catalog(pg_url, log=False) as catalog:
        full = suggest_indexes(catalog, top=5)
    seen: list[int] = []
    timed = server_module.time_run

    def counting(conn: Any, run: Any, runs: int) -> Any:  # the rows each timed read had to read from
        seen.append(int(conn.execute_raw("SELECT count(*) FROM image_metadata").fetchone()[0]))
        return timed(conn, run, runs)

    monkeypatch.setattr(server_module, "time_run", counting)
    with Catalog(pg_url, log=False) as catalog:
        sampled = suggest_indexes(catalog, top=5, sample_rows=5_000)
        left = catalog.conn.execute_raw("SELECT to_regclass('pg_temp.image_metadata')").fetchone()  # type: ignore[attr-defined]
    assert full.sample == 1 and sampled.sample == ROWS // 5_000 and sampled.sampled_from == ROWS
    assert seen and set(seen) == {ROWS // sampled.sample}, seen  # every timed read ran on the sample
    assert left == (None,)  # the temporary tables are gone
    assert {s.sql for s in sampled.suggestions} == {s.sql for s in full.suggestions}, sampled.suggestions
    assert sampled.server is not None and "on a sample: every 4th row of image_metadata" in sampled.server["verified"]
    assert all(s.after_ms < s.before_ms for s in sampled.suggestions)


@pytest.mark.parametrize("sample_rows", [250_000, 25_000])
def test_per_label_sampling_earns_the_index_its_seek_needs(pg_url: str, sample_rows: int) -> None:
    per_label_catalog(pg_url)
    spec = QuerySpec(per_label=5, seed=3, cache=False)
    with Catalog(pg_url) as catalog:
        assert "ROW_NUMBER()" in explain(catalog, spec).sql
        before = sample_ids(catalog, per_label=5, seed=3, cache=False)
        for _ in range(20):
            sample_ids(catalog, per_label=5, seed=3, cache=False)
    with Catalog(pg_url, log=False) as catalog:
        advice = suggest_indexes(catalog, top=5, sample_rows=sample_rows)
        wanted = [s for s in advice.suggestions if s.columns[:2] == ("label_id", "path_hash")]
        assert len(wanted) == 1, (advice.suggestions, advice.rejected)
        (served,) = wanted[0].served
        assert "ROW_NUMBER()" in served.sql and served.after_ms < served.before_ms
        apply_advice(catalog, advice)
    with Catalog(pg_url, log=False) as catalog:
        shape = explain(catalog, spec).sql
        assert "ROW_NUMBER()" not in shape and "LATERAL" in shape, shape
        assert sample_ids(catalog, per_label=5, seed=3, cache=False) == before
