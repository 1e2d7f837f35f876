"""The format registry (dlindex.exported.formats): formats have one home, and every format it
lists writes an export that reads back as the record says."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from dlindex.export import load_index, manifest_files, manifest_rows, verify_export
from dlindex.exported import formats
from dlindex.exported.formats import FORMATS, NAMES

from .conftest import export, make_jpeg, rows, scan

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = Path("dlindex/exported/formats.py")
# Literals equal to a format name that are not about dlindex's formats: (module, literal) -> why.
ALLOWED = {
    ("dlindex/cli/_output.py", "jsonl"): "query/dups --format: output formats of rows, not exports",
    ("dlindex/cli/_output.py", "csv"): "query/dups --format: output formats of rows, not exports",
    ("dlindex/cli/dups.py", "jsonl"): "dups --format: an output format of rows, not an export",
    ("dlindex/cli/dups.py", "csv"): "dups --format: an output format of rows, not an export",
    ("dlindex/export/mds.py", "mds"): "streaming's own shard encoding name in each shard's config",
    ("dlindex/text/records.py", "csv"): "text import --format: a file of texts read in, not an export",
    ("dlindex/text/records.py", "jsonl"): "text import --format: a file of texts read in, not an export",
    ("dlindex/text/records.py", "parquet"): "text import --format: a file of texts read in, not an export",
}
BASE = {"dlindex.errors", "dlindex.faults", "dlindex._lazy", "dlindex.version", "dlindex.orientation"}
_HOOKS = ("writer", "needs", "names", "finish", "clients", "check_clients", "verify")


def test_format_names_live_in_the_registry() -> None:
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted((ROOT / "dlindex").rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative == REGISTRY:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in FORMATS:
                found.setdefault((relative.as_posix(), node.value), []).append(node.lineno)
    stray = {key: lines for key, lines in found.items() if key not in ALLOWED}
    assert not stray, (
        "a format named outside dlindex/exported/formats.py: ask the registry (a field of the "
        f"record, or WDS.name in code about that one format): {stray}"
    )
    assert set(ALLOWED) <= set(found), f"allowed literals no longer there: {set(ALLOWED) - set(found)}"


def test_the_registry_imports_nothing_of_dlindex() -> None:
    """It sits low on the read side: importing it loads no catalog, query, export or read-side
    module (at most the base layer's)."""
    code = (
        "import sys, dlindex; before = set(sys.modules); import dlindex.exported.formats; "
        "print(' '.join(sorted(m for m in set(sys.modules) - before if m.startswith('dlindex'))))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    loaded = set(out.split())
    assert {"dlindex.exported", "dlindex.exported.formats"} <= loaded
    assert loaded - {"dlindex.exported", "dlindex.exported.formats"} <= BASE, loaded


@pytest.mark.parametrize("name", NAMES)
def test_every_hook_resolves(name: str) -> None:
    record = FORMATS[name]
    assert record.name == name and record.suffixes and all(s.startswith(".") for s in record.suffixes)
    for hook in _HOOKS:
        ref = getattr(record, hook)
        if ref is not None:
            assert callable(formats.load(ref)), f"{name}.{hook} = {ref}"
    if record.reader is not None:
        assert isinstance(formats.load(record.reader), type)
    assert (record.clients is None) == (not record.client_keys)
    assert record.manifest is None or record.manifest in record.suffixes
    assert record.packed or record.manifest is not None, "a manifest format must name its rows' files"
    assert record.verified.format(files=1, samples=2)


def test_registry_tables() -> None:
    assert formats.DEFAULT in NAMES and formats.get(formats.DEFAULT) is FORMATS[formats.DEFAULT]
    assert formats.INDEX_NAMES[0] == "index.json"  # index_path looks for it first
    assert formats.listing(("a",)) == "a" and formats.listing(("a", "b", "c")) == "a, b and c"
    with pytest.raises(KeyError):
        formats.get("zip")


@pytest.fixture(scope="module")
def small_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 images in two classes, JPEG and PNG."""
    base = tmp_path_factory.mktemp("formats")
    for i in range(12):
        label = ("cat", "dog")[i % 2]
        if i % 3:
            make_jpeg(base / "tree" / label / f"{i:02d}.jpg", (10 + i, 9), (i * 11, 5, 6))
        else:
            path = base / "tree" / label / f"{i:02d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (8 + i, 7), (i * 13, 2, 3)).save(path)
    scan(base / "c.db", base / "tree")
    return base / "c.db"


def _read_back(record: formats.Format, out: Path) -> list[int]:
    """The sample ids dlindex's reader of the format gives back (each sample's bytes read)."""
    if record.reader is None:
        return []
    reader: Any = formats.load(record.reader)
    if record.packed:
        return [int(meta["id"]) for data, _, meta in reader(out, decode=False, with_metadata=True) if data]
    dataset = reader(out, decode=False)
    assert all(dataset[i][0] for i in range(len(dataset)))
    return [int(i) for i in dataset.ids]


@pytest.mark.parametrize("name", NAMES)
def test_every_format_round_trips(small_db: Path, tmp_path: Path, name: str) -> None:
    """Export, then read back as the record says: its index file, its shard suffixes, its
    manifests or ids.i64, its clients' keys, its reader; --verify finds nothing wrong."""
    record = FORMATS[name]
    out = tmp_path / "o"
    summary = export(small_db, out, format=name, split="train=0.5,val=0.5", shard_size=2, workers=1)
    assert (out / record.index).is_file() and verify_export(out).ok
    index = load_index(out)
    assert index["format"] == name and summary.format == name
    shards = index["dlindex_shards"]
    assert shards and all(s["file"].endswith(record.suffixes) for s in shards)
    assert all(key in index for key in record.client_keys)
    ids = sorted(int(i) for (i,) in rows(small_db, "SELECT id FROM image_metadata"))
    written: list[int] = []
    if record.manifest is not None:
        for file in manifest_files(index):
            written += [row["id"] for row in manifest_rows(out, file)]
    elif record.ids_file:
        written = [int(i) for i in np.fromfile(out / "ids.i64", dtype="<i8")]
    assert not written or sorted(set(written)) == ids  # every sample, --pad repeats aside
    read = _read_back(record, out)
    assert not read or sorted(set(read)) == ids
    if record.packed and record.reader is not None:  # the bytes travel in the shards: no source needed
        for file in (small_db.parent / "tree").rglob("*.*"):
            file.rename(file.with_suffix(file.suffix + ".gone"))
        try:
            assert sorted(set(_read_back(record, out))) == ids
        finally:
            for file in (small_db.parent / "tree").rglob("*.gone"):
                file.rename(file.with_suffix(""))
    assert written or read or record.reader is None  # a format dlindex reads back gave its samples
