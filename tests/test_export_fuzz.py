"""Fuzzing every reader of an export: index.json, manifest rows (jsonl, csv, parquet), tar headers.

Property: the right result, or a DlindexError (one ``Error:`` line and exit 1 from the CLI);
never another exception, a hang, or memory a damaged header asks for (tracemalloc's peak
stays far below what the sizes in a hostile header would need).
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import tempfile
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dlindex import Catalog, DlindexError, ScanOptions, scan_tree
from dlindex.export import ExportOptions, export_catalog, load_index, verify_export
from dlindex.loader import ManifestDataset, WdsDataset, iter_tar

from .conftest import invoke, make_png, rewrite_export_file

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_PEAK = 16 << 20  # bytes; every export here is a few KiB


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("fuzz")
    for i in range(4):
        make_png(base / "images" / ("cat", "dog")[i % 2] / f"{i}.png", (8 + i, 8))
    with Catalog(base / "c.db", create=True) as catalog:
        scan_tree(catalog, base / "images", ScanOptions(workers=1))
        for fmt in ("jsonl", "csv", "parquet", "wds"):
            export_catalog(catalog, base / fmt, ExportOptions(format=fmt))
    return {fmt: base / fmt for fmt in ("jsonl", "csv", "parquet", "wds")}


@contextmanager
def copy_of(out: Path) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "e"
        shutil.copytree(out, target)
        yield target


@contextmanager
def bounded_memory() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
        assert peak < MAX_PEAK, f"peak {peak} bytes"
    finally:
        tracemalloc.stop()


def read_all(out: Path) -> None:
    """Everything a user does with an export; DlindexError is the only failure allowed."""
    try:
        dataset = ManifestDataset(out, decode=False)
    except DlindexError:
        return
    for i in range(len(dataset)):
        with suppress(DlindexError):
            dataset[i]


def check_cli_verify(out: Path) -> None:
    result = invoke(CliRunner(), "export", "--verify", str(out), "--json")
    assert result.exit_code in (0, 1), result.output
    if result.exit_code == 1:
        assert result.stderr.strip().splitlines()[-1].startswith("Error: "), result.stderr


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _mutate(data: bytes, draw: Any) -> bytes:
    kind = draw(st.sampled_from(["truncate", "append", "overwrite"]))
    at = draw(st.integers(0, len(data)))
    junk = draw(st.binary(min_size=1, max_size=16))
    if kind == "truncate":
        return data[:at]
    if kind == "append":
        return data + junk
    return data[:at] + junk + data[at + len(junk) :]


@FUZZ
@given(st.data())
def test_fuzz_index_json_bytes(exports: dict[str, Path], data: st.DataObject) -> None:
    with copy_of(exports["jsonl"]) as out:
        (out / "index.json").write_bytes(_mutate((out / "index.json").read_bytes(), data.draw))
        with bounded_memory():
            try:
                load_index(out)
                verify_export(out)
            except DlindexError:
                pass
        check_cli_verify(out)


@FUZZ
@given(st.lists(st.sampled_from(["format", "file_root", "labels", "options", "catalog", "dlindex_shards", "files",
                                 "dlindex_export", "counts"]), min_size=1, max_size=3), st.data())  # fmt: skip
def test_fuzz_index_json_values(exports: dict[str, Path], keys: list[str], data: st.DataObject) -> None:
    with copy_of(exports["jsonl"]) as out:
        index = json.loads((out / "index.json").read_text())
        for key in keys:
            target: Any = index
            shards = index.get("dlindex_shards")
            if (
                key == "dlindex_shards"
                and isinstance(shards, list)
                and shards
                and isinstance(shards[0], dict)
                and data.draw(st.booleans())
            ):
                target = shards[0]  # one field of one shard entry
                key = data.draw(st.sampled_from(["file", "split", "rank", "samples", "bytes", "xxh3_128"]))
            elif key == "options" and isinstance(index.get("options"), dict) and data.draw(st.booleans()):
                target = index["options"]
                key = data.draw(st.sampled_from(["world_size", "absolute_paths"]))
            target[key] = data.draw(json_values)
        (out / "index.json").write_text(json.dumps(index))
        with bounded_memory():
            read_all(out)
        check_cli_verify(out)


jsonl_rows = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {
                "id": st.integers(-(2**70), 2**70) | json_values,
                "path": st.sampled_from(["cat/0.png", "dog/1.png", "../x", "/etc/hostname", "", "a//b"]) | json_values,
                "label_id": st.integers(-3, 3) | json_values,
            },
            optional={"bytes": st.integers(-1, 2**70) | json_values, "xxh3_128": st.text(max_size=40) | json_values},
        ),
        json_values,
    ),
    max_size=6,
)


@FUZZ
@given(jsonl_rows, st.binary(max_size=8))
def test_fuzz_jsonl_rows(exports: dict[str, Path], rows: list[Any], tail: bytes) -> None:
    with copy_of(exports["jsonl"]) as out:
        text = "".join(json.dumps(r) + "\n" for r in rows).encode() + tail
        rewrite_export_file(out, "train-000000.jsonl", text)
        with bounded_memory():
            read_all(out)
        check_cli_verify(out)


@FUZZ
@given(st.lists(st.dictionaries(st.sampled_from(["id", "path", "label_id", "bytes", "width", "feature", "extra"]),
                                st.text(max_size=12), max_size=7), max_size=5), st.text(max_size=30))  # fmt: skip
def test_fuzz_csv_rows(exports: dict[str, Path], rows: list[dict[str, str]], raw: str) -> None:
    with copy_of(exports["csv"]) as out:
        name = "train-000000.csv"
        header = (out / name).read_text().splitlines()[0].split(",")
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=header, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow(row)
        rewrite_export_file(out, name, (buffer.getvalue() + raw).encode("utf-8", "surrogateescape"))
        with bounded_memory():
            read_all(out)
        check_cli_verify(out)


@settings(FUZZ, max_examples=40)  # pyarrow writes and reads are the slow part of the suite
@given(st.data())
def test_fuzz_parquet_rows(exports: dict[str, Path], data: st.DataObject) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    n = data.draw(st.integers(0, 4))
    columns = {}
    for key in ("id", "path", "label_id", "bytes", "path_bytes"):
        kind = data.draw(st.sampled_from(["int", "text", "float", "null", "binary", "missing"]))
        values = {
            "int": st.integers(-(2**63), 2**63 - 1), "text": st.text(max_size=10), "float": st.floats(),
            "null": st.none(), "binary": st.binary(max_size=10),
        }  # fmt: skip
        if kind != "missing":
            columns[key] = pa.array(
                [data.draw(values[kind]) for _ in range(n)], type=None if kind != "null" else pa.null()
            )
    with copy_of(exports["parquet"]) as out:
        name = "train-000000.parquet"
        if data.draw(st.booleans()):
            buffer = pa.BufferOutputStream()
            pq.write_table(pa.table(columns) if columns else pa.table({"x": pa.array([], pa.int64())}), buffer)
            raw = buffer.getvalue().to_pybytes()
        else:
            raw = _mutate((out / name).read_bytes(), data.draw)
        rewrite_export_file(out, name, raw)
        read_all(out)  # pyarrow allocates outside tracemalloc's sight; the file is a few KiB
        check_cli_verify(out)


@FUZZ
@given(st.data())
def test_fuzz_tar_headers(exports: dict[str, Path], data: st.DataObject) -> None:
    with copy_of(exports["wds"]) as out:
        name = "train-000000.tar"
        tar = bytearray((out / name).read_bytes())
        heads = [i for i in range(0, len(tar), 512) if tar[i + 257 : i + 262] == b"ustar"]
        for _ in range(data.draw(st.integers(1, 3))):
            at = data.draw(st.sampled_from(heads))
            field = data.draw(st.sampled_from([(0, 100), (124, 136), (156, 157), (345, 500), (100, 124)]))
            value = data.draw(st.binary(min_size=1, max_size=field[1] - field[0]))
            tar[at + field[0] : at + field[0] + len(value)] = value
            if data.draw(st.booleans()):  # a valid checksum, so the other checks are reached
                tar[at + 148 : at + 156] = b" " * 8
                tar[at + 148 : at + 156] = b"%06o\0 " % sum(tar[at : at + 512])
        if data.draw(st.booleans()):  # member contents too: .cls, .json
            at = data.draw(st.integers(0, len(tar) - 1))
            junk = data.draw(st.binary(min_size=1, max_size=8))
            tar[at : at + len(junk)] = junk
        if data.draw(st.booleans()):
            tar = tar[: data.draw(st.integers(0, len(tar)))]
        rewrite_export_file(out, name, bytes(tar))
        with bounded_memory():
            try:
                samples = list(iter_tar(out / name, max_bytes=len(tar)))
                assert all(isinstance(v, (bytes, str)) for s in samples for v in s.values())
            except DlindexError:
                pass
            with suppress(DlindexError):
                list(WdsDataset(out, decode=False, with_metadata=True))
        check_cli_verify(out)
