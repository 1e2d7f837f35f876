"""Index advice a user can trust: the README tour, stable advice, --apply of what was printed, replay limits.

As in test_advisor_suggest.py, the logged catalog's durations are pinned and replays are timed
by their VM steps, so "the same advice twice" and "slower without it" are decided the same way
under any load; the replay limits stay on the wall clock.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlindex import Catalog
from dlindex.advisor import Advice, suggest_indexes
from dlindex.advisor.scratch import PREFIX, remove_leftovers
from dlindex.pids import process_start

from .advisor_workload import (
    MARK,
    copy_catalog,
    make_catalog,
    pin_logged_durations,
    run_workload,
    snapshot,
    steps_clock,
)
from .conftest import invoke, rows

REPO = Path(__file__).resolve().parents[1]
COUNT_FOREVER = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000000000) SELECT count(*) FROM n"
)
CROSS_JOIN = "SELECT count(*) FROM image_metadata AS a, image_metadata AS b, image_metadata AS c WHERE a.width + b.width > c.height"
HUGE_STRING = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400000) "
               "SELECT length(group_concat(hex(randomblob(1000)))) FROM n")  # fmt: skip


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLINDEX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("dlindex.advisor.suggest.RUNS", 2)  # keep the suite fast


@pytest.fixture(scope="module", autouse=True)
def replays_timed_by_steps() -> Iterator[None]:
    with steps_clock():
        yield


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = make_catalog(
        tmp_path_factory.mktemp("trust") / "logged.db",
        {"planted_wh": "width, height", "planted_processed": "processed"},
    )
    run_workload(path)
    pin_logged_durations(path)
    return path


@pytest.fixture
def db(logged: Path, tmp_path: Path) -> Path:
    return copy_catalog(logged, tmp_path / "catalog.db")


def cli(runner: CliRunner, *args: str, input: str | None = None) -> tuple[int, str, str]:
    result = invoke(runner, *args, input=input)
    return result.exit_code, result.stdout, result.stderr


def test_the_readme_tour_then_index_suggest(runner: CliRunner, image_tree: Path, tmp_path: Path) -> None:
    db = str(tmp_path / "train.db")
    assert cli(runner, "scan", str(image_tree), "--db", db)[0] == 0
    assert cli(runner, "scan", str(image_tree), "--db", db)[0] == 0
    assert cli(runner, "stats", "--db", db)[0] == 0
    assert cli(runner, "query", "--per-label", "2", "--seed", "0", "--format", "paths", "--db", db)[0] == 0
    code, out, _ = cli(runner, "query", "--unprocessed", "--format", "jsonl", "--db", db)
    assert code == 0
    assert cli(runner, "mark", "--processed", "-", "--db", db, input=out)[0] == 0
    code, out, err = cli(runner, "index", "--suggest", "--db", db)
    assert code == 0 and "Traceback" not in err, err
    assert "logged read statements" in out
    code, out, err = cli(runner, "index", "--json", "--db", db)
    assert code == 0 and json.loads(out)["workload"]["reads"] > 0


def test_statistics_rows_without_an_index_name(db: Path, runner: CliRunner) -> None:
    conn = sqlite3.connect(db)
    conn.execute("ANALYZE")  # a row with idx NULL for each table without an index (scans, query_log, ...)
    conn.commit()
    conn.close()
    assert rows(db, "SELECT count(*) FROM sqlite_stat1 WHERE idx IS NULL")[0][0] > 0
    code, out, err = cli(runner, "index", "--suggest", "--db", str(db))
    assert (code, err) == (0, ""), err
    assert "CREATE INDEX" in out


def _stable(a: Advice) -> tuple[object, ...]:
    return (
        [s.sql for s in a.suggestions], [f.name for f in (*a.unused, *a.redundant, *a.slower)], a.hot,
        [r.sql for r in a.rejected], [(h.fingerprint, h.sql) for h in a.hints], [e.fingerprint for e in a.statements],
    )  # fmt: skip


def test_same_catalog_same_log_same_advice(db: Path, runner: CliRunner) -> None:
    with Catalog(db, log=False) as catalog:
        first, second = suggest_indexes(catalog, runs=2), suggest_indexes(catalog, runs=2)
    assert first.suggestions and _stable(first) == _stable(second)
    code, out1, _ = cli(runner, "index", "--suggest", "--json", "--db", str(db))
    code2, out2, _ = cli(runner, "index", "--suggest", "--json", "--db", str(db))
    assert (code, code2) == (0, 0)
    one, two = json.loads(out1), json.loads(out2)
    assert (
        [s["sql"] for s in one["suggestions"]]
        == [s["sql"] for s in two["suggestions"]]
        == [s.sql for s in first.suggestions]
    )


def test_apply_builds_what_suggest_printed_or_says_why_not(db: Path, runner: CliRunner) -> None:
    code, out, _ = cli(runner, "index", "--suggest", "--db", str(db))
    printed = [
        line.split(" ", 1)[1].rstrip(";")
        for line in out.splitlines()
        if line[:1].isdigit() and ". CREATE INDEX" in line
    ]
    assert code == 0 and printed
    code, out, err = cli(runner, "index", "--apply", "--db", str(db))
    assert code == 0 and "applying the advice `dlindex index --suggest` printed for this state" in err
    created = {r[0] for r in rows(db, "SELECT sql FROM sqlite_master WHERE name LIKE 'idx_dlindex_%'")}
    assert created == set(printed)
    names = sorted(sql.split()[2] for sql in printed)  # --apply prints what it did, not the advice again
    assert sorted(out.splitlines()[:-1]) == [f"created {n}" for n in names] and out.splitlines()[-1].startswith("run ")
    assert cli(runner, "index", "--revert", "--db", str(db))[0] == 0
    with Catalog(db) as catalog:  # the log grows: the stored advice no longer describes this state
        list(catalog.read("SELECT count(*) FROM image_metadata WHERE processed = 0"))
    code, out, err = cli(runner, "index", "--apply", "--json", "--db", str(db))
    assert code == 0 and "computing the advice again:" in err and "the query log changed" in err
    data = json.loads(out)
    assert sorted(data["applied"]["created"]) == sorted(s["name"] for s in data["suggestions"])


def test_no_full_index_led_by_a_flag(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("ANALYZE")
    conn.commit()
    conn.close()
    log = "\n".join(["SELECT processed, count(*) FROM image_metadata GROUP BY processed -- duration_ms=40"] * 20
                    + ["SELECT status, sum(bytes) FROM image_metadata GROUP BY status ORDER BY status -- duration_ms=40"] * 20
                    + ["SELECT id FROM image_metadata WHERE processing_status = ? ORDER BY processing_status -- duration_ms=40"] * 20)  # fmt: skip
    with Catalog(db, log=False) as catalog:
        advice = suggest_indexes(catalog, [("trace.sql", log)], runs=2)
    for sql in [s.sql for s in advice.suggestions] + [r.sql for r in advice.rejected]:
        if " WHERE " not in sql:
            lead = sql.split("(", 1)[1].split(",")[0].strip(" )")
            assert lead not in ("processed", "status", "processing_status"), sql


def test_planted_indexes_unused_or_slower_are_named(db: Path) -> None:
    with Catalog(db, log=False) as catalog:
        advice = suggest_indexes(catalog, runs=2)
    kinds = {f.name: f for f in (*advice.unused, *advice.redundant, *advice.slower)}
    assert (kinds["planted_wh"].kind, kinds["planted_wh"].reason) == ("unused", "no logged statement's plan uses it")
    # the hot label query reads 70% of the table through (processed): a scan is faster
    assert kinds["planted_processed"].kind == "slower" and "faster without it" in kinds["planted_processed"].reason
    assert kinds["planted_processed"].drop_sql == "DROP INDEX planted_processed"
    assert not any(f.droppable for f in kinds.values())  # not dlindex's: named, with the DROP INDEX to run yourself


def test_every_logged_statement_is_reported_and_none_gets_slower(db: Path) -> None:
    with Catalog(db, log=False) as catalog:
        advice = suggest_indexes(catalog, runs=2)
    effects = {e.fingerprint: e for e in advice.statements}
    assert {r for r in effects} >= set(advice.hot)
    assert all(e.change != "slower" for e in effects.values() if e.kind == "read"), advice.statements
    (mark,) = [e for e in effects.values() if e.sql == MARK]
    assert mark.kind == "write" and mark.before_ms is not None and mark.after_ms is not None
    assert mark.change == "counted against the suggestions"  # the partial index WHERE processed = 1 moves rows
    assert all(s.write_cost_ms >= 0 for s in advice.suggestions)


def test_a_runaway_statement_is_skipped_and_the_advice_goes_on(db: Path) -> None:
    before = snapshot(db)
    started = time.monotonic()
    with Catalog(db, log=False) as catalog:
        advice = suggest_indexes(catalog, [("trace.sql", f"{COUNT_FOREVER}\n{CROSS_JOIN}\n")], runs=2, time_limit_s=0.5)
    assert time.monotonic() - started < 60
    replays = {s.text: s.reason for s in advice.skipped if s.source == "replay"}
    assert len(replays) == 2 and all("ran longer than the 0.5 s limit per statement" in r for r in replays.values()), (
        advice.skipped
    )
    assert any(s.where == "processed = 1" for s in advice.suggestions)  # the rest is advised as before
    assert snapshot(db) == before


def test_a_statement_past_the_memory_limit_is_skipped(db: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.sql"
    trace.write_text(HUGE_STRING + "\n")
    # its own process: SQLite's heap limit, once lowered, holds for the rest of the process; a time
    # limit it cannot reach first, however loaded the machine (it did, at 10 s, under load 12)
    result = subprocess.run(
        [sys.executable, "-m", "dlindex", "index", "--suggest", "--log", str(trace), "--memory-limit", "64",
         "--time-limit", "240", "--db", str(db)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "replay: skipped: needed more than the 64 MiB memory limit" in result.stderr
    assert "Traceback" not in result.stderr and "CREATE INDEX" in result.stdout


def test_leftovers_of_dead_runs_are_removed_never_a_live_ones(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = os.getpid()
    made = {
        "dead": tmp_path / f"{PREFIX}{dead.pid}-1-abc",
        "live": tmp_path / f"{PREFIX}{me}-{process_start(me)}-def",
        "reused": tmp_path / f"{PREFIX}{me}-1-ghi",  # this pid, but a process that started at another time
        "foreign": tmp_path / f"{PREFIX}{dead.pid}-1-jkl",
        "unnamed": tmp_path / f"{PREFIX}mkdtemp",
    }
    for path in made.values():
        path.mkdir()
        (path / "scratch.db").write_bytes(b"x")
    (made["foreign"] / "notes.txt").write_text("not ours")
    removed = remove_leftovers(tmp_path)
    assert sorted(removed) == sorted([made["dead"], made["reused"]])
    assert all(made[k].exists() for k in ("live", "foreign", "unnamed"))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_in_the_middle_leaves_no_scratch_copy_for_good(db: Path, tmp_path: Path, sig: signal.Signals) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp)}
    slow = tmp_path / "slow.sql"
    slow.write_text(COUNT_FOREVER + "\n")  # keeps the run busy on its scratch copy for the time limit
    cmd = [
        sys.executable,
        "-m",
        "dlindex",
        "index",
        "--suggest",
        "--log",
        str(slow),
        "--time-limit",
        "30",
        "--db",
        str(db),
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(tmp.glob(f"{PREFIX}*/scratch.db")):
        time.sleep(0.02)
    time.sleep(0.5)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    if sig == signal.SIGTERM:
        assert proc.returncode == 130 and b"Error: index advice interrupted" in err, err
        assert not list(tmp.iterdir())
    else:
        assert list(tmp.glob(f"{PREFIX}*"))  # kill -9 gives no chance to clean up ...
        quick = subprocess.run(
            [*cmd[:5], "--time-limit", "0.2", "--db", str(db)], env=env, capture_output=True, timeout=300
        )
        assert quick.returncode == 0, quick.stderr
        assert not list(tmp.iterdir())  # ... the next run does


def test_reads_through_json_each_replay_and_the_schema_stays_unwritable(db: Path) -> None:
    from dlindex.catalog.sandbox import guarded

    conn = guarded(db)
    try:
        found = conn.execute(
            "SELECT id FROM labels WHERE name IN (SELECT value FROM json_each(?))", ('["class_0001"]',)
        )
        assert found.fetchall() == [(1,)]  # Catalog.query(labels=[...]) reads like this
        for sql in ("UPDATE sqlite_master SET name = 'x'", "UPDATE sqlite_master SET type = 1 WHERE 0"):
            with pytest.raises(sqlite3.DatabaseError):
                conn.execute(sql)
    finally:
        conn.close()


def test_inserts_into_a_table_keyed_by_two_columns_are_measured(tmp_path: Path) -> None:
    """image_features (a rowid table with PRIMARY KEY (image_id, feature_type)): the measured
    insert copied rows onto their own keys, failed, and an index there was charged nothing for
    the logged inserts ("not measured (only INSERT and UPDATE are)" beside an INSERT)."""
    import sqlite3

    from dlindex.advisor.replay import WriteCosts
    from dlindex.advisor.scratch import CopyStatistics
    from dlindex.advisor.shapes import TableInfo

    path = tmp_path / "pk.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE f (image_id INTEGER NOT NULL, kind TEXT NOT NULL, v BLOB, PRIMARY KEY (image_id, kind))")
    conn.executemany("INSERT INTO f VALUES (?, ?, ?)", [(i, k, b"x") for i in range(200) for k in ("a", "b")])
    info = TableInfo.make("f", ["image_id", "kind", "v"], None)
    writes = WriteCosts(conn, path, CopyStatistics(conn))
    writes.pick_rows("f", info)
    inserted, updated = writes.measure("f", info, ["v"], runs=1)
    assert inserted is not None and updated is not None
    assert conn.execute("SELECT count(*) FROM f").fetchone()[0] == 400  # rolled back
    conn.close()
