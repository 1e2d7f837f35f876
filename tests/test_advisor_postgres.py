"""dlindex/advisor/server.py, server_workload, server_plans, manage: `dlindex index` on a real PostgreSQL server.

A 20,000-row catalog is written by SQL on the server, a workload is run through dlindex (so
the query log and pg_stat_statements both see it), then the advice (nothing built but dlindex's
own candidates, in a transaction rolled back), the library's entry points, --apply / --list /
--revert / --drop-unused and the bad-input lines are checked.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dlindex import Catalog, QuerySpec, query_rows
from dlindex.advisor import server as server_module
from dlindex.advisor.server_workload import server_fingerprint
from dlindex.catalog.postgres.dialect import translate
from dlindex.catalog.sqlite.history_schema import SCHEMA_INDEXES, SERVER_SEARCH_INDEX

from .conftest import invoke, one_error_line

psycopg = pytest.importorskip("psycopg")

ROWS, LABELS = 20_000, 200
LABEL_FILES = "SELECT file_path, label_id FROM image_metadata WHERE label_id = ? AND processed = 1"
FAILED = "SELECT id, file_path, error FROM image_metadata WHERE processing_status = 'failed' ORDER BY id"
HOURLY = "SELECT id FROM image_metadata WHERE bytes > ? ORDER BY bytes DESC LIMIT 5"
MARK = "UPDATE image_metadata SET processed = 1 WHERE id = ?"
_FILL = """INSERT INTO image_metadata (id, root_id, file_path, label_id, width, height, format, mode, bytes, mtime_ns,
    xxh3_128, status, processed, processing_status, created_at, updated_at)
SELECT i, 1, 'class_' || lpad(((i / 100) * 7919 %% 200 + 1)::text, 4, '0') || '/' || lpad(i::text, 8, '0') || '.jpg',
    (i / 100) * 7919 %% 200 + 1, 64 + a %% 961, 64 + (a / 961) %% 961, 'JPEG', 'RGB', 20000 + a %% 200000, i,
    lpad(to_hex(a), 16, '0'), CASE WHEN b %% 1000 < 10 THEN 'corrupt' ELSE 'ok' END,
    CASE WHEN b %% 100 < 70 THEN 1 ELSE 0 END,
    CASE WHEN b %% 100 < 70 THEN 'completed' WHEN b %% 100 < 72 THEN 'failed' END, '2026-01-01 00:00:00', '2026-01-01 00:00:00'
FROM (SELECT i, (i::bigint * 2654435761) %% 4294967296 AS a, (i::bigint * 40503 + 12345) %% 65536 AS b
      FROM generate_series(1, %s) i) s"""


def make_server_catalog(url: str, planted: dict[str, str] | None = None) -> None:
    """ROWS images in LABELS labels on the server; ``planted`` name -> columns indexes; ANALYZE."""
    with Catalog(url, create=True, log=False) as catalog:
        conn = catalog.conn
        conn.execute_raw("INSERT INTO roots (id, path) VALUES (1, '/data/train')")
        conn.execute_raw(
            "INSERT INTO labels (id, name) SELECT i, 'class_' || lpad(i::text, 4, '0') FROM generate_series(1, %s) i",
            (LABELS,),
        )
        conn.execute_raw(_FILL, (ROWS,))
        for name, columns in (planted or {}).items():
            conn.execute_raw(f"CREATE INDEX {name} ON image_metadata ({columns})")
        conn.execute_raw("ANALYZE")
        conn.execute_raw("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


def run_workload(url: str) -> None:
    rng = random.Random(0)
    with Catalog(url) as catalog:
        for _ in range(300):
            list(catalog.read(LABEL_FILES, (rng.randint(1, LABELS),)))
        for _ in range(30):
            list(catalog.read(FAILED))
        list(catalog.read(HOURLY, (210_000,)))
        with catalog.write_transaction() as conn:
            conn.executemany(MARK, [(i,) for i in range(1, 200)])


def index_defs(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1"
        ).fetchall()


def extensions(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT extname FROM pg_extension").fetchall()}


@pytest.fixture
def logged(pg_url: str) -> str:
    make_server_catalog(pg_url, {"planted_width_height": "width, height"})
    run_workload(pg_url)
    return pg_url


def suggest_json(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> dict[str, Any]:
    monkeypatch.setenv("DLINDEX_CACHE_DIR", str(tmp_path / "cache"))
    result = invoke(CliRunner(), "index", *args, "--json", "--db", url)
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_a_logged_statement_joins_its_pg_stat_statements_entry() -> None:
    logged = translate("SELECT id, name FROM labels WHERE name IN (SELECT value FROM json_each(:names))").text
    seen = ('DECLARE "dlindex_read_7" CURSOR WITH HOLD FOR SELECT id, name FROM labels WHERE name IN '
            "(SELECT value FROM unnest($1::text[]) WITH ORDINALITY AS json_each(value, key))")  # fmt: skip
    assert server_fingerprint(logged) == server_fingerprint(seen)
    assert server_fingerprint("UPDATE image_metadata SET processed = $2 WHERE id = $1") == server_fingerprint(
        translate(MARK.replace("1 WHERE", "? WHERE")).text
    )


def test_suggest_verifies_on_the_server_and_builds_no_competitor(
    logged: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = index_defs(logged)
    timed = server_module._time_all

    def time_all_then_flush(conn: Any, *args: Any, **kwargs: Any) -> Any:  # as on a slow machine: the server's
        out = timed(conn, *args, **kwargs)  # statistics see the advisor's own scans before it reads them
        conn.execute_raw("SELECT pg_stat_force_next_flush()")
        return out

    monkeypatch.setattr(server_module, "_time_all", time_all_then_flush)
    trace = tmp_path / "trace.sql"  # an expensive ad-hoc statement, seen once
    trace.write_text("SELECT id FROM image_metadata WHERE width = 100 AND height = 200 -- duration_ms=900\n")
    advice = suggest_json(logged, tmp_path, monkeypatch, "--suggest", "--log", str(trace))
    assert index_defs(logged) == before  # --suggest builds nothing that stays
    sqls = [s["sql"] for s in advice["suggestions"]]
    assert any(re.search(r"\(label_id\).* WHERE processed = 1$", s) for s in sqls), sqls
    assert any("WHERE processing_status = 'failed'" in s for s in sqls), sqls
    assert all(len(s["name"]) < 64 for s in advice["suggestions"])
    server = advice["postgresql"]
    assert server["workload"]["joined"] >= 3
    assert server["verified"].startswith("timed on the server")
    assert "dexter" not in server and set(server["workload_ms"]) == {"before", "dlindex"}  # a benchmark's, not ours
    ms = server["workload_ms"]
    assert ms["dlindex"] < ms["before"] / 5, ms
    with psycopg.connect(logged) as conn:  # the only indexes ever built were dlindex's candidates
        rows = conn.execute(  # this database's: the server may hold others (a benchmark's Dexter indexes)
            r"SELECT query FROM pg_stat_statements WHERE query ~* '^\s*(/\*.*?\*/\s*)?CREATE INDEX' "
            "AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        built = [
            r[0]
            for r in rows
            if "planted_" not in r[0] and not any(n in r[0] for n in (*SCHEMA_INDEXES, SERVER_SEARCH_INDEX))
        ]  # the fixture's, the schema's
    assert built and all("idx_dlindex_" in q for q in built), built
    unused = {f["name"]: f for f in advice["unused"]}
    assert unused["planted_width_height"]["droppable"] is False  # made by hand: reported, never dropped
    assert not [e for e in advice["statements"] if e["change"] == "slower"]
    once = [e["fingerprint"] for e in advice["statements"] if "bytes >" in e["sql"] or "width = 100" in e["sql"]]
    assert len(once) == 2 and not set(once) & set(advice["workload"]["hot"])  # seen once: no index, however slow
    assert not any("width" in s or "height" in s for s in sqls), sqls


def test_the_failed_list_as_dlindex_query_writes_it_gets_its_partial_index(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``query --processing-status failed`` (status = 'ok' AND ... AND excluded = 0 ORDER BY id) reads more
    columns than an index covers: its partial (id) candidate must not be taken as served by the primary key."""
    make_server_catalog(pg_url)
    spec = QuerySpec(processing_status=("failed",), columns=("id", "path", "error"), cache=False)
    with Catalog(pg_url) as catalog:
        for _ in range(30):
            list(query_rows(catalog, spec))
    advice = suggest_json(pg_url, tmp_path, monkeypatch, "--suggest")
    (failed,) = [e for e in advice["statements"] if "processing_status = 'failed'" in e["sql"]]
    assert "excluded = 0" in failed["sql"] and "status = 'ok'" in failed["sql"], failed["sql"]
    wheres = [
        s["where"] for s in advice["suggestions"] if failed["fingerprint"] in [x["fingerprint"] for x in s["served"]]
    ]
    assert wheres == ["excluded = 0 AND processing_status = 'failed' AND status = 'ok'"], advice["suggestions"]
    assert failed["change"] == "faster", failed


def test_the_library_entry_points_take_a_server_catalog(logged: str) -> None:
    """suggest_indexes, list_indexes, apply_advice and revert_indexes on a server catalog, as the CLI
    does; the first two used to open the URL as an SQLite file ("unable to open database file")."""
    from dlindex.advisor import apply_advice, list_indexes, revert_indexes, suggest_indexes

    with Catalog(logged, log=False) as catalog:
        advice = suggest_indexes(catalog, top=5)
        assert advice.server is not None and advice.suggestions, advice
        origins = {u.name: u.origin for u in list_indexes(catalog)}
        assert origins["image_metadata_pkey"] == "constraint" and origins["planted_width_height"] == "manual"
        changes = apply_advice(catalog, advice)
        assert {c.name for c in changes.changes} == {s.name for s in advice.suggestions}
        assert {u.name: u.origin for u in list_indexes(catalog)}[advice.suggestions[0].name] == "dlindex"
        assert revert_indexes(catalog).run == changes.run
    assert not [n for n, _sql in index_defs(logged) if n.startswith("idx_dlindex_")]


def test_apply_list_revert_and_drop_unused(logged: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = index_defs(logged)
    suggest_json(logged, tmp_path, monkeypatch, "--suggest")
    result = invoke(CliRunner(), "index", "--apply", "--db", logged)
    assert result.exit_code == 0, result.output
    assert "applying the advice `dlindex index --suggest` printed for this state" in result.stderr
    created = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("created ")]
    assert created and all(n.startswith("idx_dlindex_") for n in created)
    with psycopg.connect(logged) as conn:
        assert not conn.execute("SELECT 1 FROM pg_index WHERE NOT indisvalid").fetchall()
        runs = conn.execute("SELECT DISTINCT run, action FROM index_changes").fetchall()
    assert runs == [(1, "create")]
    listed = json.loads(invoke(CliRunner(), "index", "--list", "--json", "--db", logged).stdout)["indexes"]
    origins = {u["name"]: u["origin"] for u in listed}
    assert {origins[n] for n in created} == {"dlindex"}
    assert origins["planted_width_height"] == "manual" and origins["image_metadata_pkey"] == "constraint"
    # nothing ran since: every new index is unused, and --drop-unused drops only dlindex's
    dropped = invoke(CliRunner(), "index", "--drop-unused", "--yes", "--json", "--db", logged)
    assert dropped.exit_code == 0, dropped.output
    assert sorted(json.loads(dropped.stdout)["applied"]["dropped"]) == sorted(created)
    assert "planted_width_height" in dict(index_defs(logged))
    reverted = invoke(CliRunner(), "index", "--revert", "--db", logged)  # undo the drop: they are back
    assert reverted.exit_code == 0 and "reverted run 2" in reverted.stdout
    assert {n for n in created} <= dict(index_defs(logged)).keys()
    invoke(CliRunner(), "index", "--revert", "--db", logged)  # undo the apply
    assert index_defs(logged) == before


def test_no_workload_is_one_line_and_nothing_is_written(pg_url: str) -> None:
    make_server_catalog(pg_url)
    line = one_error_line(invoke(CliRunner(), "index", "--suggest", "--db", pg_url))
    assert line.startswith("Error: no workload yet:"), line
    assert "hypopg" not in extensions(pg_url)


def test_without_the_pg_stat_statements_extension(pg_url: str) -> None:
    make_server_catalog(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP EXTENSION pg_stat_statements")
    run_workload(pg_url)
    line = one_error_line(invoke(CliRunner(), "index", "--suggest", "--db", pg_url))
    assert "CREATE EXTENSION pg_stat_statements" in line and "nothing was changed" in line, line
    assert not {"hypopg", "pg_stat_statements"} & extensions(pg_url)
