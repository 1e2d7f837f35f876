"""Extractor versions: every computed vector records the version of the extractor that made it;
a vector made by another version than the latest compute ran is stale, said by `features list`,
`features show` and a search over it, and `features compute` makes only the stale and missing ones."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dlindex import Catalog, InputError, QuerySpec
from dlindex.catalog.merge import merge_catalogs
from dlindex.cli import app
from dlindex.engines.parts import Part
from dlindex.features import list_feature_types
from dlindex.features.extractor_versions import UNVERSIONED, file_digest, function_version, version_id, version_of
from dlindex.features.extractors import BUILTINS, load_extractor

from .backends import ON_BOTH_BACKENDS, SQLITE_ONLY, raw
from .conftest import compute, rows

pytestmark = ON_BOTH_BACKENDS

_BODY = """\
    import numpy as np
    {declared}
    def extract(image):
        if {fail}:
            raise ValueError("this version cannot read it")
        return np.full(4, {value}, dtype="float32")
    {attribute}
    """


def extractor_file(
    folder: Path, value: float = 1.0, declared: str | None = None, fail: str = "False", name: str = "feat.py"
) -> str:
    """A file.py:function extractor returning ``value`` four times, optionally declaring a version."""
    attribute = "" if declared is None else f"extract.dlindex_version = {declared!r}"
    body = _BODY.format(declared="", fail=fail, value=value, attribute=attribute)
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return f"{path}:extract"


def versions(db: Path, name: str) -> list[tuple[object, ...]]:
    """(vector's version id, count) of a type, most common first."""
    sql = "SELECT extractor_version, count(*) FROM image_features WHERE feature_type = ? GROUP BY 1 ORDER BY 2 DESC, 1"
    return rows(db, sql, (name,))


def info(db: Path, name: str) -> dict[str, object]:
    with Catalog(db) as catalog:
        (found,) = [t.as_dict() for t in list_feature_types(catalog) if t.name == name]
    return found


def test_a_builtin_records_its_version_and_a_rerun_computes_nothing(scanned_db: Path) -> None:
    first = compute(scanned_db, "dhash")
    assert (first.computed, first.stale, first.extractor_version) == (6, 0, "dhash/1")
    vid = version_id("dhash/1")
    assert versions(scanned_db, "dhash") == [(vid, 6)]
    assert rows(scanned_db, "SELECT extractor_version FROM feature_types WHERE name = 'dhash'") == [(vid,)]
    assert rows(scanned_db, "SELECT id, version FROM extractor_versions") == [(vid, "dhash/1")]
    assert {k: info(scanned_db, "dhash")[k] for k in ("extractor_version", "stale")} == {
        "extractor_version": "dhash/1",
        "stale": 0,
    }
    again = compute(scanned_db, "dhash")
    assert (again.computed, again.already_done, again.stale) == (0, 6, 0)


def test_an_edited_extractor_makes_only_stale_and_missing_vectors_again(scanned_db: Path, tmp_path: Path) -> None:
    spec = extractor_file(tmp_path, 1.0)
    assert compute(scanned_db, "mine", QuerySpec(labels=["cat"]), extractor=spec).computed == 3
    old = version_of(load_extractor(spec))
    assert old.startswith("source:")
    extractor_file(tmp_path, 2.0)  # new code: new vectors
    new = version_of(load_extractor(spec))
    assert new != old
    dogs = compute(scanned_db, "mine", QuerySpec(labels=["dog"]))
    assert (dogs.computed, dogs.stale, dogs.extractor_version) == (3, 0, new)  # missing ones only
    # The type's latest compute ran the new version: the cats' vectors are stale until made again.
    assert info(scanned_db, "mine")["stale"] == 3
    assert sorted(versions(scanned_db, "mine")) == sorted([(version_id(new), 3), (version_id(old), 3)])
    cats = compute(scanned_db, "mine")
    assert (cats.computed, cats.already_done, cats.stale) == (3, 3, 3)
    assert versions(scanned_db, "mine") == [(version_id(new), 6)]
    assert rows(scanned_db, "SELECT DISTINCT vector FROM image_features WHERE feature_type = 'mine'") == [
        (np.full(4, 2.0, dtype="<f4").tobytes(),)
    ]
    assert info(scanned_db, "mine")["stale"] == 0
    assert compute(scanned_db, "mine").computed == 0


def test_a_declared_version_pins_the_vectors_whatever_the_code(scanned_db: Path, tmp_path: Path) -> None:
    spec = extractor_file(tmp_path, 1.0, declared="v1")
    assert compute(scanned_db, "mine", extractor=spec).extractor_version == "declared:v1"
    extractor_file(tmp_path, 5.0, declared="v1")  # a refactoring the author says changes nothing
    assert compute(scanned_db, "mine").computed == 0
    extractor_file(tmp_path, 5.0, declared="v2")
    summary = compute(scanned_db, "mine")
    assert (summary.computed, summary.stale, summary.extractor_version) == (6, 6, "declared:v2")


def test_vectors_stored_before_versions_are_claimed_not_made_again(scanned_db: Path) -> None:
    compute(scanned_db, "colorhist")
    with raw(scanned_db) as conn:  # as a catalog made before extractor versions were recorded
        conn.execute("UPDATE image_features SET extractor_version = NULL")
        conn.execute("UPDATE feature_types SET extractor_version = NULL")
        conn.execute("DELETE FROM extractor_versions")
    assert info(scanned_db, "colorhist")["stale"] == 0  # nothing recorded: nothing to call stale
    summary = compute(scanned_db, "colorhist")
    assert (summary.computed, summary.already_done, summary.stale) == (0, 6, 0)
    assert versions(scanned_db, "colorhist") == [(version_id("colorhist/1"), 6)]


def test_a_sample_the_new_version_fails_on_keeps_no_stale_vector(scanned_db: Path, tmp_path: Path) -> None:
    spec = extractor_file(tmp_path, 1.0)
    compute(scanned_db, "mine", extractor=spec)
    extractor_file(tmp_path, 2.0, fail="image.width == 16")  # cat/000.png and dog/000.png are 16 wide
    summary = compute(scanned_db, "mine")
    assert (summary.computed, summary.failed, summary.stale) == (4, 2, 6)
    assert rows(scanned_db, "SELECT count(*) FROM image_features WHERE feature_type = 'mine'") == [(4,)]
    assert info(scanned_db, "mine")["stale"] == 0


def test_stale_vectors_are_said_by_list_show_and_a_search(scanned_db: Path, tmp_path: Path, runner: CliRunner) -> None:
    spec = extractor_file(tmp_path, 1.0)
    compute(scanned_db, "mine", extractor=spec)
    extractor_file(tmp_path, 2.0)
    compute(scanned_db, "mine", QuerySpec(labels=["dog"]))
    db = ["--db", str(scanned_db)]
    listed = runner.invoke(app, ["features", "list", "--format", "jsonl", *db])
    assert listed.exit_code == 0, listed.output
    (line,) = [json.loads(x) for x in listed.stdout.splitlines()]
    assert (line["stale"], line["extractor_version"]) == (3, version_of(load_extractor(spec)))
    (cat_id,) = [r[0] for r in rows(scanned_db, "SELECT id FROM image_metadata WHERE file_path = 'cat/000.png'")]
    shown = runner.invoke(app, ["features", "show", str(cat_id), "--type", "mine", "--json", *db])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["vectors"]["mine"]["stale"] is True
    similar = runner.invoke(app, ["similar", str(cat_id), "--type", "mine", "-k", "2", "--format", "jsonl", *db])
    assert similar.exit_code == 0, similar.output
    assert "warning: 3 of 6 'mine' vectors were made by another version" in similar.stderr
    compute(scanned_db, "mine")
    quiet = runner.invoke(app, ["similar", str(cat_id), "--type", "mine", "-k", "2", "--format", "jsonl", *db])
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr


def test_compute_prints_the_stale_count(scanned_db: Path, tmp_path: Path, runner: CliRunner) -> None:
    spec = extractor_file(tmp_path, 1.0)
    compute(scanned_db, "mine", extractor=spec)
    extractor_file(tmp_path, 3.0)
    result = runner.invoke(app, ["features", "compute", "--type", "mine", "--db", str(scanned_db)])
    assert result.exit_code == 0, result.output
    assert "stale 6 (made by another version of the extractor: made again)" in result.stdout


def test_function_versions(tmp_path: Path) -> None:
    def declared() -> None: ...

    declared.dlindex_version = 3  # type: ignore[attr-defined]
    assert function_version(declared) == "declared:3"
    assert function_version(len) == UNVERSIONED  # a builtin: no source, no __version__

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no")

    declared.dlindex_version = Unprintable()  # type: ignore[attr-defined]
    with pytest.raises(InputError, match="dlindex_version cannot be read as text"):
        function_version(declared)
    assert function_version(json.dumps) == "source:" + file_digest(json.__file__)
    assert {e.version for e in BUILTINS.values()} == {"colorhist/1", "thumb/1", "colorthumb/1", "dhash/1"}
    assert version_id("dhash/1") == version_id("dhash/1") != version_id("dhash/2")
    assert 0 <= version_id("x") < 2**63


@SQLITE_ONLY  # model files: the version is the file's digest
def test_a_model_file_version_is_its_digest(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    model = tmp_path / "m.pt"
    model.write_bytes(b"weights one")
    first = load_extractor(f"torch:{model}").version
    assert first == "torch:" + file_digest(str(model))
    model.write_bytes(b"weights two")
    assert load_extractor(f"torch:{model}").version != first


@SQLITE_ONLY  # merge reads part files
def test_parts_merge_with_their_versions(tmp_path: Path, scanned_db: Path) -> None:
    spec = extractor_file(tmp_path, 1.0, declared="v7")
    parts = []
    for i in range(2):
        part = tmp_path / f"part{i}.db"
        shutil.copy(scanned_db, part)
        compute(part, "mine", extractor=spec, part=Part(i, 2))
        parts.append(part)
    merge_catalogs(parts, scanned_db)
    vid = version_id("declared:v7")
    assert versions(scanned_db, "mine") == [(vid, 6)]
    assert rows(scanned_db, "SELECT extractor_version FROM feature_types WHERE name = 'mine'") == [(vid,)]
    assert rows(scanned_db, "SELECT id, version FROM extractor_versions") == [(vid, "declared:v7")]
    assert compute(scanned_db, "mine").computed == 0


def test_an_export_records_the_version_and_says_its_stale_vectors(scanned_db: Path, tmp_path: Path) -> None:
    from dlindex.export import ExportOptions, export_catalog

    spec = extractor_file(tmp_path, 1.0)
    compute(scanned_db, "mine", extractor=spec)
    extractor_file(tmp_path, 2.0)
    compute(scanned_db, "mine", QuerySpec(labels=["dog"]))
    said: list[str] = []
    with Catalog(scanned_db) as catalog:
        export_catalog(catalog, tmp_path / "out", ExportOptions(format="jsonl", features="mine"), warn=said.append)
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["features"]["extractor_version"] == version_of(load_extractor(spec))
    assert [line for line in said if "another version" in line] == [
        "3 'mine' vectors were made by another version of the type's extractor than its latest compute ran; "
        "dlindex features compute --type mine makes them again"
    ]
    compute(scanned_db, "mine")
    said.clear()
    with Catalog(scanned_db) as catalog:
        export_catalog(catalog, tmp_path / "again", ExportOptions(format="jsonl", features="mine"), warn=said.append)
    assert not [line for line in said if "another version" in line]


def test_list_as_csv_and_table_puts_each_value_under_its_column(scanned_db: Path, runner: CliRunner) -> None:
    """The row has more keys than the columns (jsonl's): csv and the table take them by name."""
    compute(scanned_db, "colorhist")
    with raw(scanned_db) as conn:
        conn.execute("UPDATE image_features SET extractor_version = 7 WHERE image_id IN (1, 2)")
    db = ["--db", str(scanned_db)]
    csv_out = runner.invoke(app, ["features", "list", "--format", "csv", *db])
    assert csv_out.exit_code == 0, csv_out.output
    header, line = csv_out.stdout.splitlines()
    got = dict(zip(header.split(","), line.split(","), strict=True))
    assert (got["vectors"], got["stale"], got["failed"], got["queued"]) == ("6", "2", "0", "0")
    table = runner.invoke(app, ["features", "list", "--format", "table", *db])
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()  # a narrow terminal may fold a long header over two lines
    head = next(line.split() for line in lines if "vectors" in line)
    row = lines[-1].split()
    at = head.index("vectors")
    assert head[at : at + 4] == ["vectors", "stale", "failed", "queued"]
    assert row[at : at + 4] == ["6", "2", "0", "0"]
