"""Each export read by its own client, the way that client's docs (and ours) say to read it."""

from __future__ import annotations

import base64
import gc
import json
import os
import tarfile
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from dlindex import QuerySpec
from dlindex.export import ExportError, load_index, manifest_rows, verify_export
from dlindex.exported.index import listed_shards
from dlindex.loader import ManifestDataset, WdsDataset

from .backends import ON_BOTH_BACKENDS, where
from .conftest import exported, make_jpeg, make_png, scan

pytestmark = ON_BOTH_BACKENDS

DOCS = Path(__file__).resolve().parents[1] / "docs"
FORMATS = {"JPEG": "jpg", "PNG": "png", "GIF": "gif", "BMP": "bmp", "WEBP": "webp"}


@pytest.fixture
def formats_db(tmp_path: Path) -> Path:
    """30 images: the first 8 (folder "a") JPEG, then PNG, GIF, BMP and WebP."""
    root = tmp_path / "tree"
    for i in range(8):
        make_jpeg(root / "a" / f"{i:02d}.jpg", (20 + i, 10), (i * 20, 1, 2))
    for i in range(22):
        fmt = ("PNG", "GIF", "BMP", "WEBP")[i % 4]
        path = root / ("b", "c")[i % 2] / f"{i:02d}.{FORMATS[fmt]}"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (10 + i, 12), (i * 9, 3, 4)).save(path, fmt)
    db = where(tmp_path / "f.db")
    scan(db, root)
    return db


def tar_keys(out: Path, shards: list[dict[str, Any]]) -> list[str]:
    keys = []
    for shard in shards:
        with tarfile.open(out / shard["file"]) as tar:
            keys += [m.name.split(".")[0] for m in tar.getmembers() if m.name.endswith(".cls")]
    return keys


# ---------------------------------------------------------------- parquet: a folder


def test_a_parquet_export_reads_as_a_folder(formats_db: Path, tmp_path: Path) -> None:
    import pandas as pd
    import pyarrow.dataset as pads

    datasets = pytest.importorskip("datasets")
    out = exported(formats_db, tmp_path / "pq", format="parquet", split="train=0.5,val=0.5", shard_size=4)
    index = load_index(out)
    counts = {k: v["samples"] for k, v in index["counts"]["splits"].items()}
    assert (out / "_index.json").is_file() and not (out / "index.json").exists()
    assert pads.dataset(str(out)).count_rows() == 30
    frame = pd.read_parquet(out)
    assert len(frame) == 30 and sorted(frame["id"]) == list(range(1, 31))
    loaded = datasets.load_dataset("parquet", data_dir=str(out), cache_dir=str(tmp_path / "hf"))
    # HF names a split from the file names: train-*.parquet -> train, val-*.parquet -> validation.
    assert {k: len(v) for k, v in loaded.items()} == {"train": counts["train"], "validation": counts["val"]}
    assert verify_export(out).ok


# ---------------------------------------------------------------- mds: StreamingDataset, with and without split


def test_streaming_reads_the_export_root_and_each_split(formats_db: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    streaming = pytest.importorskip("streaming")
    out = exported(formats_db, tmp_path / "m", format="mds", split="train=0.6,val=0.4", shard_size=5)
    index = load_index(out)
    assert index["version"] == 2 and all(e["raw_data"]["basename"].count("/") == 1 for e in index["shards"])

    def ids(**kwargs: Any) -> list[int]:
        dataset = streaming.StreamingDataset(local=str(out), shuffle=False, batch_size=1, **kwargs)
        got = [dataset[i]["id"] for i in range(len(dataset))]
        del dataset
        gc.collect()
        return got

    everything = ids()
    assert sorted(everything) == list(range(1, 31))
    per_split = {s: ids(split=s) for s in ("train", "val")}
    assert {s: len(v) for s, v in per_split.items()} == {s: c["samples"] for s, c in index["counts"]["splits"].items()}
    assert sorted(per_split["train"] + per_split["val"]) == sorted(everything)
    assert verify_export(out).ok


# ---------------------------------------------------------------- wds: split_by_node, workers, key spec, HF


@pytest.mark.parametrize(("world", "drop_last"), [(2, False), (3, True)])
def test_split_by_node_gives_each_rank_its_samples(
    formats_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world: int, drop_last: bool
) -> None:
    torch = pytest.importorskip("torch")
    wds = pytest.importorskip("webdataset")
    out = exported(
        formats_db, tmp_path / "w", format="wds", world_size=world, drop_last=drop_last, workers=2, shuffle=True, seed=4
    )
    index = load_index(out)
    urls = [str(out / name) for name in index["wds"]["urls"]["train"]]
    assert urls == sorted(urls) and index["wds"]["shards_per_rank"]["train"] % 2 == 0
    got = {}
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        dataset = wds.WebDataset(urls, nodesplitter=wds.split_by_node, shardshuffle=False).to_tuple("__key__", "cls")
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
        got[rank] = [key for key, _ in loader]  # empty_check: a worker without shards would raise here
        mine = [s for s in listed_shards(index) if s["rank"] == rank]
        assert sorted(got[rank]) == sorted(tar_keys(out, mine))
    assert len({len(v) for v in got.values()}) == 1
    assert sum(len(v) for v in got.values()) == index["counts"]["samples"]


def test_enough_shards_for_the_workers(formats_db: Path, tmp_path: Path) -> None:
    index = load_index(exported(formats_db, tmp_path / "w", format="wds", workers=4, shard_bytes="1GB"))
    assert index["wds"]["shards_per_rank"] == {"train": 4} and index["options"]["workers"] == 4
    few = load_index(exported(formats_db, tmp_path / "few", format="wds", workers=64, query=QuerySpec(limit=5)))
    assert few["wds"]["shards_per_rank"] == {"train": 5}  # one sample a shard: never an empty shard
    with pytest.raises(ExportError, match="--workers"):
        exported(formats_db, tmp_path / "bad", format="wds", workers=0)


def test_one_key_spec_reads_every_image_format(formats_db: Path, tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    out = exported(formats_db, tmp_path / "w", format="wds", workers=2)
    index = load_index(out)
    spec = index["wds"]["image_key"]
    assert spec == "jpg;png;webp;gif;bmp;tiff" and f'"{spec}"' in (DOCS / "commands" / "export.md").read_text()
    urls = [str(out / name) for name in index["wds"]["urls"]["train"]]
    seen = Counter()
    for image, cls, meta in wds.WebDataset(urls, shardshuffle=False).decode("pil").to_tuple(spec, "cls", "json"):
        assert image.size == (meta["width"], meta["height"]) and cls == meta["label_id"]
        seen[meta["format"]] += 1
    assert set(seen) == set(FORMATS) and sum(seen.values()) == 30


def test_hf_webdataset_reads_every_image_by_the_docs_recipe(formats_db: Path, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    out = exported(formats_db, tmp_path / "w", format="wds", workers=1)
    index = load_index(out)
    # The recipe in docs/commands/export.md: the features index.json carries, so HF does not
    # infer the columns from the first samples (all JPEG here: png, gif, ... would vanish).
    assert 'Features.from_dict(index["wds"]["hf_features"])' in (DOCS / "commands" / "export.md").read_text()
    features = datasets.Features.from_dict(index["wds"]["hf_features"])
    files = {split: [str(out / u) for u in urls] for split, urls in index["wds"]["urls"].items()}
    loaded = datasets.load_dataset("webdataset", data_files=files, features=features, cache_dir=str(tmp_path / "hf"))
    rows = list(loaded["train"])
    image_keys = [k for k in index["wds"]["image_key"].split(";") if k in features]
    assert len(rows) == 30 and set(image_keys) == set(FORMATS.values())
    for row in rows:
        images = [row[k] for k in image_keys if row[k] is not None]
        assert len(images) == 1 and images[0].size == (row["json"]["width"], row["json"]["height"])


def test_the_default_split_is_one_hf_accepts(formats_db: Path, tmp_path: Path) -> None:
    index = load_index(exported(formats_db, tmp_path / "j"))
    assert list(index["counts"]["splits"]) == ["train"]
    with pytest.raises(ExportError, match="reserved"):
        exported(formats_db, tmp_path / "bad", split="all=0.5,val=0.5")


# ---------------------------------------------------------------- WdsDataset with another world size


@pytest.mark.parametrize(("export_world", "drop_last", "read_world", "per_rank"), [
    (2, False, 3, 10),  # 30 samples: 10 each
    (1, False, 4, 8),  # 30 over 4: padded to 32
    (2, True, 4, 7),  # 30 over 4: 2 dropped, as the export's --drop-last
    (1, True, 40, 1),  # dropping would leave ranks nothing: padded instead
])  # fmt: skip
def test_wds_dataset_with_another_world_size(
    formats_db: Path, tmp_path: Path, export_world: int, drop_last: bool, read_world: int, per_rank: int
) -> None:
    out = exported(formats_db, tmp_path / "w", format="wds", world_size=export_world, drop_last=drop_last, workers=2)
    with pytest.warns(UserWarning, match=f"exported for world size {export_world}, read with {read_world}") as caught:
        datasets = [
            WdsDataset(out, rank=r, world_size=read_world, decode=False, with_metadata=True) for r in range(read_world)
        ]
    assert len(caught) == read_world  # once per dataset made, none per DataLoader worker
    counts = [len(list(d)) for d in datasets]
    assert counts == [per_rank] * read_world == [len(d) for d in datasets]
    if per_rank * read_world <= 30 and export_world == 1:
        ids = [m["id"] for d in datasets for _, _, m in d]
        assert len(ids) == len(set(ids))  # no sample twice unless padding


def test_wds_dataset_other_world_size_with_dataloader_workers(formats_db: Path, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    out = exported(formats_db, tmp_path / "w", format="wds", world_size=2, workers=2)
    seen = []
    for rank in range(3):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dataset = WdsDataset(out, rank=rank, world_size=3, decode=False, with_metadata=True)
            ids = [int(m["id"][0]) for _, _, m in torch.utils.data.DataLoader(dataset, batch_size=1, num_workers=2)]
        assert len([w for w in caught if "world size" in str(w.message)]) == 1
        assert len(ids) == 10
        seen += ids
    assert sorted(seen) == list(range(1, 31))


# ---------------------------------------------------------------- manifests with a name that is not UTF-8


@pytest.fixture
def odd_name_db(tmp_path: Path) -> tuple[Path, bytes]:
    root = tmp_path / "odd"
    for i in range(120):  # more rows than polars and pandas look at to type a column
        make_png(root / "a" / f"{i:03d}.png", (4, 4), (i, 0, 0))
    (root / "z").mkdir()
    raw = b"z/bad-\xff\xfe.png"
    with open(os.fsencode(root) + b"/" + raw, "wb") as f:
        Image.new("RGB", (5, 5)).save(f, "PNG")
    db = where(tmp_path / "odd.db")
    scan(db, root)
    return db, raw


_DUCKDB = {"jsonl": "SELECT * FROM read_json(?)", "csv": "SELECT * FROM read_csv(?)"}


@pytest.mark.parametrize("fmt", ("jsonl", "csv"))
def test_manifests_read_in_pandas_polars_duckdb_with_a_non_utf8_name(
    odd_name_db: tuple[Path, bytes], tmp_path: Path, fmt: str
) -> None:
    import duckdb
    import pandas as pd
    import polars as pl

    db, raw = odd_name_db
    out = exported(db, tmp_path / fmt, format=fmt)
    name = str(out / listed_shards(load_index(out))[0]["file"])
    (out / listed_shards(load_index(out))[0]["file"]).read_bytes().decode("utf-8")  # valid UTF-8 throughout
    frames = {
        "pandas": pd.read_json(name, lines=True, dtype={"path_b64": str}) if fmt == "jsonl" else pd.read_csv(name, keep_default_na=False),
        "polars": (pl.read_ndjson(name) if fmt == "jsonl" else pl.read_csv(name)).to_pandas(),
        "duckdb": duckdb.execute(_DUCKDB[fmt], [name]).df(),
    }  # fmt: skip
    for client, frame in frames.items():
        assert len(frame) == 121, client
        odd = frame[frame["path"].str.startswith("z/")]
        assert list(odd["path"]) == ["z/bad-\\xff\\xfe.png"], client
        assert base64.b64decode(odd["path_b64"].iloc[0]) == raw, client
    assert {os.fsencode(r["path"]) for r in manifest_rows(out, Path(name).name)} >= {raw}
    assert verify_export(out).ok


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".jsonl", ".csv"]))
def test_damaged_manifests_raise_export_error(tmp_path: Path, data: bytes, suffix: str) -> None:
    path = tmp_path / f"x{suffix}"
    path.write_bytes(data)
    try:
        rows = list(manifest_rows(tmp_path, path.name))
    except ExportError:
        return
    assert all(isinstance(r, dict) and isinstance(r["path"], str) for r in rows)


# ---------------------------------------------------------------- a tree that moved: root=


def test_loaders_take_root_after_the_tree_moved(formats_db: Path, tmp_path: Path) -> None:
    manifest = exported(formats_db, tmp_path / "j", format="jsonl")
    packed = exported(formats_db, tmp_path / "w", format="wds", workers=1)
    os.rename(tmp_path / "tree", tmp_path / "moved")
    stale = ManifestDataset(manifest)
    with pytest.raises(FileNotFoundError):
        stale[0]
    dataset = ManifestDataset(manifest, root=tmp_path / "moved")
    assert len(dataset) == 30 and all(dataset[i][0].size[0] >= 10 for i in range(30))
    for _, _, meta in WdsDataset(packed, decode=False, with_metadata=True, root=tmp_path / "moved"):
        assert os.path.isfile(meta["file"])
    from dlindex import DlindexError

    with pytest.raises(DlindexError, match="not a folder"):
        ManifestDataset(manifest, root=tmp_path / "nowhere")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    version=st.sampled_from([1, 2, 3, "2", None, -1]),
    key=st.sampled_from(["shards", "dlindex_shards", "x"]),
    shards=_JSON | st.lists(st.fixed_dictionaries({"file": st.text(max_size=5)}), max_size=3),
    raw=st.none() | st.binary(max_size=60),
)
def test_a_damaged_index_raises_export_error(
    tmp_path: Path, version: Any, key: str, shards: Any, raw: bytes | None
) -> None:
    (tmp_path / "index.json").write_bytes(
        raw if raw is not None else json.dumps({"dlindex_export": version, key: shards}).encode()
    )
    try:
        index = load_index(tmp_path)
    except ExportError:
        return
    assert all(isinstance(s["file"], str) for s in listed_shards(index))


def test_cli_workers_option(formats_db: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dlindex.cli import app

    runner = CliRunner()
    args = ["export", str(tmp_path / "w"), "--format", "wds", "--workers", "3", "--json", "--db", str(formats_db)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["shards"] == 3 and load_index(tmp_path / "w")["options"]["workers"] == 3
    bad = runner.invoke(
        app, ["export", str(tmp_path / "x"), "--format", "wds", "--workers", "0", "--db", str(formats_db)]
    )
    assert bad.exit_code == 2
    reserved = runner.invoke(app, ["export", str(tmp_path / "y"), "--split", "all=1", "--db", str(formats_db)])
    assert reserved.exit_code == 1 and reserved.stderr.startswith("Error: ") and "reserved" in reserved.stderr
