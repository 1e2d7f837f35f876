"""`dlindex.export`: every format read back by its real client, plus the export's semantics."""

from __future__ import annotations

import glob
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from dlindex import Catalog, InputError, QuerySpec, ScanOptions, scan_tree
from dlindex.export import ExportError, load_index, manifest_rows, verify_export
from dlindex.exported.formats import NAMES
from dlindex.exported.index import INDEX_VERSION, listed_shards

from .backends import ON_BOTH_BACKENDS, on_postgresql, raw, where
from .conftest import export, make_jpeg, make_png, rows

pytestmark = ON_BOTH_BACKENDS

FORMATS = NAMES  # every registered format


def manifest_path(meta: dict[str, Any]) -> str:
    """A metadata object's exact path (``str`` with surrogate escapes), as dlindex's readers give it."""
    from dlindex.exported.reader import exact_path

    return exact_path(meta["path"], meta.get("path_b64"))


def catalogued(db: Path) -> dict[str, tuple[int, str, int, str]]:
    """file_path -> (id, label, bytes, xxh3_128) of the ok rows, read with the backend's own driver."""
    found = rows(
        db,
        "SELECT file_path, image_metadata.id, labels.name, bytes, xxh3_128 FROM image_metadata "
        "JOIN labels ON labels.id = label_id WHERE status = 'ok'",
    )
    return {r[0]: (r[1], r[2], r[3], r[4]) for r in found}  # type: ignore[misc]


def import_streaming() -> Any:
    """mosaicml-streaming as users import it (`from streaming import StreamingDataset`)."""
    pytest.importorskip("torch")
    return pytest.importorskip("streaming")


@pytest.fixture
def mixed_db(tmp_path: Path) -> Path:
    """20 images in three classes, PNG and JPEG, all distinct; plus one corrupt file."""
    root = tmp_path / "mixed"
    for i in range(20):
        label = ("cat", "dog", "eel")[i % 3]
        if i % 4 == 0:
            make_jpeg(root / label / f"{i:03d}.jpg", (20 + i, 12), (i * 10, 5, 7))
        else:
            make_png(root / label / f"{i:03d}.png", (10 + i, 10), (i * 12, 3, 9))
    (root / "cat" / "bad.png").write_bytes(b"\x89PNG broken")
    db = where(tmp_path / "mixed.db")
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    return db


# ---------------------------------------------------------------- each format, its real client


@pytest.mark.parametrize("fmt", ("jsonl", "csv", "parquet"))
def test_manifests_hold_every_ok_sample(mixed_db: Path, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / fmt
    summary = export(mixed_db, out, format=fmt)
    expected = catalogued(mixed_db)
    assert summary.samples == len(expected) == 20
    index = load_index(out)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(out / listed_shards(index)[0]["file"])
        got = table.to_pylist()
        assert table.column_names[:9] == [
            "id",
            "path",
            "label",
            "label_id",
            "width",
            "height",
            "format",
            "bytes",
            "xxh3_128",
        ]
    else:
        got = list(manifest_rows(out, listed_shards(index)[0]["file"]))
    assert {r["path"]: (r["id"], r["label"], r["bytes"], r["xxh3_128"]) for r in got} == expected
    assert index["labels"] == {"0": "cat", "1": "dog", "2": "eel"}
    assert all(index["labels"][str(r["label_id"])] == r["label"] for r in got)
    assert index["file_root"] == str(tmp_path / "mixed")
    assert verify_export(out).ok


def test_jsonl_lines_parse_with_plain_json(mixed_db: Path, tmp_path: Path) -> None:
    export(mixed_db, tmp_path / "o", format="jsonl")
    lines = (tmp_path / "o" / "train-000000.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == sorted(r[0] for r in catalogued(mixed_db).values())


def test_wds_reads_back_with_webdataset(mixed_db: Path, tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    export(mixed_db, tmp_path / "w", format="wds", shard_size=7, workers=1)
    urls = sorted(glob.glob(str(tmp_path / "w" / "*.tar")))
    assert len(urls) == 3
    samples = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    expected = catalogued(mixed_db)
    assert len(samples) == len(expected)
    for s in samples:
        meta = json.loads(s["json"])
        image = s.get("jpg", s.get("png"))
        ident, label, size, digest = expected[meta["path"]]
        assert (meta["id"], meta["label"], len(image), meta["xxh3_128"]) == (ident, label, size, digest)
        assert int(s["cls"]) == meta["label_id"]
        assert s["__key__"] == f"{ident:012d}"
    decoded = next(iter(wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("pil")))
    assert decoded.get("jpg", decoded.get("png")).size[0] >= 10


def test_wds_reads_back_with_hf_datasets(mixed_db: Path, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    export(mixed_db, tmp_path / "w", format="wds", split="train=0.75,val=0.25")
    files = {s: sorted(glob.glob(str(tmp_path / "w" / f"{s}-*.tar"))) for s in ("train", "val")}
    # Mixed PNG/JPEG: one image field per extension, so the features are given, not inferred.
    features = datasets.Features({
        "jpg": datasets.Image(), "png": datasets.Image(), "cls": datasets.Value("int64"),
        "json": {k: datasets.Value(t) for k, t in (("id", "int64"), ("path", "string"), ("label", "string"),
                 ("label_id", "int64"), ("width", "int64"), ("height", "int64"), ("format", "string"),
                 ("bytes", "int64"), ("xxh3_128", "string"))},
        "__key__": datasets.Value("string"), "__url__": datasets.Value("string"),
    })  # fmt: skip
    loaded = datasets.load_dataset("webdataset", data_files=files, features=features, cache_dir=str(tmp_path / "hf"))
    index = load_index(tmp_path / "w")
    assert {k: len(v) for k, v in loaded.items()} == {k: v["samples"] for k, v in index["counts"]["splits"].items()}
    expected = catalogued(mixed_db)
    for row in loaded["train"]:
        image = row["jpg"] or row["png"]
        assert expected[row["json"]["path"]][0] == row["json"]["id"]
        assert image.size == (row["json"]["width"], row["json"]["height"])
        assert index["labels"][str(row["cls"])] == row["json"]["label"]


def test_wds_single_format_loads_in_hf_without_features(scanned_db: Path, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    export(scanned_db, tmp_path / "w", format="wds")
    loaded = datasets.load_dataset(
        "webdataset", data_files=str(tmp_path / "w" / "train-*.tar"), cache_dir=str(tmp_path / "hf")
    )
    assert sorted(loaded["train"]["cls"]) == [0, 0, 0, 1, 1, 1]


def test_mds_reads_back_with_streaming(mixed_db: Path, tmp_path: Path) -> None:
    streaming = import_streaming()
    export(mixed_db, tmp_path / "m", format="mds", split="train=0.5,val=0.5", shard_size=4)
    index = load_index(tmp_path / "m")
    expected = catalogued(mixed_db)
    for split in ("train", "val"):
        dataset = streaming.StreamingDataset(local=str(tmp_path / "m"), split=split, shuffle=False, batch_size=1)
        got = [dataset[i] for i in range(len(dataset))]
        assert len(got) == index["counts"]["splits"][split]["samples"]
        for sample in got:
            ident, label, size, digest = expected[sample["json"]["path"]]
            assert (sample["id"], len(sample["image"]), sample["json"]["xxh3_128"]) == (ident, size, digest)
            assert index["labels"][str(sample["label"])] == label
            assert sample["ext"] in ("png", "jpg") and sample["key"] == f"{ident:012d}"
    assert verify_export(tmp_path / "m").ok


def test_dali_file_lists(mixed_db: Path, tmp_path: Path) -> None:
    export(mixed_db, tmp_path / "d", format="dali")
    index = load_index(tmp_path / "d")
    lines = (tmp_path / "d" / "train-000000.txt").read_bytes().splitlines()
    root = index["file_root"]
    expected = catalogued(mixed_db)
    assert len(lines) == len(expected)
    for line in lines:
        path, label = line.decode().rsplit(" ", 1)
        assert os.path.isfile(os.path.join(root, path))
        assert index["labels"][label] == expected[path][1]
    assert verify_export(tmp_path / "d").ok


# ---------------------------------------------------------------- semantics


def test_only_ok_samples_unless_asked(mixed_db: Path, tmp_path: Path) -> None:
    assert export(mixed_db, tmp_path / "a").samples == 20
    spec = QuerySpec(status=("ok", "corrupt"))
    assert export(mixed_db, tmp_path / "b", query=spec).samples == 21


def test_filters_and_per_label_come_from_query(mixed_db: Path, tmp_path: Path) -> None:
    summary = export(mixed_db, tmp_path / "o", query=QuerySpec(labels=("cat", "dog"), per_label=2, seed=3))
    assert summary.samples == 4
    index = load_index(tmp_path / "o")
    assert index["counts"]["splits"]["train"]["labels"] == {"cat": 2, "dog": 2}
    assert index["filters"]["labels"] == ["cat", "dog"] and index["filters"]["per_label"] == 2


@pytest.mark.parametrize("fmt", FORMATS)
def test_same_catalog_and_options_give_identical_bytes(
    mixed_db: Path, tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    options = dict(format=fmt, shuffle=True, seed=5, split="train=0.7,val=0.3", world_size=2, shard_size=3)
    export(mixed_db, tmp_path / "a", **options)
    export(mixed_db, tmp_path / "b", **options)
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert files_a == files_b
    for name in files_a:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert load_index(tmp_path / "a")["created_at"] == "2023-11-14T22:13:20Z"


def test_shuffle_depends_on_the_seed_only(mixed_db: Path, tmp_path: Path) -> None:
    def order(name: str, **kw: Any) -> list[int]:
        export(mixed_db, tmp_path / name, **kw)
        return [r["id"] for r in manifest_rows(tmp_path / name, "train-000000.jsonl")]

    plain = order("plain")
    assert plain == sorted(plain)
    one, again, other = (
        order("s1", shuffle=True, seed=1),
        order("s1b", shuffle=True, seed=1),
        order("s2", shuffle=True, seed=2),
    )
    assert one == again and sorted(one) == plain and one != plain and one != other


def test_splits_are_stable_as_the_catalog_grows(tmp_path: Path) -> None:
    root = tmp_path / "grow"
    for i in range(30):
        make_png(root / ("a" if i % 2 else "b") / f"{i:03d}.png", (8, 8), (i, i * 3 % 256, 1))
    db = where(tmp_path / "g.db")
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    export(db, tmp_path / "e1", split="train=0.8,val=0.2")
    for i in range(30, 60):
        make_png(root / "a" / f"{i:03d}.png", (8, 8), (i, i * 3 % 256, 2))
    with Catalog(db) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    export(db, tmp_path / "e2", split="train=0.8,val=0.2")

    def split_of(out: str) -> dict[int, str]:
        index = load_index(tmp_path / out)
        return {r["id"]: s["split"] for s in listed_shards(index) for r in manifest_rows(tmp_path / out, s["file"])}

    before, after = split_of("e1"), split_of("e2")
    assert len(after) == 60 and all(after[i] == s for i, s in before.items())
    assert 0 < sum(1 for s in after.values() if s == "val") < 30


@pytest.mark.parametrize("drop_last", (False, True))
def test_every_rank_gets_the_same_number_of_samples(mixed_db: Path, tmp_path: Path, drop_last: bool) -> None:
    summary = export(
        mixed_db, tmp_path / "r", format="wds", world_size=3, drop_last=drop_last, split="train=0.6,val=0.4"
    )
    index = load_index(tmp_path / "r")
    total = 0
    for split, counts in index["counts"]["splits"].items():
        ranks = counts["ranks"]
        assert len(ranks) == 3 and len(set(ranks)) == 1, (split, ranks)
        per_rank = {
            r: sum(s["samples"] for s in listed_shards(index) if s["split"] == split and s["rank"] == r)
            for r in range(3)
        }
        assert list(per_rank.values()) == ranks
        total += sum(ranks)
    assert total == summary.samples == 20 + summary.padded - summary.dropped
    assert (summary.dropped > 0) == drop_last and (summary.padded > 0) != drop_last
    keys = []
    for shard in listed_shards(index):
        with tarfile.open(tmp_path / "r" / shard["file"]) as tar:
            keys += [m.name.split(".")[0] for m in tar.getmembers() if m.name.endswith(".cls")]
    assert len(keys) == len(set(keys)) == summary.samples  # repeats get keys of their own


def test_shard_bytes_bounds_shard_sizes(mixed_db: Path, tmp_path: Path) -> None:
    export(mixed_db, tmp_path / "w", format="wds", shard_bytes="8KiB")
    shards = listed_shards(load_index(tmp_path / "w"))
    assert len(shards) > 2 and all(s["bytes"] <= 8192 + 1024 for s in shards)
    assert sum(s["samples"] for s in shards) == 20


def test_index_json_describes_the_export(mixed_db: Path, tmp_path: Path) -> None:
    export(mixed_db, tmp_path / "w", format="wds", shuffle=True, seed=9, split="train=0.5,val=0.5")
    index = load_index(tmp_path / "w")
    with Catalog(mixed_db) as catalog:
        changes = catalog.changes()
    assert index["format"] == "wds" and index["dlindex_export"] == INDEX_VERSION
    assert index["catalog"] == {"path": str(mixed_db), "changes": changes}
    assert index["options"]["seed"] == 9 and index["options"]["split"] == {"train": 0.5, "val": 0.5}
    for shard in listed_shards(index):
        path = tmp_path / "w" / shard["file"]
        assert path.stat().st_size == shard["bytes"]
        import xxhash

        assert xxhash.xxh3_128_hexdigest(path.read_bytes()) == shard["xxh3_128"]


def test_tar_members_are_safe_and_fixed(mixed_db: Path, tmp_path: Path) -> None:
    export(mixed_db, tmp_path / "w", format="wds")
    with tarfile.open(tmp_path / "w" / "train-000000.tar") as tar:
        members = tar.getmembers()
    assert members and all(m.isfile() for m in members)
    for m in members:
        assert not m.name.startswith("/") and ".." not in m.name and "/" not in m.name
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) == (0, 0, 0, "", "", 0o644)


# ---------------------------------------------------------------- verify


def test_verify_detects_a_modified_image(mixed_db: Path, tmp_path: Path) -> None:
    export(mixed_db, tmp_path / "o", format="jsonl")
    assert verify_export(tmp_path / "o").ok
    victim = tmp_path / "mixed" / "dog" / "001.png"
    make_png(victim, (11, 10), (1, 2, 3))
    result = verify_export(tmp_path / "o")
    assert not result.ok and result.problem_count == 1 and "dog/001.png" in result.problems[0]


def test_verify_detects_a_damaged_shard_and_a_missing_file(mixed_db: Path, tmp_path: Path) -> None:
    export(mixed_db, tmp_path / "w", format="wds", shard_size=10)
    shard = tmp_path / "w" / "train-000000.tar"
    data = bytearray(shard.read_bytes())
    data[1000] ^= 0xFF
    shard.write_bytes(bytes(data))
    (tmp_path / "w" / "train-000001.tar").unlink()
    result = verify_export(tmp_path / "w")
    assert result.problem_count == 2
    assert any("checksum" in p for p in result.problems) and any("missing" in p for p in result.problems)


def test_verify_refuses_a_folder_that_is_no_export(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="not a dlindex export"):
        verify_export(tmp_path)


# ---------------------------------------------------------------- bad input leaves nothing


def _leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name == name or p.name.startswith("." + name))


def test_a_changed_source_fails_the_export_and_leaves_nothing(mixed_db: Path, tmp_path: Path) -> None:
    # Same size, other bytes: found only while packing (a changed size is skipped: test_export_safety).
    source = tmp_path / "mixed" / "eel" / "002.png"
    data = bytearray(source.read_bytes())
    data[-1] ^= 0xFF
    source.write_bytes(bytes(data))
    with pytest.raises(ExportError, match="changed since it was catalogued"):
        export(mixed_db, tmp_path / "w", format="wds")
    assert _leftovers(tmp_path, "w") == []


def test_a_vanished_source_fails_the_export(mixed_db: Path, tmp_path: Path) -> None:
    (tmp_path / "mixed" / "eel" / "002.png").unlink()
    with pytest.raises(ExportError, match="is gone"):
        export(mixed_db, tmp_path / "m", format="mds")
    assert _leftovers(tmp_path, "m") == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"format": "zip"}, "unknown format"),
        ({"split": "train=0.5"}, "add up to 1"),
        ({"split": "train=0.5,train=0.5"}, "named twice"),
        ({"split": "../x=1"}, "letters, digits"),
        ({"split": "nonsense"}, "NAME=FRACTION"),
        ({"shard_bytes": "lots"}, "size"),
        ({"shard_size": 0}, "at least 1"),
        ({"world_size": 0}, "at least 1"),
        ({"query": QuerySpec(labels=("cta",))}, "did you mean 'cat'"),
        ({"query": QuerySpec(min_width=10_000)}, "no samples match"),
        ({"features": "clip"}, "no feature (cache|type 'clip')"),
    ],
)
def test_bad_options_raise_before_writing(
    mixed_db: Path, tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InputError, match=message):  # ExportError is an InputError
        export(mixed_db, tmp_path / "o", **options)
    assert _leftovers(tmp_path, "o") == []


def test_an_existing_export_is_kept_unless_overwrite(mixed_db: Path, tmp_path: Path) -> None:
    export(mixed_db, tmp_path / "o", format="jsonl")
    with pytest.raises(ExportError, match="not empty"):
        export(mixed_db, tmp_path / "o", format="csv")
    assert load_index(tmp_path / "o")["format"] == "jsonl"
    export(mixed_db, tmp_path / "o", format="csv", overwrite=True)
    assert load_index(tmp_path / "o")["format"] == "csv"
    assert _leftovers(tmp_path, "o") == ["o"]


# ---------------------------------------------------------------- hostile names


@pytest.fixture
def hostile_db(tmp_path: Path) -> Path:
    root = tmp_path / "hostile"
    names = ["a b.png", "-rf.png", "ünï.png", "\"q,'.png", "back\\slash.png", "dots..png", "x.tar.png"]
    (root / "we ird").mkdir(parents=True)
    for i, name in enumerate(names):
        Image.new("RGB", (9 + i, 9), (i * 20, 0, 0)).save(root / "we ird" / name, "PNG")
    raw = os.fsencode(root / "we ird") + b"/bad-\xff\xfe.png"
    with open(raw, "wb") as f:
        Image.new("RGB", (30, 9), (200, 0, 0)).save(f, "PNG")
    make_png(root / "ok" / "plain.png")
    db = where(tmp_path / "hostile.db")
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    assert rows(db, "SELECT count(*) FROM image_metadata WHERE status = 'ok'") == [(9,)]
    return db


@pytest.mark.parametrize("fmt", FORMATS)
def test_hostile_names_survive_every_format(hostile_db: Path, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / "o"
    export(hostile_db, out, format=fmt)
    result = verify_export(out)
    assert result.ok, result.problems
    index = load_index(out)
    if fmt == "mds":
        assert result.samples == 0  # mds shards are checked by size and hash only
    else:
        assert result.samples == 9  # every manifest path led back to the exact file; every wds sample read
    if fmt == "wds":
        names, metas = [], []
        for shard in listed_shards(index):
            with tarfile.open(out / shard["file"]) as tar:
                names += tar.getnames()
                for m in tar.getmembers():
                    if m.name.endswith(".json"):
                        metas.append(json.loads(tar.extractfile(m).read()))  # type: ignore[union-attr]
        assert len(names) == 27 and all(n.split(".")[0].isdigit() for n in names)
        paths = {os.fsencode(manifest_path(m)) for m in metas}
        assert b"we ird/bad-\xff\xfe.png" in paths
        assert os.fsencode(index["file_root"]) + b"/we ird/bad-\xff\xfe.png" in {
            os.fsencode(index["file_root"]) + b"/" + p for p in paths
        }
    if fmt == "dali":
        lines = (out / "train-000000.txt").read_bytes().splitlines()
        assert b"we ird/bad-\xff\xfe.png 1" in lines


def test_absolute_paths(hostile_db: Path, tmp_path: Path) -> None:
    export(hostile_db, tmp_path / "o", absolute_paths=True)
    index = load_index(tmp_path / "o")
    paths = [r["path"] for r in manifest_rows(tmp_path / "o", "train-000000.jsonl")]
    assert index["file_root"] == "/" and all(os.path.isabs(p) and os.path.isfile(p) for p in paths)


def test_several_roots_share_a_common_file_root(tmp_path: Path) -> None:
    db = where(tmp_path / "two.db")
    for name in ("one", "two"):
        make_png(tmp_path / "data" / name / "x" / "a.png", (5, 5), (len(name), 0, 0))
        with Catalog(db, create=True) as catalog:
            scan_tree(catalog, tmp_path / "data" / name, ScanOptions(workers=1))
    export(db, tmp_path / "o")
    index = load_index(tmp_path / "o")
    assert index["file_root"] == str(tmp_path / "data")
    assert sorted(r["path"] for r in manifest_rows(tmp_path / "o", "train-000000.jsonl")) == [
        "one/x/a.png",
        "two/x/a.png",
    ]
    assert verify_export(tmp_path / "o").ok


# ---------------------------------------------------------------- features


def _feature_cache(db: Path, dim: int = 4) -> dict[int, list[float]]:
    """Vectors of type 'tiny' written straight into the feature cache's tables."""
    import array

    vectors = {}
    with raw(db) as conn:
        conn.execute(
            "INSERT INTO feature_types (name, dim, dtype, extractor) VALUES ('tiny', ?, 'float32', 'test')", (dim,)
        )
        for (ident,) in conn.execute("SELECT id FROM image_metadata WHERE status = 'ok' ORDER BY id").fetchall():
            vectors[ident] = [ident + k / 4 for k in range(dim)]
            blob = array.array("f", vectors[ident]).tobytes()
            conn.execute(
                "INSERT INTO image_features (image_id, feature_type, vector) VALUES (?, 'tiny', ?)", (ident, blob)
            )
    return vectors


@pytest.mark.parametrize("fmt", FORMATS)
def test_features_go_with_their_samples(mixed_db: Path, tmp_path: Path, fmt: str) -> None:
    vectors = _feature_cache(mixed_db)
    export(mixed_db, tmp_path / "f", format=fmt, features="tiny")
    index = load_index(tmp_path / "f")
    assert index["features"] == {"name": "tiny", "dtype": "<f4", "dim": 4, "extractor_version": None}  # written by hand
    if fmt in ("jsonl", "csv", "parquet", "dali"):  # dali: in its jsonl companion
        name = next(s["file"] for s in listed_shards(index) if s["file"].endswith((".jsonl", ".csv", ".parquet")))
        if fmt == "parquet":
            import pyarrow.parquet as pq

            got = {r["id"]: r["feature"] for r in pq.read_table(tmp_path / "f" / name).to_pylist()}
        else:
            got = {r["id"]: r.get("feature") for r in manifest_rows(tmp_path / "f", name)}
        assert got == vectors
    elif fmt == "wds":
        np = pytest.importorskip("numpy")
        wds = pytest.importorskip("webdataset")
        seen = 0
        urls = [str(tmp_path / "f" / s["file"]) for s in listed_shards(index)]
        for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode():
            assert s["npy"].dtype == np.float32 and s["npy"].tolist() == vectors[s["json"]["id"]]
            seen += 1
        assert seen == len(vectors)
    else:
        streaming = import_streaming()
        dataset = streaming.StreamingDataset(local=str(tmp_path / "f"), split="train", shuffle=False, batch_size=1)
        assert {dataset[i]["id"]: dataset[i]["feature"].tolist() for i in range(len(dataset))} == vectors


def test_features_missing_for_some_samples(mixed_db: Path, tmp_path: Path) -> None:
    _feature_cache(mixed_db)
    with raw(mixed_db) as conn:
        conn.execute("DELETE FROM image_features WHERE image_id = (SELECT min(image_id) FROM image_features)")
    with pytest.raises(ExportError, match=r"1 sample.*no 'tiny' features"):
        export(mixed_db, tmp_path / "f", format="wds", features="tiny")
    assert _leftovers(tmp_path, "f") == []


def test_features_of_an_unknown_type(mixed_db: Path, tmp_path: Path) -> None:
    _feature_cache(mixed_db)
    with pytest.raises(ExportError, match=r"no feature type 'clip'.*tiny"):
        export(mixed_db, tmp_path / "f", features="clip")


def test_a_catalog_without_a_feature_cache(mixed_db: Path, tmp_path: Path) -> None:
    with raw(mixed_db) as conn:
        for table in ("image_features", "feature_failures", "feature_types"):
            conn.execute(
                f"DROP TABLE IF EXISTS {table} CASCADE" if on_postgresql() else f"DROP TABLE IF EXISTS {table}"
            )
    from dlindex.errors import DamagedCatalogError

    # Tables of its schema version gone: the catalog is damaged, and says so before any export.
    with pytest.raises(DamagedCatalogError, match="feature_types"):
        Catalog(mixed_db)


def test_a_big_jsonl_manifest_written_by_two_processes_is_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlindex.export import plan as export_plan

    from .synthetic import Row, make_catalog, present_root

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    big = [Row(("a", "b", "c")[i % 3], width=10 + i) for i in range(301)]
    db = make_catalog(tmp_path / "big.db", big, root=present_root(tmp_path / "tree", big))
    export(db, tmp_path / "one", shard_size=None)  # below HALVES_MIN_IDS: one process
    monkeypatch.setattr(export_plan, "HALVES_MIN_IDS", 0)
    with Catalog(db) as catalog:
        rows, _, upper = export_plan.select_halves(catalog, QuerySpec(), False, 0)
        assert upper is not None and "id > :split_id" in upper.sql
        list(rows)
    summary = export(db, tmp_path / "two")
    assert summary.samples == summary.selected == 301
    for name in ("train-000000.jsonl", "index.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    assert not [p for p in (tmp_path / "two").iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("split", [None, "train=0.5,val=0.5"])
def test_missing_count_spans_every_batch(
    mixed_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: str | None
) -> None:
    _feature_cache(mixed_db)
    monkeypatch.setattr("dlindex.export.writer._BATCH", 3)  # 20 samples: seven batches
    with raw(mixed_db) as conn:
        conn.execute("DELETE FROM image_features WHERE image_id % 2 = 0")  # half, in every batch
        (lacking,) = conn.execute("SELECT count(*) FROM image_metadata WHERE status = 'ok' AND id % 2 = 0").fetchone()
    assert lacking > 3
    kwargs = {"split": split} if split else {}
    with pytest.raises(ExportError) as raised:
        export(mixed_db, tmp_path / "f", format="jsonl", features="tiny", **kwargs)
    message = str(raised.value)
    if split is None:
        assert message.startswith(f"{lacking} sample(s) have no 'tiny' features (id ")
    else:
        assert " in split " in message and "have no 'tiny' features" in message
