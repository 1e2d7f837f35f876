"""Bad input for an export at size: SQLite's external sort (--shuffle) on a temp disk that
fills, and a --shuffle export killed with -9 while writing its shards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlindex.exported import ExportError
from dlindex.exported.verify import verify_export

from .conftest import REPO, export
from .synthetic import generated_catalog
from .test_faults_disk import namespace, one_error_line, run_on_tmpfs

__all__ = ["namespace"]  # the fixture, imported to be used here


@pytest.fixture(scope="module")
def sorted_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated catalog of 40,000 rows: its shuffled rows (~6 MB) outgrow SQLite's 2 MiB
    sorter, which then writes them to temporary files."""
    db = generated_catalog(tmp_path_factory.mktemp("sorted") / "c.db", chunk=10_000, rows=40_000)
    return db


def test_a_full_temp_disk_under_a_shuffled_export_is_one_line(
    namespace: None, sorted_catalog: Path, tmp_path: Path
) -> None:
    out = tmp_path / "exports"
    out.mkdir()
    result = run_on_tmpfs(tmp_path, f"""
fill
SQLITE_TMPDIR="$M" $DLX export '{out}/e' --db '{sorted_catalog}' --format jsonl --shuffle --split train=0.9,val=0.1 -q 2>"$OUT/err1"; echo rc1=$?
unfill
SQLITE_TMPDIR="$M" $DLX export '{out}/e' --db '{sorted_catalog}' --format jsonl --shuffle --split train=0.9,val=0.1 -q >/dev/null 2>"$OUT/err2"; echo rc2=$?
""", size="32m", env={"DLINDEX_NO_LOG": "1"})  # fmt: skip
    assert result["rc1"] == "4", result
    line = one_error_line(tmp_path / "err1", "disk full")
    assert "SQLITE_TMPDIR" in line or str(tmp_path / "mnt") in line, line
    assert result["rc2"] == "0", (tmp_path / "err2").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["e"]  # the failed one left nothing
    assert (out / "e" / "index.json").is_file()


def test_kill_9_while_writing_a_shuffled_export_leaves_nothing_that_looks_whole(
    sorted_catalog: Path, tmp_path: Path
) -> None:
    code = f"""
import os
from pathlib import Path
from dlindex import Catalog
from dlindex.export import export_catalog, ExportOptions
def progress(n, seen=[0]):
    seen[0] += n
    if seen[0] > 10_000:  # shards half written
        os.kill(os.getpid(), 9)
with Catalog({str(sorted_catalog)!r}) as c:
    export_catalog(c, Path('out'), ExportOptions(format='jsonl', shuffle=True, split='train=0.9,val=0.1',
                                                 shard_size=2000), progress=progress)
"""
    env = {**os.environ, "PYTHONPATH": str(REPO), "DLINDEX_NO_LOG": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, timeout=300)
    assert done.returncode == -9, done.stderr
    assert not (tmp_path / "out").exists()  # OUT_DIR appears only when the export is whole
    (left,) = tmp_path.iterdir()
    assert left.name.startswith(".out.") and left.name.endswith(".tmp")
    assert any(left.glob("*.jsonl")) and not (left / "index.json").exists()  # half written, no index
    for where in (tmp_path / "out", left):  # neither reads as an export: no index.json
        with pytest.raises(ExportError, match=r"index\.json|not an export|no export"):
            verify_export(where)
    summary = export(sorted_catalog, tmp_path / "out", shuffle=True, split="train=0.9,val=0.1", shard_size=2000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the leftover removed
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["counts"]["samples"] == summary.samples
