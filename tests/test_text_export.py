"""`export --texts`: every export carries each sample's texts (`text`, `texts`; wds a `.txt`
member, mds a `text` column), read back by the real clients by their own recipes and by
dlindex's own readers and verify; where texts cannot go (dali's file lists, --at, --append,
Ray) one line says so and nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlindex.export import load_index, manifest_files, manifest_rows, verify_export

from .backends import ON_BOTH_BACKENDS, Location
from .conftest import captioned_catalog, invoke, one_error_line

pytestmark = ON_BOTH_BACKENDS

CAPTIONS = {
    "cat/0001.png": ['a red car, "quoted"', "line one\nline two"],
    "cat/0002.png": ["café ☕"],
    "dog/0001.png": ["a dog"],
}
EXPECTED = {**CAPTIONS, "cat/0003.png": [], "dog/0002.png": []}


@pytest.fixture
def db(tmp_path: Path, runner: CliRunner) -> Location:
    images = {name: ((8 + k, 8), (k, 40, 9)) for k, name in enumerate(EXPECTED)}
    return captioned_catalog(tmp_path, runner, images, CAPTIONS)


def exported(db: Location, out: Path, runner: CliRunner, fmt: str, *more: str) -> Path:
    done = invoke(runner, "export", str(out), "--format", fmt, "--texts", *more, "--db", str(db))
    assert done.exit_code == 0, done.output
    return out


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_manifests_carry_the_texts_to_every_client(db: Location, tmp_path: Path, runner: CliRunner, fmt: str) -> None:
    out = exported(db, tmp_path / "out", runner, fmt)
    files = sorted(str(p) for p in out.glob(f"*.{fmt}"))
    if fmt == "jsonl":
        import pandas as pd

        frame = pd.concat(pd.read_json(f, lines=True) for f in files)
        got = {p: list(t) for p, t in zip(frame["path"], frame["texts"], strict=True)}
    elif fmt == "csv":
        import pandas as pd

        frame = pd.concat(pd.read_csv(f, keep_default_na=False) for f in files)
        got = {p: json.loads(t) for p, t in zip(frame["path"], frame["texts"], strict=True)}
    else:
        import pyarrow.dataset as ds

        table = ds.dataset(str(out), format="parquet").to_table(columns=["path", "text", "texts"])
        got = dict(zip(table.column("path").to_pylist(), table.column("texts").to_pylist(), strict=True))
        firsts = dict(zip(table.column("path").to_pylist(), table.column("text").to_pylist(), strict=True))
        assert firsts == {i: (t[0] if t else None) for i, t in EXPECTED.items()}
    assert got == EXPECTED
    index = load_index(out)
    own = {
        r["path"]: (r["text"], r["texts"] or [])  # relative to the export's file_root
        for name in manifest_files(index) for r in manifest_rows(out, name)
    }  # fmt: skip
    assert own == {i: (t[0] if t else None, t) for i, t in EXPECTED.items()}
    assert verify_export(out).ok
    assert index["options"]["texts"] is True


def test_csv_from_arrow_is_the_per_row_csv(
    db: Location, tmp_path: Path, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlindex.export.manifest import CsvWriter

    took = []
    take_arrow = CsvWriter.take_arrow
    monkeypatch.setattr(
        CsvWriter, "take_arrow", lambda self, rows: took.append(rows.num_rows) or take_arrow(self, rows)
    )
    fast = exported(db, tmp_path / "arrow", runner, "csv")
    assert sum(took) == len(EXPECTED) or not str(db).endswith(".db")  # SQLite reads the rows as Arrow
    monkeypatch.setattr(CsvWriter, "arrow_ready", lambda self: False)
    slow = exported(db, tmp_path / "rows", runner, "csv")
    files = sorted(p.name for p in fast.glob("*.csv"))
    assert files and [(fast / f).read_bytes() for f in files] == [(slow / f).read_bytes() for f in files]


def test_hf_datasets_reads_the_caption_column(db: Location, tmp_path: Path, runner: CliRunner) -> None:
    datasets = pytest.importorskip("datasets")
    out = exported(db, tmp_path / "out", runner, "parquet")
    data = datasets.load_dataset("parquet", data_dir=str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert dict(zip(data["path"], data["texts"], strict=True)) == EXPECTED


def test_webdataset_hf_and_dlindex_read_the_txt_members(db: Location, tmp_path: Path, runner: CliRunner) -> None:
    wds = pytest.importorskip("webdataset")
    datasets = pytest.importorskip("datasets")
    out = exported(db, tmp_path / "w", runner, "wds", "--workers", "2")
    index = load_index(out)
    urls = [str(out / u) for u in index["wds"]["urls"]["train"]]
    # img2dataset's layout: the caption in {key}.txt (empty without one), every text in the .json
    got = {m["path"]: (txt, m["text"], m["texts"]) for txt, m in wds.WebDataset(urls, shardshuffle=False)
           .decode().to_tuple("txt", "json")}  # fmt: skip
    assert got == {p: (t[0] if t else "", t[0] if t else None, t) for p, t in EXPECTED.items()}
    features = datasets.Features.from_dict(index["wds"]["hf_features"])
    rows = datasets.load_dataset("webdataset", data_files={"train": urls}, features=features, split="train",
                                 cache_dir=str(tmp_path / "hf"))  # fmt: skip
    assert {r["json"]["path"]: (r["txt"], r["json"]["texts"]) for r in rows} == {
        p: (t[0] if t else "", t) for p, t in EXPECTED.items()
    }
    assert all(r["png"].size == (r["json"]["width"], r["json"]["height"]) for r in rows)  # .txt is no image
    from dlindex.loader import WdsDataset

    own = WdsDataset(out, "train", decode=True, with_metadata=True)
    assert {info["path"]: (image.size, info["texts"]) for image, _, info in own} == {
        p: ((8 + k, 8), t) for k, (p, t) in enumerate(EXPECTED.items())
    }
    assert verify_export(out).ok


def test_streaming_reads_the_text_column(db: Location, tmp_path: Path, runner: CliRunner) -> None:
    pytest.importorskip("torch")
    streaming = pytest.importorskip("streaming")
    out = exported(db, tmp_path / "m", runner, "mds")
    dataset = streaming.StreamingDataset(local=str(out), shuffle=False, batch_size=1)
    got = {(s := dataset[i])["json"]["path"]: (s["text"], s["json"]["texts"]) for i in range(len(dataset))}
    del dataset
    assert got == {p: (t[0] if t else "", t) for p, t in EXPECTED.items()}
    assert verify_export(out).ok


def test_parts_merge_into_an_export_with_texts(db: Location, tmp_path: Path, runner: CliRunner) -> None:
    for i in range(2):
        exported(db, tmp_path / f"p{i}", runner, "wds", "--part", f"{i}/2", "--world-size", "2")
    done = invoke(runner, "merge", str(tmp_path / "p0"), str(tmp_path / "p1"), "--into", str(tmp_path / "m"))
    assert done.exit_code == 0, done.output
    index = load_index(tmp_path / "m")
    assert index["options"]["texts"] is True and "txt" in index["wds"]["hf_features"]
    assert verify_export(tmp_path / "m").ok


def test_where_texts_cannot_go_it_says_so(db: Location, tmp_path: Path, runner: CliRunner) -> None:
    line = one_error_line(invoke(runner, "export", str(tmp_path / "d"), "--format", "dali", "--texts", "--db", str(db)))
    assert "dali file lists carry no texts" in line and not (tmp_path / "d").exists()
    out = exported(db, tmp_path / "out", runner, "jsonl")
    line = one_error_line(invoke(runner, "export", str(out), "--append", "--db", str(db)))
    assert "--texts" in line
