"""Parquet and csv manifests from rows read as Arrow (dlindex.export.arrow_rows, dlindex.catalog.sqlite.arrow_read):
the same files, byte for byte, as from the tuples, and every failure of the driver one line."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dlindex.catalog.connection import Catalog
from dlindex.catalog.roots import move_root
from dlindex.catalog.sqlite import arrow_read
from dlindex.export import arrow_rows
from dlindex.export.run import export_catalog

from .conftest import export, invoke
from .synthetic import generated_catalog

pytest.importorskip("pyarrow")
pytest.importorskip("adbc_driver_sqlite")

ROWS = 1_500


@pytest.fixture(scope="module")
def tree_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pre-split tree's catalog with hostile names (some not UTF-8), corrupt and missing rows."""
    db = tmp_path_factory.mktemp("arrow") / "tree.db"
    return generated_catalog(db, chunk=500, rows=ROWS, labels=20, hostile=0.05, corrupt=0.02, missing=0.02, seed=3)


@pytest.fixture(scope="module")
def flat_db(tree_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same rows under a root that is no pre-split tree: one split, each group its own statement."""
    db = tmp_path_factory.mktemp("arrow") / "flat.db"
    with sqlite3.connect(tree_db) as source, sqlite3.connect(db) as copy:
        source.backup(copy)
        copy.execute("UPDATE roots SET presplit = 0")
        copy.execute("UPDATE image_metadata SET split = NULL")
    return db


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of 64 rows: the driver types a column from its first batch, so a column NULL in
    the first and set in a later one is met, and every batch crosses shard and split cuts."""
    monkeypatch.setattr(arrow_read, "_BATCH_ROWS", 64)


class Spy:
    """Counts the reads of the Arrow path that returned batches; ``off`` makes it say no."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, off: bool = False) -> None:
        self.taken = 0
        real = arrow_rows.StatementRows.arrow_batches

        def arrow_batches(rows: arrow_rows.StatementRows) -> Any:
            if off:
                return None
            batches = real(rows)
            self.taken += batches is not None
            return batches

        monkeypatch.setattr(arrow_rows.StatementRows, "arrow_batches", arrow_batches)


def files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.suffix in (".parquet", ".csv")}


def both(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str = "parquet", **options: Any
) -> tuple[dict[str, bytes], int]:
    """The export's shards from tuples and from Arrow, and how many reads took Arrow."""
    with monkeypatch.context() as m:
        Spy(m, off=True)
        export(db, tmp_path / "tuples", format=fmt, **options)
    spy = Spy(monkeypatch)
    export(db, tmp_path / "arrow", format=fmt, **options)
    old, new = files(tmp_path / "tuples"), files(tmp_path / "arrow")
    assert old and list(old) == list(new)
    for name in old:
        assert old[name] == new[name], name
    return new, spy.taken


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"shuffle": True, "seed": 7},  # named parameters, bound by index
        {"shard_size": 97},  # shard cuts inside batches
        {"split": "train"},  # one folder asked for
        {"absolute_paths": True},
        {"query": {"labels": ("__pick__",)}},  # a class list of the --label names
    ],
    ids=["plain", "shuffle", "shard-size", "one-folder", "absolute", "labels"],
)
@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_tree_folders_dealt_from_arrow_are_the_tuples_bytes(
    tree_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, options: dict[str, Any]
) -> None:
    options = _with_labels(tree_db, options)
    shards, taken = both(tree_db, tmp_path, monkeypatch, fmt, **options)
    assert taken == 1  # the one pass over the folders
    assert any(name.startswith("validation") for name in shards) or options.get("split") == "train"


@pytest.mark.parametrize(
    "options",
    [{}, {"shuffle": True, "seed": 1}, {"shard_size": 200}],
    ids=["plain", "shuffle", "shard-size"],
)
@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_one_split_from_arrow_is_the_tuples_bytes(
    flat_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, options: dict[str, Any]
) -> None:
    _, taken = both(flat_db, tmp_path, monkeypatch, fmt, **options)
    assert taken == 1


def test_a_part_reads_tuples_and_writes_the_same_bytes(
    tree_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part's plan routes rows to its groups in Python: no Arrow there (yet), the same shards."""
    _, taken = both(tree_db, tmp_path, monkeypatch, shard="0/1")
    assert taken == 0


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_names_not_utf8_and_roots_without_text_keep_their_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """A root whose path is not UTF-8 has no text prefix: every row takes the per-row path."""
    db = generated_catalog(tmp_path / "odd.db", chunk=200, rows=400, labels=5, hostile=0.3, seed=5)
    moved = os.fsencode(tmp_path) + b"/root-\xff"
    os.rename(os.fsencode(db) + b"-root", moved)
    with Catalog(db) as catalog:
        move_root(catalog, "1", moved, check=0)
    shards, taken = both(db, tmp_path, monkeypatch, fmt, absolute_paths=True)
    assert taken == 1
    if fmt == "parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(tmp_path / "arrow" / next(iter(shards)))
        assert table.column("path_bytes").null_count == 0  # every path under the root kept as its bytes


@pytest.mark.parametrize(
    ("fmt", "missing"), [("parquet", "adbc_driver_sqlite"), ("csv", "adbc_driver_sqlite"), ("csv", "pyarrow")]
)
def test_without_the_driver_the_tuples_are_read(
    tree_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, missing: str
) -> None:
    """The driver (or, for csv, pyarrow itself) not installed: the same export from tuples."""
    import builtins

    expected = files(export(tree_db, tmp_path / "with", format=fmt) and tmp_path / "with")
    real_import = builtins.__import__

    def without(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith(missing):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without)
    called: list[int] = []
    real = arrow_read.open_batches
    monkeypatch.setattr(arrow_read, "open_batches", lambda *a: called.append(1) or real(*a))
    export(tree_db, tmp_path / "out", format=fmt)
    assert called and files(tmp_path / "out") == expected  # asked, answered None, read as tuples


def test_inside_a_write_transaction_the_tuples_are_read(
    tree_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows this connection has not committed: another connection would not see them."""
    spy = Spy(monkeypatch)
    with Catalog(tree_db) as catalog:
        catalog.conn.execute("BEGIN")
        try:
            from dlindex.export.options import ExportOptions

            export_catalog(catalog, tmp_path / "out", ExportOptions(format="parquet"))
        finally:
            catalog.conn.execute("ROLLBACK")
    assert spy.taken == 0


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_a_catalog_name_with_uri_characters(
    tree_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    odd = tmp_path / "a?b#c%20d" / "cat log.db"
    odd.parent.mkdir()
    with sqlite3.connect(tree_db) as source, sqlite3.connect(odd) as copy:
        source.backup(copy)
    _, taken = both(odd, tmp_path, monkeypatch, fmt)
    assert taken == 1


def test_the_statement_is_logged_once_with_its_rows(
    tree_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "logged.db"
    with sqlite3.connect(tree_db) as source, sqlite3.connect(db) as copy:
        source.backup(copy)
        copy.execute("DELETE FROM query_log")  # the other tests' exports of tree_db
    spy = Spy(monkeypatch)
    summary = export(db, tmp_path / "out", format="parquet")
    assert spy.taken == 1
    with sqlite3.connect(db) as conn:
        logged = conn.execute("SELECT rows FROM query_log WHERE sql LIKE '%image_metadata.split FROM%'").fetchall()
    assert [n for (n,) in logged if n > 1] == [summary.samples]  # the others: a row each (is any in a folder?)


@pytest.mark.parametrize(
    ("tamper", "says"),
    [
        ("UPDATE image_metadata SET width = 'wide' WHERE id = (SELECT max(id) FROM image_metadata WHERE status = 'ok')",
         "column 'width'"),
        ("UPDATE image_metadata SET format = CAST(x'ff00' AS TEXT) WHERE id = (SELECT max(id) FROM image_metadata WHERE status = 'ok')",
         "damaged"),
    ],
    ids=["text-in-an-integer-column", "text-not-utf8"],
)  # fmt: skip
def test_a_tampered_row_after_the_first_batch_is_one_line(
    tree_db: Path, tmp_path: Path, runner: CliRunner, tamper: str, says: str
) -> None:
    db = tmp_path / "tampered.db"
    with sqlite3.connect(tree_db) as source, sqlite3.connect(db) as copy:
        source.backup(copy)
        copy.execute(tamper)
    out = tmp_path / "out"
    result = invoke(runner, "export", str(out), "--db", str(db), "--format", "parquet")
    lines = result.stderr.strip().splitlines()
    assert result.exit_code != 0 and len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert says in lines[0]
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
    assert not [t for t in threading.enumerate() if t.name.startswith("dlindex-arrow")]  # the read-ahead ended


def test_positional_parameters_follow_sqlites_own_indexes(tree_db: Path) -> None:
    conn = sqlite3.connect(tree_db)
    sql = "SELECT id FROM image_metadata WHERE id > :b AND id < :a AND format != :b2 ORDER BY id % :a"
    assert arrow_read._positional(conn, sql, {"a": 50, "b": 3, "b2": "x"}) == (3, 50, "x")
    assert arrow_read._positional(conn, "SELECT ?1 + :a", {"a": 1}) is None  # an index with no name here
    assert arrow_read._positional(conn, "SELECT :a", {"a": None}) is None  # NULL: the driver cannot type it


def _with_labels(db: Path, options: dict[str, Any]) -> dict[str, Any]:
    if "query" not in options:
        return options
    from dlindex.query.spec import QuerySpec

    with sqlite3.connect(db) as conn:
        names = tuple(n for (n,) in conn.execute("SELECT name FROM labels ORDER BY id LIMIT 3"))
    return {**options, "query": QuerySpec(labels=names)}


@pytest.mark.parametrize(
    "options",
    [
        {"split": "train=0.9,val=0.1"},
        {"split": "a=0.5,b=0.3,c=0.2", "shuffle": True, "seed": 4},
        {"split": "train=0.8,val=0.2", "shard_size": 150},
    ],
    ids=["two", "three-shuffled", "shard-size"],
)
@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_split_fractions_from_arrow_are_the_tuples_bytes(
    flat_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, options: dict[str, Any]
) -> None:
    """Each split its own statement (its hash range one wider at each end), the rows split_of
    keeps chosen in Arrow; hashes that are not 16 lowercase hex digits first go row by row."""
    db = tmp_path / "odd-hashes.db"
    with sqlite3.connect(flat_db) as source, sqlite3.connect(db) as copy:
        source.backup(copy)
        copy.execute("UPDATE image_metadata SET xxh3_128 = upper(xxh3_128) WHERE id % 13 = 0")
        copy.execute("UPDATE image_metadata SET xxh3_128 = ' ' || substr(xxh3_128, 1, 5) WHERE id % 17 = 0")
        copy.execute("UPDATE image_metadata SET xxh3_128 = NULL WHERE id % 19 = 0")
    _, taken = both(db, tmp_path, monkeypatch, fmt, **options)
    assert taken == len(options["split"].split(","))


_POINTS = st.one_of(
    st.integers(0, (1 << 64) - 1),
    st.sampled_from([0, 1, (1 << 64) - 1, int(0.9 * 2.0**64), int(0.9 * 2.0**64) + 1, int(0.5 * 2.0**64) - 1]),
)
_ODD = st.sampled_from([None, "", "zz", " 1f", "1_0", "ABCDEF0123456789ff", "0123456789abcde", "+1f"])


@settings(max_examples=300, deadline=None)
@given(
    cells=st.lists(st.one_of(_POINTS.map(lambda p: f"{p:016x}" + "0" * 16), _ODD), min_size=1, max_size=40),
    fractions=st.sampled_from([{"a": 0.9, "b": 0.1}, {"a": 0.5, "b": 0.3, "c": 0.2}, {"a": 0.0, "b": 1.0},
                               {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}]),
)  # fmt: skip
def test_split_mask_is_split_of(cells: list[str | None], fractions: dict[str, float]) -> None:
    import pyarrow as pa

    from dlindex.export.hashsplit import split_mask
    from dlindex.export.plan import ROW, split_of

    n = len(cells)
    columns = {name: pa.array([1 + k for k in range(n)], pa.int64()) for name in ROW}
    columns["xxh3_128"] = pa.array(cells, pa.string())
    batch = pa.RecordBatch.from_pydict(columns)
    assign = split_of(fractions)
    rows = list(zip(*(c.to_pylist() for c in batch.columns), strict=True))
    for name in fractions:
        assert split_mask(batch, fractions, name, assign).to_pylist() == [assign(row) == name for row in rows]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_names_csv_must_quote_are_written_as_csv_writes_them(
    flat_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """Commas, quotes, line breaks and other control characters in names, labels and formats:
    those rows' lines come from csv.writer itself, the others from Arrow, in their places."""
    db = tmp_path / "quoted.db"
    with sqlite3.connect(flat_db) as source, sqlite3.connect(db) as copy:
        source.backup(copy)
        present = [
            i
            for (i,) in copy.execute(
                "SELECT id FROM image_metadata WHERE file_path IN (SELECT file_path FROM "
                "image_metadata ORDER BY file_path LIMIT 3) OR file_path IN (SELECT "
                "file_path FROM image_metadata ORDER BY file_path DESC LIMIT 3)"
            )
        ]
        for k, odd in enumerate([",", '"', "\n", "\r", "\t", "\x01", " ", "é", "\\"]):
            copy.execute(  # not the files at the tree's ends, which the export looks for
                "UPDATE image_metadata SET file_path = file_path || ? WHERE id % 11 = ? AND id NOT IN "
                "(SELECT value FROM json_each(?))", (f"x{odd}y", k, json.dumps(present)),
            )  # fmt: skip
        copy.execute(
            """UPDATE labels SET name = name || ',"q"' WHERE id IN (SELECT id FROM labels ORDER BY id LIMIT 2)"""
        )
        copy.execute("UPDATE image_metadata SET format = 'JP,EG' WHERE id % 23 = 0")
    shards, taken = both(db, tmp_path, monkeypatch, fmt)
    assert taken == 1
    if fmt == "csv":
        text = b"".join(shards.values())
        assert b'"' in text and b"\r" in text  # quoted fields were written
