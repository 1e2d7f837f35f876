"""A catalog holding a user's full-text index (sqlite-utils' ``enable_fts`` with its triggers: a
virtual FTS5 table and the shadow tables it keeps its data in) works with every command that
copies or replays the catalog: the advisor's scratch copy (whole and sampled) replays a logged
MATCH statement and sizes its sample by the catalog's rows, and recovery copies the index once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlite_utils
from typer.testing import CliRunner

from dlindex import Catalog
from dlindex.advisor.scratch import Scratch
from dlindex.advisor.suggest import suggest_indexes
from dlindex.catalog.check import check_catalog
from dlindex.catalog.recover import recover_catalog
from dlindex.cli import app

from .conftest import make_png, scan
from .synthetic import balanced

_MATCH = (
    "SELECT id FROM image_metadata WHERE id IN "
    "(SELECT rowid FROM image_metadata_fts WHERE image_metadata_fts MATCH 'cat')"
)


def with_fts(db: Path) -> Path:
    sqlite_utils.Database(db)["image_metadata"].enable_fts(["file_path"], create_triggers=True)
    return db


def found(db: Path) -> list[int]:
    with sqlite3.connect(db) as conn:
        return [r[0] for r in conn.execute(_MATCH + " ORDER BY id")]


def test_commands_keep_a_users_full_text_index_current(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    for k in range(6):
        make_png(root / ("cat" if k % 2 else "dog") / f"{k}.png", (8, 8 + k), (k, 9, 9))
    db = tmp_path / "c.db"
    scan(db, root)
    with_fts(db)
    before = found(db)
    make_png(root / "cat" / "new.png", (9, 9), (1, 2, 3))
    scan(db, root)  # the user's triggers index the new row
    assert len(found(db)) == len(before) + 1
    result = CliRunner().invoke(app, ["check", "--db", str(db)])
    assert result.exit_code == 0, result.output


def test_the_advisor_replays_a_logged_match_on_whole_and_sampled_copies(tmp_path: Path) -> None:
    db = with_fts(Path(balanced(tmp_path / "b.db", {"cat": 700, "dog": 700})))
    log = [("app.sql", (_MATCH + ";\n") * 3)]  # the user's own search, captured in their log
    with Catalog(db) as catalog:
        whole = suggest_indexes(catalog, log, top=5)
        sampled = suggest_indexes(catalog, log, top=5, sample_rows=500)
    for advice in (whole, sampled):  # replayed, not skipped ("vtable constructor failed")
        assert advice.reads and advice.statements
        assert not [s for s in advice.skipped if "image_metadata_fts" in s.text or "vtable" in s.reason], advice.skipped
    with Scratch(db, sample_rows=500) as scratch:
        assert scratch.sample == 3  # 1,400 rows in samples of 500: the index's rowids are no row count
        (matched,) = scratch.admin.execute(f"SELECT count(*) FROM ({_MATCH})").fetchone()
        (rows,) = scratch.admin.execute("SELECT count(*) FROM image_metadata WHERE file_path LIKE 'cat/%'").fetchone()
        assert matched == rows > 0  # the index rebuilt from the sampled rows


def test_recovery_copies_a_users_full_text_index_once(tmp_path: Path) -> None:
    db = with_fts(Path(balanced(tmp_path / "b.db", {"cat": 40, "dog": 40})))
    report = recover_catalog(db, tmp_path / "r.db")
    assert report.check.integrity == "ok" and not report.incomplete
    assert found(tmp_path / "r.db") == found(db) and len(found(db)) == 40
    with sqlite3.connect(tmp_path / "r.db") as conn:
        conn.execute("INSERT INTO image_metadata_fts (image_metadata_fts) VALUES ('integrity-check')")
    assert check_catalog(tmp_path / "r.db").integrity == "ok"


def test_a_full_text_index_whose_module_is_missing_is_one_line_everywhere(tmp_path: Path) -> None:
    """A virtual table whose module this SQLite lacks (another build's, or a damaged definition):
    commands refuse the catalog in one line, `check` names it as a problem, and `--recover-to`
    leaves it and the user's triggers that write to it out, naming them, so the new catalog takes
    writes again."""
    db = with_fts(Path(balanced(tmp_path / "b.db", {"cat": 5, "dog": 5})))
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = replace(sql, 'USING FTS5', 'USING fts9') WHERE name = ?",
                     ("image_metadata_fts",))  # fmt: skip
    runner = CliRunner()
    for args in (["query", "--limit", "1"], ["check"]):
        result = runner.invoke(app, [*args, "--db", str(db)])
        assert result.exit_code == 1 and "no such module: fts9" in result.output, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)
    report = recover_catalog(db, tmp_path / "r.db")
    assert set(report.incomplete) == {
        "image_metadata_fts",
        "image_metadata_ai",
        "image_metadata_ad",
        "image_metadata_au",
    }
    assert report.check.integrity == "ok" and report.rows["image_metadata"] == 10
    result = runner.invoke(app, ["mark", "--exclude", "--db", str(tmp_path / "r.db")], input="3\n")
    assert result.exit_code == 0, result.output
