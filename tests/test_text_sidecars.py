"""`scan --texts`: the sidecar texts beside images, kept losslessly, seen again only when they
change, gone when their file goes; hostile sidecars give no text and never a hang; a merge
carries texts and never undoes one the catalog got after the cut."""

from __future__ import annotations

import codecs
import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dlindex import Catalog, query_rows
from dlindex.catalog.merge import merge_catalogs
from dlindex.catalog.texts import MAX_TEXT_BYTES
from dlindex.text.importer import import_texts
from dlindex.text.sidecars import BINARY, NOT_JSON, from_bytes, from_json

from .conftest import invoke, make_png, one_error_line, scan

SIDECARS = {
    "a/1.txt": b"a red car",
    "a/1.caption": codecs.BOM_UTF8 + "café".encode(),
    "a/2.txt": "naïve".encode("cp1252"),
    "a/3.txt": "\ufeffwide text".encode("utf-16-le"),
    "a/4.txt": "\ufeffbig end".encode("utf-16-be"),
    "b/1.json": json.dumps({"caption": ["one dog", "two dogs"], "url": "http://x"}).encode(),
    "b/2.json": b"not json",
    "b/3.txt": b"bin\x00ary",
    "b/4.txt": b"x" * (MAX_TEXT_BYTES + 1),
    "b/5.json": json.dumps({"url": "no caption"}).encode(),
}


def tree(root: Path) -> Path:
    for folder, n in (("a", 4), ("b", 6)):
        for i in range(1, n + 1):
            make_png(root / folder / f"{i}.png", (8, 8), (i, 3, 4))
    for name, data in SIDECARS.items():
        (root / name).write_bytes(data)
    os.mkfifo(root / "b" / "6.txt")  # never read: a FIFO is no text, and no hang
    return root


def texts(db: Path) -> dict[tuple[str, str, int], tuple[str, str]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT i.file_path, t.source, t.seq, t.text, t.encoding FROM image_texts t "
            "JOIN image_metadata i ON i.id = t.image_id"
        ).fetchall()
    return {(p, s, q): (t, e) for p, s, q, t, e in rows}


def found(db: Path, search: str, status: tuple[str, ...] = ("ok",)) -> list[str]:
    with Catalog(db) as catalog:
        return [r["file_path"] for r in query_rows(catalog, text=search, status=status, columns=("file_path",))]


def test_sidecars_are_catalogued_losslessly(tmp_path: Path) -> None:
    root = tree(tmp_path / "t")
    summary = scan(tmp_path / "c.db", root, texts=True)
    assert summary.texts == {
        "read": 6, "unchanged": 0, "removed": 0,
        "skipped": {"not_json": 1, "binary": 1, "too_large": 1, "no_text_field": 1, "not_a_file": 1},
    }  # fmt: skip
    got = texts(tmp_path / "c.db")
    assert got[("b/1.png", ".json", 1)] == ("two dogs", "json:caption")
    for name, data in SIDECARS.items():
        stem, source = name.rsplit(".", 1)
        key = (stem + ".png", "." + source, 0)
        if key in got and source != "json":
            text, encoding = got[key]
            assert text.encode(encoding) == data, name  # the file's bytes, back from the catalog
    assert {e for _, e in got.values()} == {"utf-8", "utf-8-sig", "cp1252", "utf-16-le", "utf-16-be", "json:caption"}
    assert found(tmp_path / "c.db", "cafe OR naive") == ["a/1.png", "a/2.png"]
    assert found(tmp_path / "c.db", "dogs") == ["b/1.png"]


def test_a_rescan_reads_only_what_changed_and_drops_what_went(tmp_path: Path) -> None:
    root = tree(tmp_path / "t")
    db = tmp_path / "c.db"
    scan(db, root, texts=True)
    assert scan(db, root, texts=True).texts["unchanged"] == 6  # type: ignore[index]
    (root / "a" / "1.txt").write_text("a blue car")
    (root / "a" / "2.txt").unlink()
    (root / "b" / "2.json").write_text(json.dumps({"text": "now a caption"}))
    again = scan(db, root, texts=True).texts
    assert again is not None and (again["read"], again["removed"]) == (2, 1)
    assert found(db, "red") == [] and found(db, "blue") == ["a/1.png"] and found(db, "naive") == []
    assert found(db, "caption") == ["b/2.png"]
    (root / "a").rename(tmp_path / "gone")  # the images go missing: their texts stay with their rows
    scan(db, root, texts=True)
    assert found(db, "blue", ("missing",)) == ["a/1.png"]
    scan(db, root, texts=True, prune=True)  # pruned rows take their texts
    assert found(db, "blue", ("ok", "missing")) == []


def test_a_folder_that_cannot_be_listed_keeps_its_texts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tree(tmp_path / "t")
    db = tmp_path / "c.db"
    scan(db, root, texts=True)
    real = os.listdir

    def listdir(path: bytes) -> list[bytes]:
        if path.endswith(b"/a"):
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(os, "listdir", listdir)
    scan(db, root, texts=True)
    assert found(db, "red") == ["a/1.png"]


def test_sidecars_of_hostile_names_and_links(tmp_path: Path) -> None:
    root = tmp_path / "t"
    name = b"caf\xe9 \xff"  # not UTF-8
    make_png(Path(os.fsdecode(bytes(root) + b"/" + name + b".png")), (8, 8))
    Path(os.fsdecode(bytes(root) + b"/" + name + b".txt")).write_text("latin name")
    make_png(root / "linked.png", (9, 9))
    (tmp_path / "elsewhere.txt").write_text("through a link")
    (root / "linked.txt").symlink_to(tmp_path / "elsewhere.txt")
    make_png(root / "loop.png", (7, 7))
    (root / "loop.txt").symlink_to(root / "loop.txt")
    summary = scan(tmp_path / "c.db", root, texts=True)
    assert summary.texts is not None and summary.texts["read"] == 2
    assert summary.texts["skipped"] == {"not_a_file": 1}
    assert len(found(tmp_path / "c.db", "latin")) == 1 and found(tmp_path / "c.db", "link") == ["linked.png"]


def test_texts_is_refused_where_it_cannot_run_yet(tmp_path: Path, runner: CliRunner) -> None:
    root = tree(tmp_path / "t")
    db = str(tmp_path / "c.db")
    assert "--texts cannot go with --part" in one_error_line(
        invoke(runner, "scan", str(root), "--texts", "--part", "0/2", "--db", db)
    )
    assert invoke(runner, "scan", str(root), "--texts", "--watch", "--db", db).exit_code == 2
    done = invoke(runner, "scan", str(root), "--texts", "--db", db)
    assert done.exit_code == 0 and "texts: sidecars read 6" in done.stdout


def test_a_merge_carries_texts_and_keeps_the_catalogs_later_ones(tmp_path: Path) -> None:
    root = tree(tmp_path / "t")
    db = tmp_path / "c.db"
    scan(db, root, texts=True)
    cut, part = tmp_path / "cut.db", tmp_path / "part.db"
    shutil.copy(db, cut)
    shutil.copy(db, part)
    (tmp_path / "p.jsonl").write_text('{"path": "b/3.png", "text": "from the part"}\n')
    (tmp_path / "c.jsonl").write_text('{"path": "b/4.png", "text": "in the catalog later"}\n')
    with Catalog(part) as catalog:
        import_texts(catalog, tmp_path / "p.jsonl")
    with Catalog(db) as catalog:
        import_texts(catalog, tmp_path / "c.jsonl")
    summary = merge_catalogs([part], db, cut=cut)
    assert summary.texts_written == 1
    assert found(db, "part") == ["b/3.png"] and found(db, "later") == ["b/4.png"] and found(db, "red") == ["a/1.png"]
    assert merge_catalogs([part], db, cut=cut).texts_written == 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_a_lossless_text_or_binary(data: bytes) -> None:
    got = from_bytes(data)
    if isinstance(got, str):
        assert got == BINARY
    else:
        ((text, encoding),) = got
        assert text.encode(encoding) == data and "\0" not in text


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=120)
    | st.recursive(
        st.text(max_size=10), lambda c: st.lists(c) | st.dictionaries(st.sampled_from(["caption", "text", "x"]), c)
    ).map(lambda v: json.dumps(v).encode())
)
def test_any_json_sidecar_is_texts_or_a_reason(data: bytes) -> None:
    got = from_json(data)
    assert isinstance(got, list) or got in (NOT_JSON, BINARY, "no_text_field")
    if isinstance(got, list):
        for text, encoding in got:
            text.encode("utf-8")
            assert encoding.startswith("json:") and "\0" not in text


def test_check_finds_a_damaged_text_index_and_reindex_mends_it(tmp_path: Path, runner: CliRunner) -> None:
    db = tmp_path / "c.db"
    scan(db, tree(tmp_path / "t"), texts=True)
    assert invoke(runner, "check", "--db", str(db)).exit_code == 0
    with sqlite3.connect(db) as conn:  # a page of the index lost behind dlindex's back
        conn.execute("DELETE FROM image_texts_fts_data WHERE id = (SELECT max(id) FROM image_texts_fts_data)")
    damaged = invoke(runner, "check", "--db", str(db))
    assert damaged.exit_code == 1 and "dlindex text reindex" in damaged.stdout
    assert invoke(runner, "text", "reindex", "--db", str(db)).exit_code == 0
    assert invoke(runner, "check", "--db", str(db)).exit_code == 0
    assert found(db, "red") == ["a/1.png"]
