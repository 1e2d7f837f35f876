"""ids.i64 (every wds member's id, in shard order) and the catalog's record of its exports."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlindex import Catalog
from dlindex.export.registry import recorded_exports
from dlindex.exported import ExportError
from dlindex.exported.ids import IDS_FILE, wds_ids
from dlindex.exported.reader import load_index
from dlindex.exported.verify import verify_export

from .backends import ON_BOTH_BACKENDS, on_postgresql, raw
from .conftest import export, rewrite_export_file, rows

pytestmark = ON_BOTH_BACKENDS

wds = pytest.importorskip("webdataset")


def keys_in_order(out: Path) -> list[int]:
    """The ids webdataset itself yields, shard by shard in index order."""
    index = json.loads((out / "index.json").read_text())
    urls = [str(out / s["file"]) for s in index["dlindex_shards"]]
    return [int(s["__key__"].partition("_")[0]) for s in wds.WebDataset(urls, shardshuffle=False, nodesplitter=None)]


@pytest.mark.parametrize(
    "options", [{"shard_size": 2}, {"shard_size": 3, "world_size": 2}, {"shard_size": 2, "shuffle": True}]
)
def test_ids_follow_the_members_in_shard_order(scanned_db: Path, tmp_path: Path, options: dict[str, object]) -> None:
    out = tmp_path / "w"
    summary = export(scanned_db, out, format="wds", **options)
    ids = wds_ids(out, load_index(out))
    assert ids is not None and list(ids) == keys_in_order(out)
    assert len(ids) == summary.samples + summary.padded
    assert verify_export(out).ok


def test_every_export_is_recorded_newest_first(scanned_db: Path, tmp_path: Path) -> None:
    export(scanned_db, tmp_path / "a", format="wds", shard_size=2)
    export(scanned_db, tmp_path / "b", format="jsonl")
    with Catalog(scanned_db) as catalog:
        before = catalog.changes()
        export(scanned_db, tmp_path / "a", format="wds", shard_size=3, overwrite=True)
        assert catalog.changes() == before  # bookkeeping: cached query results stay valid
        found = recorded_exports(catalog)
        assert [Path(r.path).name for r in found] == ["a", "b"]
        assert [r.format for r in recorded_exports(catalog, "wds")] == ["wds"]
        shutil.rmtree(tmp_path / "b")
        assert [Path(r.path).name for r in recorded_exports(catalog)] == ["a"]


def test_a_catalog_that_cannot_take_the_record_still_exports(
    scanned_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLINDEX_WAIT", "0.1")
    if on_postgresql():
        with raw(scanned_db) as held:  # another writer holds the table's lock for the whole export
            held.execute("LOCK TABLE exports IN EXCLUSIVE MODE")  # reads go on, writes wait
            summary = export(scanned_db, tmp_path / "busy", format="wds", shard_size=2)
    else:
        lite = sqlite3.connect(scanned_db, isolation_level=None)
        lite.execute("BEGIN IMMEDIATE")  # another writer holds the lock for the whole export
        try:
            summary = export(scanned_db, tmp_path / "busy", format="wds", shard_size=2)
        finally:
            lite.execute("ROLLBACK")
            lite.close()
    assert summary.samples and (tmp_path / "busy" / IDS_FILE).is_file()
    assert rows(scanned_db, "SELECT count(*) FROM exports") == [(0,)]


def test_a_tampered_ids_file_is_one_clear_error(scanned_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "w"
    export(scanned_db, out, format="wds", shard_size=2)
    data = (out / IDS_FILE).read_bytes()
    (out / IDS_FILE).write_bytes(data[:-8] + (10**9).to_bytes(8, "little"))  # same size, other id
    with pytest.raises(ExportError, match="does not match its hash"):
        wds_ids(out, load_index(out))
    assert not verify_export(out).ok
    rewrite_export_file(out, IDS_FILE, data[:-8])  # consistent, but one id short
    with pytest.raises(ExportError, match="bytes for"):
        wds_ids(out, load_index(out))
    (out / IDS_FILE).unlink()
    (out / IDS_FILE).symlink_to(tmp_path / "elsewhere")
    index = load_index(out)
    entry = next(f for f in index["files"] if f["file"] == IDS_FILE)
    entry["bytes"] = 8 * sum(s["samples"] for s in index["dlindex_shards"])
    with pytest.raises(ExportError):
        wds_ids(out, index)


def test_an_export_from_before_ids_reads_as_none(scanned_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "w"
    export(scanned_db, out, format="wds", shard_size=2)
    index = load_index(out)
    index["files"] = [f for f in index["files"] if f["file"] != IDS_FILE]
    assert wds_ids(out, index) is None


@settings(max_examples=150, deadline=None)
@given(entry=st.one_of(st.none(), st.integers(), st.text(max_size=5),
                       st.dictionaries(st.sampled_from(["file", "bytes", "xxh3_128"]),
                                       st.one_of(st.integers(-5, 1 << 40), st.text(max_size=40)))))  # fmt: skip
def test_any_ids_entry_is_read_or_refused_in_one_line(tmp_path_factory: pytest.TempPathFactory, entry: object) -> None:
    out = tmp_path_factory.mktemp("fuzz")
    (out / IDS_FILE).write_bytes(np.arange(4, dtype="<i8").tobytes())
    index = {"dlindex_export": 2, "dlindex_shards": [{"file": "x.tar", "samples": 4}],
             "files": [dict(entry, file=IDS_FILE) if isinstance(entry, dict) else entry]}  # fmt: skip
    try:
        got = wds_ids(out, index)
    except ExportError as e:
        assert "\n" not in str(e)
    else:
        assert got is None or list(got) == [0, 1, 2, 3]
