"""Fuzzing `dlindex features import` under an address-space limit (see import_fuzz.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .synthetic import balanced

pytest.importorskip("hypothesis")
REPO = Path(__file__).resolve().parents[1]
ADDRESS_SPACE = 3 << 30  # numpy + pyarrow + dlindex map ~1.6 GiB before reading anything


def test_fuzz_import_files_under_a_memory_limit(tmp_path: Path) -> None:
    db = balanced(tmp_path / "c.db", {"cat": 4, "dog": 4})  # ids 1..8
    work = tmp_path / "files"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.import_fuzz", str(work), str(db), "200", str(ADDRESS_SPACE)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0 and "fuzzed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-6000:]
