"""`export --append`: what changed since an export joins it in new files, the old ones untouched;
its live samples are then exactly those of a new export of the catalog, read by dlindex and by
each client's own recipe; a killed append leaves the old export and is completed by the next."""

from __future__ import annotations

import fcntl
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dlindex import Catalog, QuerySpec, mark_samples
from dlindex.export import ExportError, load_index, verify_export
from dlindex.export.append import AppendSummary, append_export
from dlindex.export.graft import apply_journal
from dlindex.exported.appended import generation, keeps, removed_ids
from dlindex.exported.index import index_path, listed_shards
from dlindex.loader import ManifestDataset, WdsDataset

from .backends import ON_BOTH_BACKENDS, where
from .conftest import export, invoke, make_png, one_error_line, rewrite_export_file, scan

pytestmark = ON_BOTH_BACKENDS

MANIFESTS = ("jsonl", "csv", "parquet", "dali")
SPLIT = "train=0.7,val=0.3"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    for label in ("cat", "dog"):
        for i in range(8):
            make_png(root / label / f"{i:02d}.png", (10 + i, 12), (i * 20, 50 if label == "cat" else 150, 3))
    return root


@pytest.fixture
def db(tree: Path, tmp_path: Path) -> Path:
    location = where(tmp_path / "c.db")
    scan(location, tree)
    return location


def week(db: Path, tree: Path) -> None:
    """A week of changes: new files (one a copy of a sample, one of a new class), new content,
    a file moved to another class, a file deleted, a sample set aside."""
    make_png(tree / "cat" / "new0.png", (31, 30), (1, 2, 3))
    make_png(tree / "bird" / "b0.png", (9, 9), (4, 5, 6))
    shutil.copyfile(tree / "dog" / "03.png", tree / "dog" / "copy03.png")
    make_png(tree / "cat" / "01.png", (11, 12), (255, 255, 0))
    os.rename(tree / "dog" / "05.png", tree / "cat" / "moved05.png")
    (tree / "cat" / "06.png").unlink()
    scan(db, tree, prune=True)
    with Catalog(db) as catalog:
        mark_samples(catalog, ["2"], excluded=True)


def file_hashes(out: Path) -> dict[str, str]:
    """Every file of an export but its index files (the ones an append may replace)."""
    found = {}
    for path in out.rglob("*"):
        if path.is_file() and path.name not in ("index.json", "_index.json"):
            found[str(path.relative_to(out))] = xxhash.xxh3_128_hexdigest(path.read_bytes())
    return found


def live(out: Path) -> set[tuple[str, int, str]]:
    """(split, id, label) of every sample dlindex's readers give from an export."""
    index = load_index(out)
    found: set[tuple[str, int, str]] = set()
    for split in index["counts"]["splits"]:
        if index["format"] == "wds":
            world = index["options"]["world_size"]
            for rank in range(world):
                ds = WdsDataset(out, split, rank=rank, world_size=world, decode=False, with_metadata=True)
                found |= {(split, meta["id"], ds.classes[label]) for _, label, meta in ds}
        elif index["format"] == "mds":
            found |= {(split, s["id"], index["classes"][s["label"]]) for s in streaming_recipe(out, split)}
        else:
            ds = ManifestDataset(out, split)
            found |= {(split, int(i), ds.classes[label]) for i, label in zip(ds.ids, ds.labels, strict=True)}
    return found


def recipe_maps(out: Path, index_name: str) -> tuple[dict[str, int], dict[int, int]]:
    """What each recipe of docs/versions.md reads first, as it reads it (plain json, no dlindex):
    each shard's generation, and each removed id's latest removing generation."""
    index = json.loads((out / index_name).read_text())
    generations = {s["file"]: s.get("generation", 0) for s in index["dlindex_shards"]}
    removed: dict[int, int] = {}
    for entry in index.get("appends", []):
        if entry["removed_file"]:
            for i in json.loads((out / entry["removed_file"]).read_text()):
                removed[i] = max(removed.get(i, 0), entry["generation"])
    return generations, removed


def streaming_recipe(out: Path, split: str) -> list[dict[str, Any]]:
    """docs/versions.md's StreamingDataset recipe: each sample knows its shard's generation,
    and a copy an append replaced or removed is skipped."""
    pytest.importorskip("torch")
    streaming = pytest.importorskip("streaming")
    generations, removed = recipe_maps(out, "index.json")

    class Live(streaming.StreamingDataset):  # type: ignore[misc]
        def get_item(self, sample_id: int, retry: int = 7) -> Any:
            sample = super().get_item(sample_id, retry)
            shard_id, _ = self.spanner[sample_id]
            sample["generation"] = generations[f"{split}/{self.shards[shard_id].raw_data.basename}"]
            return sample

    dataset = Live(local=str(out), split=split, shuffle=False, batch_size=1)
    got = [s for s in (dataset[i] for i in range(len(dataset))) if s["generation"] >= removed.get(s["id"], 0)]
    del dataset
    gc.collect()
    return got


def append(db: Path, out: Path) -> AppendSummary:
    with Catalog(db) as catalog:
        return append_export(catalog, out)


@pytest.mark.parametrize("fmt", [*MANIFESTS, "wds", "mds"])
def test_an_appended_export_holds_what_a_new_export_holds_and_its_files_are_untouched(
    db: Path, tree: Path, tmp_path: Path, fmt: str
) -> None:
    world = 2 if fmt == "wds" else 1
    out = tmp_path / "out"
    export(db, out, format=fmt, split=SPLIT, world_size=world, workers=2, drop_last=False)
    before = file_hashes(out)
    week(db, tree)
    summary = append(db, out)
    assert summary.generation == 1 and summary.added >= 4 and summary.removed == 3
    after = file_hashes(out)
    assert {k: after[k] for k in before} == before  # byte for byte
    assert verify_export(out).ok
    export(db, tmp_path / "fresh", format=fmt, split=SPLIT, world_size=world, workers=2)
    assert live(out) == live(tmp_path / "fresh")
    index = load_index(out)
    assert index["classes"][:2] == ["cat", "dog"] and index["classes"][2] == "bird"  # old ids keep their meaning
    with Catalog(db) as catalog:
        assert index["catalog"]["changes"] == catalog.changes()
    # a second week, appended again: still the same samples as a new export
    make_png(tree / "dog" / "new1.png", (13, 13), (9, 9, 9))
    with Catalog(db) as catalog:
        mark_samples(catalog, ["2"], excluded=False)
    scan(db, tree)
    assert append(db, out).generation == 2
    export(db, tmp_path / "fresh2", format=fmt, split=SPLIT, world_size=world, workers=2)
    assert live(out) == live(tmp_path / "fresh2")
    assert append(db, out).generation == 0  # nothing changed since: nothing written
    assert verify_export(out).ok


def test_a_new_copy_of_an_image_goes_to_the_split_of_the_original(db: Path, tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    export(db, out, format="jsonl", split="train=0.5,val=0.5", seed=3)
    for path in sorted(tree.rglob("*.png")):
        shutil.copyfile(path, path.with_name("copy-" + path.name))
    scan(db, tree)
    append(db, out)
    split_of: dict[str, set[str]] = {}
    index = load_index(out)
    for split in index["counts"]["splits"]:
        ds = ManifestDataset(out, split)
        for path in ds.paths:
            *_, label, name = os.fsdecode(path).split("/")
            split_of.setdefault(f"{label}/{name.removeprefix('copy-')}", set()).add(split)
    assert len(split_of) == 16 and all(len(s) == 1 for s in split_of.values())


def test_the_wds_recipe_split_by_node_reads_the_appended_shards(
    db: Path, tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    wds = pytest.importorskip("webdataset")
    out = tmp_path / "w"
    export(db, out, format="wds", world_size=2, workers=2)
    week(db, tree)
    append(db, out)
    index = load_index(out)
    urls = [str(out / name) for name in index["wds"]["urls"]["train"]]
    assert urls == sorted(urls)
    generations = {s["file"]: generation(s) for s in listed_shards(index)}
    removed = removed_ids(out, index)

    def current(sample: dict[str, Any]) -> bool:  # docs/versions.md's select
        return keeps(removed, generations[os.path.basename(sample["__url__"])], int(sample["__key__"][:12]))

    got = set()
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        dataset = wds.WebDataset(urls, nodesplitter=wds.split_by_node, shardshuffle=False).select(current)
        loader = torch.utils.data.DataLoader(dataset.to_tuple("__key__", "cls"), batch_size=None, num_workers=2)
        mine = {int(key[:12]) for key, _ in loader}
        assert not mine & got  # each rank its own shards
        got |= mine
    export(db, tmp_path / "fresh", format="wds")
    assert got == {i for _, i, _ in live(tmp_path / "fresh")}


def test_the_pyarrow_recipe_reads_the_appended_folder(db: Path, tree: Path, tmp_path: Path) -> None:
    ds = pytest.importorskip("pyarrow.dataset")
    pc = pytest.importorskip("pyarrow.compute")
    pa = pytest.importorskip("pyarrow")
    out = tmp_path / "p"
    export(db, out, format="parquet")
    week(db, tree)
    append(db, out)
    # docs/versions.md: pyarrow.dataset(DIR), each file's rows less those a later generation removed
    generations, removed = recipe_maps(out, "_index.json")
    dataset = ds.dataset(str(out), format="parquet")
    tables = []
    for fragment in dataset.get_fragments():
        g = generations[os.path.basename(fragment.path)]
        stale = [i for i, r in removed.items() if r > g]
        tables.append(fragment.to_table(filter=~pc.field("id").isin(stale)))
    table = pa.concat_tables(tables)
    assert len(dataset.files) == len(generations)  # the index and removal lists are not read as data
    export(db, tmp_path / "fresh", format="parquet")
    assert sorted(table.column("id").to_pylist()) == sorted(i for _, i, _ in live(tmp_path / "fresh"))


def test_a_killed_append_leaves_the_old_export_and_the_next_one_completes_it(
    db: Path, tree: Path, tmp_path: Path
) -> None:
    out = tmp_path / "w"
    export(db, out, format="wds", world_size=2, workers=2)
    old = load_index(out)
    old_live = live(out)
    week(db, tree)
    # kill -9 after the journal, after the first file was renamed in
    code = textwrap.dedent(f"""
        import os, signal, types
        import dlindex.export.graft as graft
        from dlindex import Catalog
        from dlindex.export.append import append_export
        def rename(a, b):
            os.rename(a, b)
            if str(b).endswith(".tar"):
                os.kill(os.getpid(), signal.SIGKILL)
        graft.os = types.SimpleNamespace(**{{k: getattr(os, k) for k in dir(os)}})  # only graft's renames
        graft.os.rename = rename
        with Catalog({str(db)!r}) as catalog:
            append_export(catalog, {str(out)!r})
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    assert load_index(out) == old and live(out) == old_live  # the old export, whole and readable
    summary = append(db, out)
    assert summary.completed == 1 and summary.generation == 0  # completed, nothing more had changed
    export(db, tmp_path / "fresh", format="wds", world_size=2, workers=2)
    assert live(out) == live(tmp_path / "fresh")
    assert verify_export(out).ok and not (out / ".dlindex-append").exists()


def test_a_kill_before_the_journal_is_undone_by_the_next_append(db: Path, tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "j"
    export(db, out, format="jsonl")
    old, old_live = load_index(out), live(out)
    week(db, tree)
    code = textwrap.dedent(f"""
        import os, signal
        import dlindex.export.graft as graft
        from dlindex import Catalog
        from dlindex.export.append import append_export
        def die(*a, **k):
            os.kill(os.getpid(), signal.SIGKILL)
        graft._write_synced = die
        with Catalog({str(db)!r}) as catalog:
            append_export(catalog, {str(out)!r})
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    assert (out / ".dlindex-append" / "delta").is_dir()  # what it wrote, not yet part of the export
    assert load_index(out) == old and live(out) == old_live
    assert append(db, out).generation == 1
    export(db, tmp_path / "fresh", format="jsonl")
    assert live(out) == live(tmp_path / "fresh")


def test_an_edited_export_is_refused_and_nothing_is_written(
    db: Path, tree: Path, tmp_path: Path, runner: CliRunner
) -> None:
    out = tmp_path / "w"
    export(db, out, format="wds", workers=1)
    week(db, tree)
    shard = out / "train-000000.tar"
    with open(shard, "ab") as f:
        f.write(b"\0" * 512)
    before = sorted(p.name for p in out.iterdir())
    index = index_path(out).read_bytes()
    line = one_error_line(invoke(runner, "export", str(out), "--append", "--db", str(db)))
    assert "refusing to append to" in line and "train-000000.tar" in line
    assert sorted(p.name for p in out.iterdir()) == before and index_path(out).read_bytes() == index


def test_appends_that_cannot_continue_the_selection_are_refused(
    db: Path, tree: Path, tmp_path: Path, runner: CliRunner
) -> None:
    out = tmp_path / "l"
    export(db, out, format="jsonl", query=QuerySpec(limit=5))
    line = one_error_line(invoke(runner, "export", str(out), "--append", "--db", str(db)))
    assert "--limit" in line
    line = one_error_line(invoke(runner, "export", str(tmp_path / "none"), "--append", "--db", str(db)))
    assert "does not exist" in line
    out = tmp_path / "ok"
    export(db, out, format="jsonl")
    result = invoke(runner, "export", str(out), "--append", "--at", "1", "--db", str(db))
    assert result.exit_code == 2 and "--append extends OUT_DIR on this machine" in result.output
    held = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # another append at work
        line = one_error_line(invoke(runner, "export", str(out), "--append", "--db", str(db)))
        assert "another dlindex export --append" in line
    finally:
        os.close(held)


def test_the_cli_appends_with_the_catalog_its_index_names(
    db: Path, tree: Path, tmp_path: Path, runner: CliRunner
) -> None:
    out = tmp_path / "c"
    export(db, out, format="csv")
    result = invoke(runner, "export", str(out), "--append", "--db", str(db), "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["generation"] == 0
    week(db, tree)
    result = invoke(runner, "export", str(out), "--append", "--db", str(db))
    assert result.exit_code == 0 and "appended generation 1" in result.stdout


def test_a_wds_dataset_reads_an_append_from_its_next_epoch(db: Path, tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "w"
    export(db, out, format="wds", workers=1)
    dataset = WdsDataset(out, "train", decode=False, with_metadata=True)
    first = {meta["id"] for _, _, meta in dataset}
    make_png(tree / "cat" / "late.png", (40, 41), (7, 7, 7))
    scan(db, tree)
    append(db, out)
    assert {meta["id"] for _, _, meta in dataset} == first  # this epoch: as it began
    dataset.set_epoch(1)
    assert len({meta["id"] for _, _, meta in dataset} - first) == 1


def test_a_near_copy_joins_its_group_in_the_split_it_has(tmp_path: Path) -> None:
    import random

    from PIL import Image

    tree = tmp_path / "textured"
    rng = random.Random(5)
    for k in range(12):  # textured images: solid ones carry too little to group (dlindex dups)
        image = Image.new("L", (32, 32))
        image.putdata([rng.randrange(256) for _ in range(32 * 32)])
        (tree / ("a", "b")[k % 2]).mkdir(parents=True, exist_ok=True)
        image.convert("RGB").save(tree / ("a", "b")[k % 2] / f"{k:02d}.png")
    db = where(tmp_path / "g.db")
    scan(db, tree)
    out = tmp_path / "g"
    export(db, out, format="jsonl", split="train=0.5,val=0.5", group="near-dups")

    def named(p: bytes) -> str:
        return "/".join(os.fsdecode(p).rsplit("/", 2)[-2:])

    split_of = {named(p): s for s in ("train", "val") for p in ManifestDataset(out, s).paths}
    assert set(split_of.values()) == {"train", "val"}
    for name in split_of:
        image = Image.open(tree / name).convert("RGB")
        image.putpixel((0, 0), (255, 255, 255))  # a near copy: another content hash, the same dhash
        image.save(tree / name.replace(".png", "-near.png"))
    scan(db, tree)
    append(db, out)
    near = {named(p): s for s in ("train", "val") for p in ManifestDataset(out, s).paths if b"-near" in p}
    assert len(near) == 12
    assert all(split_of[name.replace("-near.png", ".png")] == s for name, s in near.items())


def test_an_export_whose_state_was_pruned_is_refused(db: Path, tree: Path, tmp_path: Path, runner: CliRunner) -> None:
    from dlindex.catalog.versions import list_versions, prune_before

    out = tmp_path / "p"
    export(db, out, format="jsonl")
    week(db, tree)
    with Catalog(db) as catalog:
        prune_before(catalog, max(v.id for v in list_versions(catalog)))
    index = index_path(out).read_bytes()
    line = one_error_line(invoke(runner, "export", str(out), "--append", "--db", str(db)))
    assert "state" in line and "dlindex versions" in line
    assert index_path(out).read_bytes() == index and not (out / ".dlindex-append").exists()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=64), st.builds(lambda v: json.dumps(v).encode(), st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8))))  # fmt: skip
def test_a_tampered_removal_list_is_one_export_error(appended: Path, data: bytes) -> None:
    """The removal list, rewritten with any bytes (and its hash in index.json to match): read as
    ids, or refused as ExportError; never another exception."""
    name = load_index(appended)["appends"][0]["removed_file"]
    rewrite_export_file(appended, name, data)
    try:
        removed = removed_ids(appended, load_index(appended))
    except ExportError:
        return
    assert all(isinstance(k, int) and v == 1 for k, v in removed.items())


def test_a_journal_that_names_paths_outside_the_export_is_refused(appended: Path, tmp_path: Path) -> None:
    staging = appended / ".dlindex-append"
    staging.mkdir()
    outside = tmp_path / "victim"
    outside.write_text("keep")
    journal = {"generation": 9, "renames": [["../victim", "x.jsonl"]], "replaced": [["../victim", "index.json"]]}
    (staging / "journal.json").write_text(json.dumps(journal))
    with pytest.raises(ExportError, match="outside the export"):
        apply_journal(appended)
    assert outside.read_text() == "keep" and load_index(appended)["appends"][0]["generation"] == 1


@pytest.fixture
def appended(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A jsonl export appended to once, with removals."""
    root = tmp_path / "t"
    for i in range(6):
        make_png(root / ("a", "b")[i % 2] / f"{i}.png", (8 + i, 8), (i * 30, 1, 2))
    db = where(tmp_path / "a.db")
    scan(db, root)
    out = tmp_path / "ap"
    export(db, out, format="jsonl")
    (root / "a" / "0.png").unlink()
    make_png(root / "a" / "new.png", (20, 20), (9, 9, 9))
    scan(db, root, prune=True)
    append(db, out)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=48), st.builds(lambda v: json.dumps(v).encode(), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["generation", "renames", "replaced", "x"]), inner, max_size=4),
    max_leaves=10))))  # fmt: skip
def test_any_journal_is_completed_or_refused_in_one_line(appended: Path, data: bytes) -> None:
    """A journal left in OUT with any content: applied, or ExportError; nothing outside OUT is touched."""
    staging = appended / ".dlindex-append"
    staging.mkdir(exist_ok=True)
    (staging / "journal.json").write_bytes(data)
    try:
        apply_journal(appended)
    except ExportError:
        shutil.rmtree(staging)
    assert load_index(appended)["format"] == "jsonl"


def test_a_journal_cannot_reach_out_through_a_linked_folder(appended: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (appended / "link").symlink_to(elsewhere)
    staging = appended / ".dlindex-append"
    staging.mkdir()
    (staging / "x").write_text("x")
    (staging / "journal.json").write_text(
        json.dumps({"generation": 2, "renames": [[".dlindex-append/x", "link/x"]], "replaced": []})
    )
    with pytest.raises(ExportError, match="outside the export"):
        apply_journal(appended)
    assert list(elsewhere.iterdir()) == []


def test_a_group_by_export_puts_new_members_of_a_group_in_its_split(tmp_path: Path) -> None:
    from dlindex import ScanOptions, scan_tree

    root = tmp_path / "v"
    for i in range(20):
        make_png(root / ("a", "b")[i % 2] / f"{i:03d}.png", (9 + i, 9), (i * 10, 3, 3))
    labels = tmp_path / "labels.csv"
    labels.write_text("path,video\n" + "".join(f"{('a', 'b')[i % 2]}/{i:03d}.png,v{i % 5}\n" for i in range(20)))
    db = where(tmp_path / "v.db")
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1, labels_file=labels))
    out = tmp_path / "g"
    export(db, out, format="jsonl", split="train=0.5,val=0.5", group_by="video")
    for i in range(20, 30):  # a second day of each video
        make_png(root / ("a", "b")[i % 2] / f"{i:03d}.png", (40 + i, 9), (i * 5, 90, 3))
    labels.write_text(
        labels.read_text() + "".join(f"{('a', 'b')[i % 2]}/{i:03d}.png,v{i % 5}\n" for i in range(20, 30))
    )
    with Catalog(db) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1, labels_file=labels))
    assert append(db, out).generation == 1
    video_split: dict[str, set[str]] = {}
    for split in ("train", "val"):
        for path in ManifestDataset(out, split).paths:
            i = int(os.fsdecode(path).rsplit("/", 1)[-1][:3])
            video_split.setdefault(f"v{i % 5}", set()).add(split)
    assert len(video_split) == 5 and all(len(s) == 1 for s in video_split.values())


def test_an_export_with_features_and_ranks_appends_both(db: Path, tree: Path, tmp_path: Path) -> None:
    from .conftest import compute

    compute(db, "dhash")
    with Catalog(db) as catalog:
        from dlindex.features import set_auto

        set_auto(catalog, "dhash")
    out = tmp_path / "f"
    export(db, out, format="wds", features="dhash", world_size=2, workers=1)
    make_png(tree / "dog" / "late.png", (30, 31), (5, 6, 7))
    make_png(tree / "cat" / "later.png", (31, 30), (7, 6, 5))
    scan(db, tree)
    compute(db, "dhash", queued=True)
    assert append(db, out).added >= 2
    index = load_index(out)
    new = [s for s in listed_shards(index) if generation(s) == 1]
    assert sorted(s["rank"] for s in new) == [0, 1]  # each rank its share of the new samples
    members = set()
    for shard in new:
        with tarfile.open(out / shard["file"]) as tar:
            members |= {m.name.rsplit(".", 1)[1] for m in tar.getmembers()}
    assert {"npy", "cls", "json"} <= members
    assert verify_export(out).ok
    export(db, tmp_path / "fresh", format="wds", features="dhash", world_size=2, workers=1)
    assert live(out) == live(tmp_path / "fresh")
