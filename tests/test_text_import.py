"""`dlindex text import` and `query --text` on both backends: texts attach all or nothing,
a reimport changes only what changed, the full-text index follows every write, and a search
combines with every other filter."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlindex import Catalog, QuerySpec, query_rows
from dlindex.catalog.texts import MAX_TEXT_BYTES, texts_of
from dlindex.errors import InputError
from dlindex.query.rows import explain
from dlindex.text.importer import import_texts

from .backends import ON_BOTH_BACKENDS, SQLITE_ONLY, Location, is_server, raw
from .conftest import invoke, one_error_line
from .synthetic import ROOT, Row, balanced, make_catalog, present_root

pytestmark = ON_BOTH_BACKENDS

CAPTIONS = {
    "cat/0001.png": ["a red car beside a cat", "a cat"],
    "cat/0002.png": ["a blue car"],
    "dog/0001.png": ["a dog in a red café"],
    "dog/0002.png": ["a dog asleep"],
}


@pytest.fixture
def db(tmp_path: Path) -> object:
    return balanced(tmp_path / "c.db", {"cat": 3, "dog": 3})  # ids 1-3 cats, 4-6 dogs


def jsonl(path: Path, captions: dict[str, list[str]]) -> Path:
    path.write_text("".join(json.dumps({"path": k, "caption": v}) + "\n" for k, v in captions.items()))
    return path


def ids(db: Location, text: str, **options: object) -> list[int]:
    with Catalog(db) as catalog:
        return [r["id"] for r in query_rows(catalog, text=text, columns=("id",), **options)]


def test_imported_texts_are_found_and_a_reimport_changes_nothing(db: Location, tmp_path: Path) -> None:
    with Catalog(db) as catalog:
        first = import_texts(catalog, jsonl(tmp_path / "caps.jsonl", CAPTIONS))
        again = import_texts(catalog, tmp_path / "caps.jsonl")
        assert texts_of(catalog, [1])[1] == [
            {"source": "caps", "seq": 0, "text": "a red car beside a cat"},
            {"source": "caps", "seq": 1, "text": "a cat"},
        ]
    assert (first.texts, first.samples, first.added, first.removed) == (5, 4, 5, 0)
    assert (again.added, again.removed) == (0, 0)
    assert ids(db, "red car") == [1]
    assert ids(db, "car") == [1, 2]
    assert ids(db, "red OR blue car") == [1, 2]
    assert ids(db, "red") == [1, 4]
    assert ids(db, "cafe") == [4]  # accents folded on both backends
    assert ids(db, "red -cat") == [4]
    assert ids(db, "red", labels=("dog",)) == [4]
    assert ids(db, "a", per_label=1, seed=3) in ([1, 4], [1, 5], [2, 4], [2, 5])


def test_an_edited_file_replaces_exactly_what_it_edits(db: Location, tmp_path: Path) -> None:
    with Catalog(db) as catalog:
        import_texts(catalog, jsonl(tmp_path / "caps.jsonl", CAPTIONS))
        other = import_texts(catalog, jsonl(tmp_path / "alt.jsonl", {"cat/0002.png": ["green boat"]}))
        edited = {**CAPTIONS, "cat/0001.png": ["a red car beside a cat"], "cat/0002.png": ["a yellow car"]}
        changed = import_texts(catalog, jsonl(tmp_path / "caps.jsonl", edited))
    assert other.source == "alt" and other.added == 1
    assert (changed.added, changed.removed) == (1, 2)  # cat 2's caption edited, cat 1's second gone
    assert ids(db, "blue") == []  # the old words left the index
    assert ids(db, "yellow") == [2]
    assert ids(db, "green boat") == [2]  # another source's text stays
    assert ids(db, "cat") == [1]


def test_every_format_gives_the_same_texts(db: Location, tmp_path: Path) -> None:
    rows = [(k, t) for k, v in CAPTIONS.items() for t in v]
    with open(tmp_path / "c.csv", "w", newline="") as f:
        csv.writer(f).writerows([("file_path", "text"), *rows])
    (tmp_path / "c.tsv").write_text("path\tcaption\n" + "".join(f"{ROOT}/{k}\t{t}\n" for k, t in rows))
    coco = {
        "images": [{"id": 100 + n, "file_name": k} for n, k in enumerate(CAPTIONS)],
        "annotations": [{"image_id": 100 + n, "caption": t} for n, v in enumerate(CAPTIONS.values()) for t in v],
    }
    (tmp_path / "c.json").write_text(json.dumps(coco))
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    by_id = {f"{'cat' if k.startswith('cat') else 'dog'}/{k[-6:]}": k for k in CAPTIONS}
    numbers = {"cat/0001.png": 1, "cat/0002.png": 2, "dog/0001.png": 4, "dog/0002.png": 5}
    pq.write_table(
        pa.table({"id": [numbers[k] for k, _ in rows], "text": [t for _, t in rows]}), tmp_path / "c.parquet"
    )
    assert by_id
    seen = []
    with Catalog(db) as catalog:
        for name in ("c.csv", "c.tsv", "c.json", "c.parquet"):
            done = import_texts(catalog, tmp_path / name, source=name.replace(".", "_"))
            assert (done.texts, done.samples) == (5, 4), name
        for source in ("c_csv", "c_tsv", "c_json", "c_parquet"):
            texts = texts_of(catalog, [1, 2, 4, 5])
            seen.append({i: [t["text"] for t in ts if t["source"] == source] for i, ts in texts.items()})
    assert all(s == seen[0] for s in seen) and seen[0][1] == CAPTIONS["cat/0001.png"]


def test_unknown_paths_are_named_and_nothing_is_written(db: Location, tmp_path: Path, runner: CliRunner) -> None:
    bad = jsonl(tmp_path / "caps.jsonl", {**CAPTIONS, "cat/0099.png": ["x"], "/elsewhere/a.png": ["y"]})
    line = one_error_line(invoke(runner, "text", "import", str(bad), "--db", str(db)))
    assert "2 record(s) name no sample" in line and "'cat/0099.png'" in line and "under no scanned root" in line
    with raw(db) as conn:
        assert conn.execute("SELECT count(*) FROM image_texts").fetchone()[0] == 0
    done = invoke(runner, "text", "import", str(bad), "--skip-unknown", "--json", "--db", str(db))
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["unknown"] == 2 and json.loads(done.stdout)["added"] == 5
    unknown_id = tmp_path / "ids.jsonl"
    unknown_id.write_text('{"id": 1, "text": "a"}\n{"id": 77, "text": "b"}\n')
    assert "id 77" in one_error_line(invoke(runner, "text", "import", str(unknown_id), "--db", str(db)))


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b'{"path": "cat/0001.png", "caption": "ok"}\n{"path": \n', "line 2: not valid JSON"),
        (b'{"path": "cat/0001.png", "caption": 5}\n', "a text must be a string"),
        (b'{"path": "cat/0001.png"}\n', "no text field"),
        (b'{"caption": "x"}\n', "no key field"),
        (b'{"path": "cat/\\udc80.png", "caption": "x"}\n', "name no sample"),  # the byte 0x80: no such file
        (b'{"path": "cat/0001.png", "caption": "a\\u0000b"}\n', "NUL"),
        (b'{"path": "cat/0001.png", "caption": "\\ud800"}\n', "lone surrogate"),
        (b"[1, 2]\n", "expected a JSON object"),
        (b'{"id": "seven", "text": "x"}\n', "not a whole number"),
        (b'{"id": 99999999999999999999, "text": "x"}\n', "outside the 64-bit range"),
        (b"\xff\xfe\x00{\n", "not valid JSON"),
        (b"[" * 100_000 + b"\n", "nested too deeply"),
        (b'{"path": "cat/0001.png", "caption": "' + b"x" * (MAX_TEXT_BYTES + 1) + b'"}\n', "at most 262,144"),
    ],
)
def test_a_bad_record_is_one_line_naming_it(db: Location, tmp_path: Path, content: bytes, says: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    with Catalog(db) as catalog, pytest.raises(InputError, match=says):
        import_texts(catalog, bad)
    with raw(db) as conn:
        assert conn.execute("SELECT count(*) FROM image_texts").fetchone()[0] == 0


def test_bad_files_are_one_line(db: Location, tmp_path: Path, runner: CliRunner) -> None:
    (tmp_path / "x.csv").write_bytes(b"path,text\ncat/0001.png,\xff\xfe\n")
    (tmp_path / "y.csv").write_text("path,text\ncat/0001.png,a,b\n")
    (tmp_path / "z.parquet").write_bytes(b"PAR1 not really")
    (tmp_path / "w.json").write_text('{"images": 3, "annotations": []}')
    (tmp_path / "v.txt").write_text("hello")
    for name, says in (
        ("x.csv", "not UTF-8"), ("y.csv", "3 fields, the header has 2"), ("z.parquet", "not a readable Parquet"),
        ("w.json", '"images" must be a list'), ("v.txt", "cannot tell the format"), ("missing.jsonl", "cannot read"),
    ):  # fmt: skip
        line = one_error_line(invoke(runner, "text", "import", str(tmp_path / name), "--db", str(db)))
        assert says in line, (name, line)
    line = one_error_line(
        invoke(runner, "text", "import", str(tmp_path / "x.csv"), "--source", ".txt", "--db", str(db))
    )
    assert "a source is" in line


def test_a_search_cannot_go_back_in_time_and_bad_searches_are_one_line(db: Location, runner: CliRunner) -> None:
    assert invoke(runner, "mark", "--processed", "-", "--db", str(db), input="1\n").exit_code == 0  # version 1
    assert "cannot be combined with --at" in one_error_line(
        invoke(runner, "query", "--text", "car", "--at", "1", "--db", str(db))
    )
    for search in ("-car", "car OR", '" "'):
        assert "--text" in one_error_line(invoke(runner, "query", "--text", search, "--db", str(db)))


def test_texts_go_with_their_sample(db: Location, tmp_path: Path) -> None:
    with Catalog(db) as catalog:
        import_texts(catalog, jsonl(tmp_path / "caps.jsonl", CAPTIONS))
    with raw(db) as conn:
        conn.execute("DELETE FROM image_metadata WHERE id = 1")
    assert ids(db, "red") == [4]
    assert ids(db, "car") == [2]


@SQLITE_ONLY  # a server catalog's advisor reads pg_stat_statements (tests/test_advisor_postgres.py)
def test_the_advisor_replays_logged_text_searches(db: Location, tmp_path: Path, runner: CliRunner) -> None:
    with Catalog(db) as catalog:
        import_texts(catalog, jsonl(tmp_path / "caps.jsonl", CAPTIONS))
    for _ in range(3):
        assert invoke(runner, "query", "--text", "red OR dog", "--label", "cat", "--db", str(db)).exit_code == 0
    done = invoke(runner, "index", "--suggest", "--json", "--db", str(db))
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert report["skipped"] == [], report["skipped"]
    assert any("image_texts_fts" in json.dumps(s) for s in report["statements"]), report["statements"]


@pytest.mark.parametrize("limit", [1, 2, 3, 10])
def test_a_limited_search_answers_the_same_asked_per_sample(
    db: Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    import dlindex.query.filters as filters

    with Catalog(db) as catalog:
        import_texts(catalog, jsonl(tmp_path / "caps.jsonl", CAPTIONS))
    listed = {s: ids(db, s, limit=limit, offset=1) for s in ("a", "red OR blue", "car -blue", "dog")}
    monkeypatch.setattr(filters, "_PROBE_OVER_LIST", 0)  # every limited search asked per sample (file catalogs)
    assert {s: ids(db, s, limit=limit, offset=1) for s in listed} == listed
    with Catalog(db) as catalog:
        explained = explain(catalog, QuerySpec(text="a", limit=limit, cache=False))
    assert ("EXISTS" in explained.sql) != is_server(db)


def test_an_export_selects_by_text(tmp_path: Path, runner: CliRunner) -> None:
    rows = [Row(label) for label in ("cat",) * 3 + ("dog",) * 3]
    db = make_catalog(tmp_path / "e.db", rows, root=present_root(tmp_path / "tree", rows))  # files a manifest finds
    with Catalog(db) as catalog:
        import_texts(catalog, jsonl(tmp_path / "caps.jsonl", CAPTIONS))
    out = tmp_path / "out"
    done = invoke(runner, "export", str(out), "--format", "jsonl", "--text", "red OR asleep", "--db", str(db))
    assert done.exit_code == 0, done.output
    lines = [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert [r["id"] for r in lines] == [1, 4, 5]
    assert json.loads((out / "index.json").read_text())["filters"]["text"] == "red OR asleep"
    line = one_error_line(invoke(runner, "export", str(out), "--append", "--db", str(db)))
    assert "cannot append to an export made with --text" in line


def test_a_query_shows_the_texts(db: Location, tmp_path: Path, runner: CliRunner) -> None:
    with Catalog(db) as catalog:
        import_texts(catalog, jsonl(tmp_path / "caps.jsonl", CAPTIONS))
        import_texts(catalog, jsonl(tmp_path / "alt.jsonl", {"cat/0001.png": ["alt of cat 1"]}))
        got = {r["id"]: (r["text"], r["texts"]) for r in query_rows(catalog, columns=("id", "text", "texts"))}
        sampled = list(query_rows(catalog, text="dog", per_label=1, seed=1, columns=("id", "texts")))
    assert got[1] == ("alt of cat 1", ["alt of cat 1", "a red car beside a cat", "a cat"])  # sources by name
    assert got[3] == (None, [])
    assert sampled == [{"id": 4, "texts": ["a dog in a red café"]}] or sampled == [{"id": 5, "texts": ["a dog asleep"]}]
    assert invoke(runner, "mark", "--processed", "-", "--db", str(db), input="1\n").exit_code == 0  # version 1
    line = one_error_line(invoke(runner, "query", "--columns", "id,text", "--at", "1", "--db", str(db)))
    assert "texts as they are now" in line
