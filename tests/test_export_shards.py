"""``export --part I/N`` and ``merge_exports``: N parts merged are the one-machine export, byte for byte.

Every format, with and without splits and ranks, merged from 1 and from 3 parts, read back by
the formats' own clients; and every way a merge can be handed the wrong parts, each refused
with one line and nothing written.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from dlindex import Catalog
from dlindex.engines.parts import Part
from dlindex.export import ExportError, ExportOptions, export_catalog, load_index, merge_exports, verify_export
from dlindex.export.part import parse_part
from dlindex.export.registry import recorded_exports
from dlindex.exported.formats import NAMES
from dlindex.exported.index import PART_INDEX

from .conftest import import_file, invoke, make_jpeg, one_error_line, scan

FORMATS = NAMES  # every registered format
CASES = {
    "plain": {},
    "splits-ranks": {"split": "train=0.6,val=0.4", "world_size": 2, "shard_size": 2, "workers": 2},
    "shuffled-bytes": {"world_size": 3, "shuffle": True, "seed": 5, "shard_bytes": 1500, "workers": 1},
    "drop-last": {"split": "a=0.5,b=0.3,c=0.2", "world_size": 2, "drop_last": True, "shard_size": 3, "workers": 1},
}
EPOCH = "1700000000"


@pytest.fixture(scope="module")
def tree_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """25 images in three classes: JPEGs and PNGs of assorted sizes."""
    base = tmp_path_factory.mktemp("shards")
    root = base / "tree"
    for i in range(25):
        label = ("cat", "dog", "eel")[i % 3]
        if i % 2:
            make_jpeg(root / label / f"{i:02d}.jpg", (12 + i, 10), (i * 9, 3, 4))
        else:
            path = root / label / f"{i:02d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (10 + i, 8 + i % 5), (i * 7, 1, 2)).save(path)
    scan(base / "c.db", root)
    return base / "c.db"


@pytest.fixture(autouse=True)
def _fixed_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)  # created_at is index.json's only time stamp


def files(out: Path) -> dict[str, bytes]:
    """Every file under ``out`` by relative path (folders included as None-less markers)."""
    found: dict[str, bytes] = {}
    for parent, dirs, names in os.walk(out):
        for name in names:
            full = Path(parent) / name
            found[str(full.relative_to(out))] = full.read_bytes()
        for name in dirs:
            found[str((Path(parent) / name).relative_to(out)) + "/"] = b""
    return found


def export(db: Path, out: Path, **options: Any) -> Any:
    with Catalog(db) as catalog:
        return export_catalog(catalog, out, ExportOptions(**options))


def parts(db: Path, base: Path, n: int, **options: Any) -> list[Path]:
    """Write the n parts of an export: base/p0 ... base/p{n-1}."""
    folders = [base / f"p{i}" for i in range(n)]
    for i, folder in enumerate(folders):
        export(db, folder, shard=f"{i}/{n}", **options)
    return folders


def one_and_merged(db: Path, base: Path, n: int, **options: Any) -> tuple[Path, Path]:
    whole = base / "whole"
    export(db, whole, **options)
    merged = base / "merged"
    summary = merge_exports(parts(db, base, n, **options), merged)
    assert summary.parts == n and summary.samples == load_index(whole)["counts"]["samples"]
    return whole, merged


# ---------------------------------------------------------------- merged = one machine, byte for byte


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("n", [1, 3])
def test_merged_parts_are_the_one_machine_export(tree_db: Path, tmp_path: Path, fmt: str, case: str, n: int) -> None:
    whole, merged = one_and_merged(tree_db, tmp_path, n, format=fmt, **CASES[case])
    expected, got = files(whole), files(merged)
    assert sorted(got) == sorted(expected)
    for name, data in expected.items():
        assert got[name] == data, name
    assert verify_export(merged).ok


@pytest.mark.parametrize("fmt", ["wds", "mds", "parquet", "jsonl"])
def test_features_merge_alike(tree_db: Path, tmp_path: Path, fmt: str) -> None:
    db = tmp_path / "f.db"
    shutil.copy(tree_db, db)
    vectors = np.random.default_rng(0).random((25, 3), dtype=np.float32)
    np.savez(tmp_path / "v.npz", ids=np.arange(1, 26), vectors=vectors)
    import_file(db, tmp_path / "v.npz", "emb")
    whole, merged = one_and_merged(db, tmp_path, 2, format=fmt, features="emb", split="train=0.5,val=0.5", world_size=2)
    assert files(whole) == files(merged) and load_index(merged)["features"]["dim"] == 3


def test_only_created_at_differs_without_source_date_epoch(
    tree_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = tmp_path / "whole"
    export(tree_db, whole, format="wds", split="train=0.5,val=0.5", world_size=2)
    folders = parts(tree_db, tmp_path, 2, format="wds", split="train=0.5,val=0.5", world_size=2)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1800000000")
    merge_exports(folders, tmp_path / "merged")
    a, b = load_index(whole), load_index(tmp_path / "merged")
    assert a["created_at"] != b["created_at"]
    assert {**a, "created_at": None} == {**b, "created_at": None}


def test_a_part_writes_only_its_groups(tree_db: Path, tmp_path: Path) -> None:
    options = {"format": "jsonl", "split": "train=0.6,val=0.4", "world_size": 2}
    folders = parts(tree_db, tmp_path, 3, **options)
    manifests = [json.loads((f / PART_INDEX).read_text()) for f in folders]
    groups = manifests[0]["plan"]["groups"]
    assert len(groups) == 4 and all(m["plan"] == manifests[0]["plan"] for m in manifests)
    written = sorted(w["group"] for m in manifests for w in m["written"])
    assert written == [0, 1, 2, 3]  # each group by exactly one part
    for i, m in enumerate(manifests):
        assert m["shard"] == f"{i}/3" and all(groups[w["group"]][3] == i for w in m["written"])
    assert not (folders[0] / "index.json").exists()
    with pytest.raises(ExportError, match="one part of a --part export: merge"):
        load_index(folders[0])


# ---------------------------------------------------------------- read back by the real clients


def test_merged_wds_split_by_node(tree_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    wds = pytest.importorskip("webdataset")
    _, out = one_and_merged(tree_db, tmp_path, 3, format="wds", world_size=2, workers=2, shuffle=True, seed=1)
    index = load_index(out)
    urls = [str(out / name) for name in index["wds"]["urls"]["train"]]
    got = {}
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        dataset = wds.WebDataset(urls, nodesplitter=wds.split_by_node, shardshuffle=False).to_tuple("__key__", "cls")
        got[rank] = [key for key, _ in torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)]
    assert len(got[0]) == len(got[1]) == 13  # 25 padded to 26
    assert {int(k.split("_")[0]) for v in got.values() for k in v} == set(range(1, 26))


def test_merged_mds_reads_in_streaming(tree_db: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    streaming = pytest.importorskip("streaming")
    _, out = one_and_merged(tree_db, tmp_path, 3, format="mds", split="train=0.6,val=0.4", shard_size=4)
    for split in (None, "train", "val"):
        dataset = streaming.StreamingDataset(local=str(out), split=split, shuffle=False, batch_size=1)
        ids = [dataset[i]["id"] for i in range(len(dataset))]
        expected = load_index(out)["counts"]["splits"][split]["samples"] if split else 25
        assert len(ids) == expected
        del dataset
        gc.collect()


def test_merged_parquet_reads_as_a_dataset(tree_db: Path, tmp_path: Path) -> None:
    import pyarrow.dataset as pads

    _, out = one_and_merged(tree_db, tmp_path, 2, format="parquet", split="train=0.6,val=0.4", shard_size=3)
    table = pads.dataset(str(out)).to_table()
    assert sorted(table.column("id").to_pylist()) == list(range(1, 26))


# ---------------------------------------------------------------- the CLI


def test_cli_shard_and_merge(tree_db: Path, tmp_path: Path, runner: Any) -> None:
    for i in range(2):
        result = invoke(runner, "export", str(tmp_path / f"p{i}"), "--format", "wds", "--part", f"{i}/2",
                        "--world-size", "2", "--db", str(tree_db))  # fmt: skip
        assert result.exit_code == 0, result.output
        assert f"part {i}/2" in result.stdout
    result = invoke(runner, "merge", str(tmp_path / "p0"), str(tmp_path / "p1"), "--into", str(tmp_path / "m"))
    assert result.exit_code == 0 and "merged 2 part(s)" in result.stdout, result.output
    assert verify_export(tmp_path / "m").ok
    again = invoke(runner, "merge", str(tmp_path / "p0"), str(tmp_path / "p1"), "--into", str(tmp_path / "m"), "--json")
    assert "not empty" in one_error_line(again)
    result = invoke(runner, "merge", str(tmp_path / "p0"), str(tmp_path / "p1"), "--into", str(tmp_path / "m"),
                    "--overwrite", "--json")  # fmt: skip
    assert result.exit_code == 0 and json.loads(result.stdout)["parts"] == 2, result.output
    missing = invoke(runner, "merge", str(tmp_path / "p1"), "--into", str(tmp_path / "n"))
    assert "part 0/2 missing" in one_error_line(missing) and not (tmp_path / "n").exists()


@pytest.mark.parametrize("text", ["3/3", "x", "1/0", "-1/2", "1/2/3", "0/100001"])
def test_cli_malformed_shard(tree_db: Path, tmp_path: Path, runner: Any, text: str) -> None:
    result = invoke(runner, "export", str(tmp_path / "o"), "--part", text, "--db", str(tree_db))
    assert "--part" in one_error_line(result)
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- what merge refuses


@pytest.fixture
def three(tree_db: Path, tmp_path: Path) -> list[Path]:
    return parts(tree_db, tmp_path, 3, format="wds", split="train=0.6,val=0.4", world_size=2)


def refused(folders: list[Path], into: Path, match: str, **kwargs: Any) -> None:
    before = files(into) if into.exists() else None
    with pytest.raises(ExportError, match=match) as caught:
        merge_exports(folders, into, **kwargs)
    assert "\n" not in str(caught.value)
    assert (files(into) if into.exists() else None) == before
    leftovers = [p for p in into.parent.iterdir() if p.name.startswith(f".{into.name}.dlindex-")]
    assert leftovers == []


def test_missing_part(three: list[Path], tmp_path: Path) -> None:
    refused(three[:2], tmp_path / "m", r"part 2/3 missing")
    refused([], tmp_path / "m", "no parts")


def test_part_given_twice(three: list[Path], tmp_path: Path) -> None:
    refused([*three, three[1]], tmp_path / "m", "given twice")
    shutil.copytree(three[1], tmp_path / "copy")
    refused([*three, tmp_path / "copy"], tmp_path / "m", "both part 1/3")


def test_parts_of_different_exports(three: list[Path], tree_db: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    seeded = parts(tree_db, other, 3, format="wds", split="train=0.6,val=0.4", world_size=2, shuffle=True)
    refused([three[0], seeded[1], three[2]], tmp_path / "m", "different exports.*plan")
    workers = tmp_path / "workers"
    workers.mkdir()
    more = parts(tree_db, workers, 3, format="wds", split="train=0.6,val=0.4", world_size=2, workers=3)
    refused([three[0], more[1], three[2]], tmp_path / "m", r"different exports \(options.workers differs")
    four = tmp_path / "four"
    four.mkdir()
    refused([*three[:2], parts(tree_db, four, 4, format="wds", split="train=0.6,val=0.4", world_size=2)[2]],
            tmp_path / "m", "part 0/3 and .* part 2/4")  # fmt: skip


def test_a_part_of_another_dlindex_version(three: list[Path], tmp_path: Path) -> None:
    edit(three[1], lambda m: m["index"].update(dlindex_version="0.0.1"))
    refused(three, tmp_path / "m", "written by dlindex '0.0.1'")
    edit(three[1], lambda m: m.update(dlindex_part=9))
    refused(three, tmp_path / "m", "part manifest version 9")


def edit(folder: Path, change: Any) -> None:
    manifest = json.loads((folder / PART_INDEX).read_text())
    change(manifest)
    (folder / PART_INDEX).write_text(json.dumps(manifest))


def first_written(folder: Path) -> dict[str, Any]:
    manifest = json.loads((folder / PART_INDEX).read_text())
    entry: dict[str, Any] = next(w for w in manifest["written"] if w["shards"])["shards"][0]
    return entry


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "g000000/../../x", "a//b", ""])
def test_a_path_escaping_the_part_is_refused(three: list[Path], tmp_path: Path, path: str) -> None:
    part = next(p for p in three if json.loads((p / PART_INDEX).read_text())["written"])
    edit(part, lambda m: m["written"][0]["shards"][0].update(file=path))
    refused(three, tmp_path / "m", "absolute|'\\.\\.'|empty")


def test_a_symlink_out_of_the_part_is_refused(three: list[Path], tmp_path: Path) -> None:
    entry = first_written(three[0])
    target = three[0] / entry["file"]
    outside = tmp_path / "outside.tar"
    shutil.copy(target, outside)
    target.unlink()
    target.symlink_to(outside)
    refused(three, tmp_path / "m", "leads out of|symbolic link")


def test_a_wrong_hash_or_a_truncated_file_is_refused(three: list[Path], tmp_path: Path) -> None:
    entry = first_written(three[0])
    path = three[0] / entry["file"]
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    refused(three, tmp_path / "m", "checksum differs from its part manifest; rerun part 0/3")
    path.write_bytes(data[:-512])
    refused(three, tmp_path / "m", f"has {len(data) - 512} bytes, its part manifest says {len(data)}")
    path.write_bytes(data + b"x")
    refused(three, tmp_path / "m", f"expected at most {len(data)}")
    path.unlink()
    refused(three, tmp_path / "m", "is missing; rerun part 0/3")


def test_a_consistent_hand_edit_is_still_refused(three: list[Path], tmp_path: Path) -> None:
    """A file renamed in the part and its manifest: the name is not the writer's."""
    entry = first_written(three[0])
    os.rename(three[0] / entry["file"], three[0] / "renamed.tar")
    edit(three[0], lambda m: next(w for w in m["written"] if w["shards"])["shards"][0].update(file="renamed.tar"))
    refused(three, tmp_path / "m", "lists 'renamed.tar' where group")


def test_out_not_empty_without_overwrite(three: list[Path], tmp_path: Path) -> None:
    into = tmp_path / "m"
    into.mkdir()
    (into / "keep.txt").write_text("mine")
    refused(three, into, "not empty; remove it, choose another, or pass --overwrite")
    refused(three, into, "it has no index.json, so it is not a dlindex export", overwrite=True)
    refused(three, three[1], "is \\(or is inside\\) the part")


def test_overwrite_replaces_an_export_and_a_part(three: list[Path], tree_db: Path, tmp_path: Path) -> None:
    into = tmp_path / "m"
    export(tree_db, into, format="jsonl")
    merge_exports(three, into, overwrite=True)
    assert load_index(into)["format"] == "wds"
    export(tree_db, three[0], format="wds", split="train=0.6,val=0.4", world_size=2, shard="0/3", overwrite=True)
    (three[1] / "stray").write_text("x")
    with pytest.raises(ExportError, match="stray is not part of the export there"):
        export(tree_db, three[1], format="wds", split="train=0.6,val=0.4", world_size=2, shard="1/3", overwrite=True)


def test_the_catalog_records_a_merge_when_given(three: list[Path], tree_db: Path, tmp_path: Path) -> None:
    with Catalog(tree_db) as catalog:
        assert not merge_exports(three, tmp_path / "a").recorded
        assert merge_exports(three, tmp_path / "b", catalog=catalog).recorded
        recorded = {Path(r.path) for r in recorded_exports(catalog)}
        assert tmp_path / "b" in recorded and tmp_path / "a" not in recorded
    with Catalog(tmp_path / "other.db", create=True) as other, pytest.raises(ExportError, match="exported from"):
        merge_exports(three, tmp_path / "c", catalog=other)


def test_merge_links_and_keeps_the_parts(three: list[Path], tmp_path: Path) -> None:
    before = [files(p) for p in three]
    summary = merge_exports(three, tmp_path / "m")
    assert [files(p) for p in three] == before
    assert summary.linked > 0 and verify_export(tmp_path / "m").ok


# ---------------------------------------------------------------- the part manifest parser, fuzzed

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 1 << 40) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


@pytest.fixture(scope="module")
def sample_manifest(tree_db: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("fuzz") / "p"
    export(tree_db, out, format="mds", split="train=0.5,val=0.5", world_size=2, shard="0/2")
    data: dict[str, Any] = json.loads((out / PART_INDEX).read_text())
    return data


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, (*prefix, i))
    return found


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), replacement=_JSON, raw=st.none() | st.binary(max_size=80))
def test_a_damaged_part_manifest_raises_export_error(
    sample_manifest: dict[str, Any], data: st.DataObject, replacement: Any, raw: bytes | None
) -> None:
    manifest = json.loads(json.dumps(sample_manifest))
    where = data.draw(st.sampled_from(_paths(manifest)))
    if where:
        parent = manifest
        for key in where[:-1]:
            parent = parent[key]
        parent[where[-1]] = replacement
    else:
        manifest = replacement
    blob = raw if raw is not None else json.dumps(manifest).encode()
    try:
        part = parse_part(blob, Path("p"))
    except ExportError:
        return
    assert isinstance(part.shard, Part) and all(isinstance(s.file, str) for v in part.written.values() for s in v)
    for shards in part.written.values():
        for shard in shards:
            assert not shard.file.startswith("/") and ".." not in shard.file.split("/")


def test_the_sample_manifest_parses(sample_manifest: dict[str, Any]) -> None:
    part = parse_part(json.dumps(sample_manifest).encode(), Path("p"))
    assert part.shard == Part(0, 2) and part.format == "mds" and part.written
    assert {s.file.split("/")[0] for v in part.written.values() for s in v} <= {
        "g000000",
        "g000001",
        "g000002",
        "g000003",
    }


@pytest.fixture(scope="module")
def two_parts(tree_db: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("two")
    return parts(tree_db, base, 2, format="jsonl", split="train=0.5,val=0.5", world_size=2, shard_size=3)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), replacement=_JSON)
def test_a_merge_of_a_damaged_part_fails_cleanly_or_verifies(
    two_parts: list[Path], data: st.DataObject, replacement: Any
) -> None:
    """Whatever a part manifest says, merge raises ExportError (nothing written) or writes an export that verifies."""
    manifest = json.loads((two_parts[0] / PART_INDEX).read_text())
    where = data.draw(st.sampled_from([p for p in _paths(manifest) if p]))
    parent = manifest
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = replacement
    with tempfile.TemporaryDirectory() as tmp:
        folders = [Path(tmp) / p.name for p in two_parts]
        for source, folder in zip(two_parts, folders, strict=True):
            shutil.copytree(source, folder)
        (folders[0] / PART_INDEX).write_text(json.dumps(manifest))
        try:
            merge_exports(folders, Path(tmp) / "m")
        except ExportError:
            assert not (Path(tmp) / "m").exists()
            assert sorted(os.listdir(tmp)) == ["p0", "p1"]
            return
        assert verify_export(Path(tmp) / "m").ok


def test_cli_an_idle_part_says_so(tree_db: Path, tmp_path: Path, runner: Any) -> None:
    result = invoke(runner, "export", str(tmp_path / "p1"), "--part", "1/2", "--db", str(tree_db), "-q")
    assert result.exit_code == 0 and "part 1/2 has nothing to write" in result.stderr, result.output
    assert os.listdir(tmp_path / "p1") == [PART_INDEX]


# ---------------------------------------------------------------- tree splits and group-aware splits


@pytest.fixture(scope="module")
def presplit_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pre-split tree (train/ and val/ folders) with a copy of one image under another name."""
    base = tmp_path_factory.mktemp("presplit")
    root = base / "tree"
    for split, n in (("train", 14), ("val", 6)):
        for i in range(n):
            make_jpeg(root / split / ("cat", "dog")[i % 2] / f"{i:02d}.jpg", (12 + i, 10), (i * 9, 3, 4))
    shutil.copy(root / "train" / "cat" / "00.jpg", root / "train" / "dog" / "copy.jpg")
    scan(base / "c.db", root)
    return base / "c.db"


@pytest.mark.parametrize("fmt", ["wds", "jsonl", "mds"])
@pytest.mark.parametrize(
    "options",
    [
        {"split": "tree", "world_size": 2, "shard_size": 3},
        {"split": "train=0.7,val=0.3", "group": "near-dups", "group_type": "dhash", "world_size": 2},
        {"split": "train=0.7,val=0.3", "group": "near-dups", "group_type": "colorthumb", "world_size": 2},
    ],
    ids=["tree", "dhash", "colorthumb"],
)
def test_tree_and_grouped_splits_merge_alike(
    presplit_db: Path, tmp_path: Path, fmt: str, options: dict[str, Any]
) -> None:
    if options.get("group_type"):
        db = tmp_path / "c.db"
        shutil.copy(presplit_db, db)
        from dlindex.features import ComputeOptions, compute_features

        with Catalog(db) as catalog:  # computed first: parts must see one catalog state
            compute_features(catalog, options["group_type"], options=ComputeOptions(workers=1))
    else:
        db = presplit_db
    whole, merged = one_and_merged(db, tmp_path, 3, format=fmt, **options)
    assert files(merged) == files(whole)
    assert verify_export(merged).ok
