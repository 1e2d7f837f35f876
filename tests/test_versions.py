"""Catalog versions: every changing command is a numbered version, `--at` reads any of them as
it stood, tags name them, `diff` says what changed; on both backends."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dlindex import Catalog, InputError, mark_samples, query_rows
from dlindex.catalog.as_of import resolve
from dlindex.catalog.diff import diff_states
from dlindex.catalog.sqlite.migrations import m019_versions
from dlindex.catalog.versions import list_versions, tag
from dlindex.cli import app

from .backends import ON_BOTH_BACKENDS, is_server, raw, schema_before
from .conftest import export, make_png, rows, scan

pytestmark = ON_BOTH_BACKENDS


def versions(db: Path) -> list[tuple[int, str, dict[str, object] | None]]:
    """(number, command word, summary) of each version; numbers only grow (a dropped one leaves a gap)."""
    with Catalog(db) as catalog:
        return [(v.id, v.command.split()[0], v.summary) for v in list_versions(catalog)]


def numbers(db: Path) -> list[str]:
    return [str(v[0]) for v in versions(db)]


def paths_at(db: Path, at: str | None, **spec: object) -> list[str]:
    with Catalog(db, at=at) as catalog:
        return [str(r["path"]).rsplit("/", 2)[-2] + "/" + str(r["path"]).rsplit("/", 1)[-1]
                for r in query_rows(catalog, columns=("path",), **spec)]  # fmt: skip


def mark(db: Path, ids: list[int], **values: object) -> None:
    with Catalog(db) as catalog:
        mark_samples(catalog, [str(i) for i in ids], **values)  # type: ignore[arg-type]


def test_each_changing_command_is_a_version_and_at_reads_it_as_it_stood(scanned_db: Path, image_tree: Path) -> None:
    assert versions(scanned_db) == [(1, "scan", {"corrupt": 1, "new": 7})]
    scan(scanned_db, image_tree)  # nothing changed: no version
    assert len(versions(scanned_db)) == 1
    mark(scanned_db, [1, 2], excluded=True)
    make_png(image_tree / "bird" / "new.png", (9, 9), (1, 2, 3))
    (image_tree / "dog" / "002.png").unlink()
    scan(scanned_db, image_tree, prune=True)
    assert [v[1] for v in versions(scanned_db)] == ["scan", "mark", "scan"]
    assert versions(scanned_db)[2][2] == {"missing": 1, "new": 1, "pruned": 1}
    first, marked, last = numbers(scanned_db)
    v1 = ["cat/000.png", "cat/001.png", "cat/002.png", "dog/000.png", "dog/001.png", "dog/002.png"]
    assert paths_at(scanned_db, first) == v1
    assert paths_at(scanned_db, "v" + marked) == v1[2:]  # excluded from selections from then on
    assert paths_at(scanned_db, last) == ["cat/002.png", "dog/000.png", "dog/001.png", "bird/new.png"]
    assert paths_at(scanned_db, None) == paths_at(scanned_db, "latest")
    # label_id numbers each state's own class list: "bird" came with the last version
    columns = ("label", "label_id")
    with Catalog(scanned_db, at=marked) as catalog:
        assert {r["label"]: r["label_id"] for r in query_rows(catalog, columns=columns)} == {"cat": 0, "dog": 1}
    with Catalog(scanned_db) as catalog:
        got = {r["label"]: r["label_id"] for r in query_rows(catalog, columns=columns)}
    assert got == {"bird": 0, "cat": 1, "dog": 2}


def test_a_class_that_went_away_keeps_its_name_at_the_old_state(scanned_db: Path, image_tree: Path) -> None:
    for f in (image_tree / "cat").iterdir():
        f.unlink()
    scan(scanned_db, image_tree, prune=True)
    assert rows(scanned_db, "SELECT name FROM labels ORDER BY name") == [("dog",)]
    with Catalog(scanned_db, at="1") as catalog:
        got = {(r["label"], r["label_id"]) for r in query_rows(catalog, columns=("label", "label_id"))}
    assert got == {("cat", 0), ("dog", 1)}
    assert paths_at(scanned_db, "1", labels=("cat",)) == ["cat/000.png", "cat/001.png", "cat/002.png"]


def test_diff_names_each_kind_of_change_reading_only_what_changed(scanned_db: Path, image_tree: Path) -> None:
    mark(scanned_db, [1], processed=True)
    make_png(image_tree / "cat" / "001.png", (40, 40), (9, 9, 9))  # new content
    make_png(image_tree / "bird" / "b.png", (9, 9), (1, 2, 3))
    (image_tree / "dog" / "000.png").unlink()
    scan(scanned_db, image_tree)
    with Catalog(scanned_db) as catalog:
        changes = {c.path.rsplit("/", 2)[-2] + "/" + c.path.rsplit("/", 1)[-1]: c for c in diff_states(
            catalog, resolve(catalog.conn, "1").state, catalog.changes())}  # fmt: skip
        back = {c.id: c.kinds for c in diff_states(catalog, catalog.changes(), resolve(catalog.conn, "1").state)}
    assert {p: c.kinds for p, c in changes.items()} == {
        "cat/000.png": ("flags",), "cat/001.png": ("content",), "dog/000.png": ("status",), "bird/b.png": ("added",),
    }  # fmt: skip
    assert changes["cat/000.png"].changed == {"processed": [0, 1]}
    assert changes["dog/000.png"].changed["status"] == ["ok", "missing"]
    assert changes["cat/001.png"].changed["width"] == [17, 40]
    assert sorted(back.values()) == sorted([("flags",), ("content",), ("status",), ("removed",)])


def test_diff_rows_pipe_into_mark_and_counts_print_at_a_terminal(
    scanned_db: Path, image_tree: Path, runner: CliRunner
) -> None:
    make_png(image_tree / "bird" / "b.png", (9, 9), (1, 2, 3))
    scan(scanned_db, image_tree)
    db = ["--db", str(scanned_db)]
    lines = runner.invoke(app, ["diff", "1", *db, "--format", "jsonl"]).stdout.splitlines()
    assert [json.loads(line)["changes"] for line in lines] == [["added"]]
    marked = runner.invoke(app, ["mark", "--processed", "-", *db], input="\n".join(lines))
    assert marked.exit_code == 0, marked.output
    first, added, marked = numbers(scanned_db)
    counts = runner.invoke(app, ["diff", first, added, *db, "--json"])
    assert json.loads(counts.stdout)["added"] == 1
    assert json.loads(runner.invoke(app, ["diff", added, marked, *db, "--json"]).stdout)["flags"] == 1


def test_tags_name_versions_move_and_go(scanned_db: Path, runner: CliRunner) -> None:
    mark(scanned_db, [1], processed=True)
    db = ["--db", str(scanned_db)]
    assert runner.invoke(app, ["tag", "release-1", "1", *db]).exit_code == 0
    assert (
        runner.invoke(app, ["tag", "nightly", *db]).stdout.strip() == f"tag nightly -> version {numbers(scanned_db)[1]}"
    )
    assert paths_at(scanned_db, "release-1", processed=True) == []
    assert len(paths_at(scanned_db, "nightly", processed=True)) == 1
    assert runner.invoke(app, ["tag", "release-1", "nightly", *db]).exit_code == 0  # moved
    with Catalog(scanned_db) as catalog:
        assert [v.tags for v in list_versions(catalog)] == [(), ("nightly", "release-1")]
    assert runner.invoke(app, ["tag", "nightly", "--delete", *db]).exit_code == 0
    for bad in ("7up", "latest", "a b", "", "x" * 101, "-rf"):
        result = runner.invoke(app, ["tag", bad, *db] if bad != "-rf" else ["tag", "--", bad, *db])
        assert result.exit_code != 0 and "Traceback" not in result.output, bad


@pytest.mark.parametrize("at", ["9", "v0", "nope", "latest-1", "/no/such/export"])
def test_at_a_version_that_is_not_there_is_one_line(scanned_db: Path, runner: CliRunner, at: str) -> None:
    result = runner.invoke(app, ["query", "--at", at, "--db", str(scanned_db)])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ") and len(result.stderr.strip().splitlines()) == 1


def test_at_an_export_reads_the_state_it_was_written_from(scanned_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    export(scanned_db, out, format="jsonl")
    mark(scanned_db, [1, 2, 3], excluded=True)
    assert len(paths_at(scanned_db, str(out))) == 6
    assert len(paths_at(scanned_db, None)) == 3


def test_a_pinned_catalog_writes_no_rows(scanned_db: Path) -> None:
    with Catalog(scanned_db, at="1") as catalog, pytest.raises(Exception, match=r"(?i)view|cannot|read-only"):
        mark_samples(catalog, ["1"], processed=True)
    assert rows(scanned_db, "SELECT count(*) FROM image_metadata WHERE processed = 1") == [(0,)]


def test_a_killed_command_keeps_its_version_and_the_next_one_closes_it(scanned_db: Path) -> None:
    program = textwrap.dedent(f"""
        import os, signal
        from dlindex import Catalog
        with Catalog({str(scanned_db)!r}) as catalog, catalog.versioned("mark killed"):
            with catalog.write_transaction() as conn:
                conn.execute("UPDATE image_metadata SET processed = 1 WHERE id = 1")
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", program], check=False, env={**os.environ, "DLINDEX_NO_LOG": "1"})
    assert done.returncode == -signal.SIGKILL
    mark(scanned_db, [2], processed=True)
    with Catalog(scanned_db) as catalog:
        listed = list(list_versions(catalog))
    assert [(v.command, (v.summary or {}).get("interrupted")) for v in listed] == [
        (listed[0].command, None), ("mark killed", "killed"), (listed[2].command, None),
    ]  # fmt: skip
    assert len(paths_at(scanned_db, str(listed[1].id), processed=True)) == 1  # what it committed stays, readable


def test_a_catalog_from_before_versions_starts_at_version_1(scanned_db: Path) -> None:
    mark(scanned_db, [1], processed=True)
    schema_before(scanned_db, m019_versions)
    mark(scanned_db, [2], processed=True)  # migrates, then writes version 2
    assert [v[1] for v in versions(scanned_db)] == ["catalog", "mark"]
    before, after = numbers(scanned_db)
    assert len(paths_at(scanned_db, before, processed=True)) == 1
    assert len(paths_at(scanned_db, after, processed=True)) == 2


def test_history_grows_with_the_changes_not_the_catalog(scanned_db: Path, image_tree: Path) -> None:
    scan(scanned_db, image_tree, force=True)  # every file read again, nothing changed
    assert rows(scanned_db, "SELECT count(*) FROM image_history") == [(0,)]
    for value in (True, False, True):
        mark(scanned_db, [1], processed=value)
    assert rows(scanned_db, "SELECT count(*) FROM image_history") == [(3,)]
    assert [len(paths_at(scanned_db, v, processed=True)) for v in numbers(scanned_db)] == [0, 1, 0, 1]


def test_another_programs_writes_are_kept_too(scanned_db: Path) -> None:
    with raw(scanned_db) as conn:
        conn.execute("UPDATE image_metadata SET split = 'train' WHERE id = 1")
    assert rows(scanned_db, "SELECT id, split FROM image_history") == [(1, None)]


def test_a_server_catalog_gives_writers_states_in_commit_order(scanned_db: Path) -> None:
    if not is_server(scanned_db):
        pytest.skip("SQLite has one writer at a time")
    with Catalog(scanned_db) as first, Catalog(scanned_db) as second:
        with first.write_transaction() as conn:
            conn.execute("UPDATE image_metadata SET processed = 1 WHERE id = 1")
        with second.write_transaction() as conn:
            conn.execute("UPDATE image_metadata SET processed = 1 WHERE id = 2")
    states = rows(scanned_db, "SELECT valid_from FROM image_metadata WHERE id IN (1, 2) ORDER BY id")
    assert states[0][0] < states[1][0]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=40))
def test_at_takes_any_text_and_answers_or_refuses_in_one_line(scanned_db: Path, text: str) -> None:
    if is_server(scanned_db):
        pytest.skip("the resolver is the same code on both backends; fuzzed once")
    with Catalog(scanned_db) as catalog:
        tag(catalog, "t1", 1)
        try:
            pinned = resolve(catalog.conn, text)
        except InputError as e:
            assert "\n" not in str(e)
        else:
            assert pinned.version == 1  # the only version: by number, v-number, tag or latest


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "wds", "csv"])
def test_export_at_a_version_writes_that_selection_and_can_be_written_again(
    scanned_db: Path, tmp_path: Path, runner: CliRunner, fmt: str
) -> None:
    db = ["--db", str(scanned_db)]
    before = tmp_path / "before"
    assert runner.invoke(app, ["export", str(before), "--format", fmt, "--quiet", *db]).exit_code == 0
    mark(scanned_db, [1, 2, 3], excluded=True)
    again, now = tmp_path / "again", tmp_path / "now"
    done = runner.invoke(app, ["export", str(again), "--format", fmt, "--at", str(before), "--quiet", *db])
    assert done.exit_code == 0, done.output
    assert runner.invoke(app, ["export", str(now), "--format", fmt, "--quiet", *db]).exit_code == 0
    index = "_index.json" if fmt == "parquet" else "index.json"
    first, second, third = (json.loads((p / index).read_text()) for p in (before, again, now))
    assert first["counts"] == second["counts"] and third["counts"]["samples"] == first["counts"]["samples"] - 3
    assert second["catalog"]["changes"] == first["catalog"]["changes"]  # the state it read: the same one
    verified = runner.invoke(app, ["export", "--verify", str(before), *db])
    assert verified.exit_code == 0 and "has moved on" in verified.stderr
    assert "moved on" not in runner.invoke(app, ["export", "--verify", str(now), *db]).stderr


def test_export_at_is_refused_with_features_and_ray(scanned_db: Path, tmp_path: Path, runner: CliRunner) -> None:
    for extra in (["--features", "dhash"], ["--engine", "ray"]):
        result = runner.invoke(app, ["export", str(tmp_path / "o"), "--at", "1", *extra, "--db", str(scanned_db)])
        assert result.exit_code == 2 and "--at" in result.stderr
    assert not (tmp_path / "o").exists()


def test_a_state_by_its_counter(scanned_db: Path) -> None:
    mark(scanned_db, [1], processed=True)
    with Catalog(scanned_db) as catalog:
        first = next(iter(list_versions(catalog)))
        now = catalog.changes()
    assert paths_at(scanned_db, f"state:{first.last_change}") == paths_at(scanned_db, "1")
    for bad in (f"state:{now + 5}",):
        with pytest.raises(InputError, match="not reached"):
            paths_at(scanned_db, bad)


# --- the history against snapshots: any sequence of writes, every version read back as it was -----

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["mark", "unmark", "exclude", "status", "relabel", "split", "delete", "insert", "raw"]),
        st.integers(min_value=1, max_value=12),
    ),
    min_size=1,
    max_size=12,
)
_SNAPSHOT = """SELECT m.id, m.file_path, l.name, m.split, m.status, m.processed, m.processing_status, m.excluded
    FROM image_metadata m LEFT JOIN labels l ON l.id = m.label_id ORDER BY m.id"""


def _apply(catalog: Catalog, op: str, k: int) -> None:
    """One write, as dlindex's writers (and, "raw", another program's UPDATE) make them."""
    with catalog.versioned(f"test {op}"), catalog.write_transaction() as conn:
        if op == "mark":
            conn.execute("UPDATE image_metadata SET processed = 1 WHERE id % ? = 0", (k,))
        elif op == "unmark":
            conn.execute("UPDATE image_metadata SET processed = 0, processing_status = 'queued' WHERE id % ? = 1", (k,))
        elif op == "exclude":
            conn.execute("UPDATE image_metadata SET excluded = 1 - excluded WHERE id = ?", (k,))
        elif op == "status":
            conn.execute("UPDATE image_metadata SET status = 'missing', error = 'gone' WHERE id = ?", (k,))
        elif op == "relabel":
            conn.execute("INSERT OR IGNORE INTO labels (name) VALUES (?)", (f"class{k % 3}",))
            conn.execute("UPDATE image_metadata SET label_id = (SELECT id FROM labels WHERE name = ?) WHERE id = ?",
                         (f"class{k % 3}", k))  # fmt: skip
            conn.execute(
                "DELETE FROM labels WHERE id NOT IN (SELECT label_id FROM image_metadata WHERE label_id IS NOT NULL)"
            )
        elif op == "split":
            conn.execute(
                "UPDATE image_metadata SET split = CASE WHEN split IS NULL THEN 'train' END WHERE id <= ?", (k,)
            )
        elif op == "delete":
            conn.execute("DELETE FROM image_metadata WHERE id = ?", (k,))
        elif op == "insert":
            conn.execute(
                "INSERT INTO image_metadata (root_id, file_path, label_id, status) "
                "SELECT root_id, ? , label_id, 'ok' FROM image_metadata ORDER BY id LIMIT 1", (f"new/{k}-{os.urandom(4).hex()}.png",)
            )  # fmt: skip
        else:
            conn.execute("UPDATE image_metadata SET processed = 1 - processed, split = 'val' WHERE id % ? = 2", (k,))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
def test_every_version_reads_back_as_it_was_after_any_writes(scanned_db: Path, ops: list[tuple[str, int]]) -> None:
    if is_server(scanned_db):
        pytest.skip("the triggers' semantics are fuzzed on the file catalog; the server's run the fixed cases")
    snapshots: dict[str, list[tuple[object, ...]]] = {}
    with Catalog(scanned_db) as catalog:
        for op, k in ops:
            _apply(catalog, op, k)
            last = list(list_versions(catalog))[-1]
            snapshots[str(last.id)] = [tuple(r) for r in catalog.conn.execute(_SNAPSHOT)]
    for version, rows_then in snapshots.items():
        with Catalog(scanned_db, at=version) as catalog:
            assert [tuple(r) for r in catalog.conn.execute(_SNAPSHOT)] == rows_then, version
    # and diff names exactly the samples whose snapshot rows differ, between any two versions
    with Catalog(scanned_db) as catalog:
        states = {str(v.id): v.last_change for v in list_versions(catalog)}
        made = [v for v in snapshots if v in states]
        for older, newer in itertools.combinations(made, 2):
            before = {r[0]: r for r in snapshots[older]}
            after = {r[0]: r for r in snapshots[newer]}
            expected = {i for i in before.keys() | after.keys() if before.get(i) != after.get(i)}
            found = {c.id for c in diff_states(catalog, states[older], states[newer])}
            assert found == expected, (older, newer)


def test_pruning_forgets_old_versions_and_only_the_history_they_need(scanned_db: Path, runner: CliRunner) -> None:
    for value in (True, False, True):
        mark(scanned_db, [1, 2], processed=value)
    first, a, b, c = numbers(scanned_db)
    db = ["--db", str(scanned_db)]
    assert runner.invoke(app, ["tag", "keep", first, *db]).exit_code == 0
    refused = runner.invoke(app, ["versions", "--prune-before", b, *db])
    assert refused.exit_code == 1 and "keep" in refused.stderr  # a tag names an older version: nothing written
    assert numbers(scanned_db) == [first, a, b, c]
    assert runner.invoke(app, ["tag", "keep", "--delete", *db]).exit_code == 0
    expected = {v: paths_at(scanned_db, v, processed=True) for v in (b, c)}
    done = runner.invoke(app, ["versions", "--prune-before", b, "--json", *db])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["history_rows"] == 4  # the two rows' values before a, and before b
    assert numbers(scanned_db) == [b, c]
    assert {v: paths_at(scanned_db, v, processed=True) for v in (b, c)} == expected
    gone = runner.invoke(app, ["query", "--at", a, *db])
    assert gone.exit_code == 1 and "pruned" in gone.stderr
    assert runner.invoke(app, ["versions", "--json", *db]).exit_code == 2


def test_stats_estimated_from_a_sample_reads_a_past_version_too(scanned_db: Path) -> None:
    from dlindex.stats import catalog_stats

    mark(scanned_db, [1, 2, 3, 4, 5, 6, 7], processed=True)
    for at, processed in (("1", 0), (None, 1)):
        with Catalog(scanned_db, at=at) as catalog:
            estimated = catalog_stats(catalog, exact=False, sample=3)
            exact = catalog_stats(catalog, exact=True)
        assert estimated.estimated and not exact.estimated
        assert exact.processed == 7 * processed and (estimated.processed > 0) == bool(processed)


def test_a_per_label_sample_at_a_version_is_served_by_the_index_and_the_same(tmp_path: Path) -> None:
    """With a (label_id, path_hash) index, a past state's sample seeks the live rows and reads
    only the history rows before each label's N-th one (the schema's history index); it must
    give the rows the one-pass statement gives, every column, for every N (a label with fewer
    rows than N has no bound), rows without a class or a path hash, with a filter or none, in
    id and in random order; without the history index it falls back to the one pass."""
    from dlindex.query.rows import prepare
    from dlindex.query.spec import COLUMNS, TEXT_COLUMNS, QuerySpec

    every = tuple(c for c in COLUMNS if c not in TEXT_COLUMNS)  # texts keep no history: refused with --at

    from .backends import where

    root = tmp_path / "tree"
    for k in range(90):
        make_png(root / f"c{k % 4}" / f"{k:03d}.png", (8 + k % 7, 9), (k, k * 2 % 256, 3))
    for k in range(6):  # no class folder: label_id NULL
        make_png(root / f"loose-{k}.png", (7, 7 + k), (k, 1, 2))
    db = where(tmp_path / "p.db")
    scan(db, root)
    with raw(db) as conn:  # rows no scan keyed (another program's): no path hash, ordered by id
        conn.execute(
            "UPDATE image_metadata SET path_hash = NULL WHERE id % 11 = 0 "
            "OR label_id = (SELECT id FROM labels WHERE name = 'c3')"  # a class whose N-th row has none
        )
    for week in range(3):  # new files, a new class, deletions, marks: history in every label
        for k in range(15):
            make_png(root / f"c{k % 5}" / f"w{week}-{k:03d}.png", (9, 9 + k % 5), (week * 40, k, 9))
        for f in sorted(root.rglob("*.png"))[week * 7 : week * 7 + 5]:
            f.unlink()
        scan(db, root, prune=True)
        mark(db, list(range(3 + week, 100, 9)), excluded=bool(week % 2))
        mark(db, list(range(5 + week, 100, 13)), processed=bool(week % 2))

    asks = [
        {"per_label": n, "seed": seed, **extra}
        for n in (1, 3, 40)
        for seed in (5, 8)
        for extra in ({}, {"processed": False}, {"order": "random"})
    ]

    def samples(at: str) -> list[list[tuple[object, ...]]]:
        with Catalog(db, at=at, log=False) as catalog:
            return [[tuple(r.values()) for r in query_rows(catalog, columns=every, cache=False, **ask)] for ask in asks]

    states = numbers(db)
    one_pass = {v: samples(v) for v in states}
    assert all(any(sample) for v in states for sample in one_pass[v])
    with raw(db) as conn:
        conn.execute(
            "CREATE INDEX per_label ON image_metadata (label_id, path_hash, id) WHERE status = 'ok' AND excluded = 0"
        )
        conn.execute("ANALYZE")  # as `dlindex index --apply` leaves it: the planner's statistics change its plans
    if not is_server(db):
        with Catalog(db, at=states[0], log=False) as catalog:
            assert "sample_past" in prepare(catalog, QuerySpec(per_label=3, seed=5, cache=False)).sql
    assert {v: samples(v) for v in states} == one_pass
    if not is_server(db):
        with raw(db) as conn:
            conn.execute("DROP INDEX image_history_label")
        with Catalog(db, at=states[0], log=False) as catalog:
            assert "sample_past" not in prepare(catalog, QuerySpec(per_label=3, seed=5, cache=False)).sql
        assert samples(states[0]) == one_pass[states[0]]


def test_stats_at_a_version_says_whether_each_tree_is_there_now(scanned_db: Path, image_tree: Path) -> None:
    from dlindex.stats import catalog_stats

    first = numbers(scanned_db)[0]
    mark(scanned_db, [1], excluded=True)
    with Catalog(scanned_db, at=first) as catalog:
        assert catalog_stats(catalog).root_problems == []
    image_tree.rename(image_tree.with_name("moved"))
    with Catalog(scanned_db, at=first) as catalog:
        problems = catalog_stats(catalog).root_problems
    with Catalog(scanned_db) as catalog:
        assert problems == catalog_stats(catalog).root_problems and len(problems) == 1
