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


# A Parquet file the fuzzing above found (seed + a few edits): asking pyarrow 26 for its first
# row group's first column chunk throws through a C++ noexcept frame ("Definition level
# histogram size mismatch"), which aborts the process. Imported in a child: never an abort.
_KILLS_PYARROW = (
    "UEFSMRUEFYABFVhMFRAVABIAAEAEAQAJAQACCQcEAAMNCAAEDQgABQ0IAAYNCDwHAAAAAAAAAAgAAAAAAAAAFQAVFhUaLBUQFRAV"
    "BhUGHBjqCAAAAAAAAAAYCAEAAAAAAAAAFgAoCAgAAAAAAAAAGAgBAAAAAAAAABERAAAACygCAAAAEAEDA4jG+hUEFcABFcYBTBUw"
    "FQASAABg8F8AAAAAJUkSPiVJkj63bds+JUkSP27bNj+3bVs/AACAPyVJkj9JkqQ/btu2P5IkyT+3bds/27btPwAAAECSJAlAJUkS"
    "QLdtG0BJkiRA27YtQG7bNkAAAEBAkiRJQCVJUkAVABU+FUIsFTAVEBUGFQYcGAQlSVJAGAQAAACAFgAoBCVJUkAYBAAAAIAREQAA"
    "AB94BAAAAAe2bdsCAAAAMAMFByCIQYo5KKnFmnswykmrvRUEGVw1ABgGc2NoZW1hFQQAFQQlYRgCaWQANQIYBnZlY3RvchUCFQZM"
    "PAAAADUEGARsaXN0FQIAFQglAhgHZWxlbWVudAAWEBkcGSwmABwVBBk1AAYQGRgCaWQVAhYQFrICFo4CJn4mCBwYCAgAAAAAAAAA"
    "GAgBAAAAAAAAABYAKAgIAAAAAAAAABgIAQAAAAAAAAAREQAZLBUEFQAVAgAVABUQFQIAPCkGGSYAEAAAACYAHBUIGTUABhAZOAZ2"
    "ZWN0b3IEbGlzdAdlbGVtZW50FQIWMBb8AhaGAyb8AyaWAhwYBCVJUkAYBAAAAIAWACgEJUlSQBgEAAAAgBERABksFQQVABUCABUA"
    "FRAVAgA8KSYQIBlGAAAAMAAAABauBRYQJggWlAUAGRwYDEFSUk9XOnNjaGVtYRi4Ai8vLy8vK0FBQUFBUUFBQUFBQUFLQUF3QUJn"
    "QUZBQWdBQ2dBQUFBQUJCQUFNQUFBQUNBQUlBQUFBQkFBSUFBQUFCQUFBQUFJQUFBQjRBQUFBQkFBQUFLRC8vLzhBQUFFTUZBQUFB"
    "Q0FBQUFBRUFBQUFBUUFBQUJnQUFBQUdBQUFBZG1WamRHOXlBQUFFQUFRQUJBQUFBTkQvLy84QUFBRURFQUFBQUJ3QUFBQUVBQUFB"
    "QUFBQUFBUUFBQUJwZEdWdEFBQUdBQWdBQmdBR0FBQUFBQUFCQUJBQUZBQUlBQVlBQndBTUFBQUFFQUFRQUFBQUFBQUJBaEFBQUFB"
    "Y0FBQUFCQUFBQUFBQUFBQUNBQUFBYVdRQUFBZ0FEQUFJQUFjQUNBQUFBQUFBQUFGQUFBQUFBQUFBQUE9PQAYIHBhcnF1ZXQtY3Bw"
    "LWFycm93IHZlcnNpb24gMjYuMC4xGSwcAAAcAAAAnwIAAFBBUjE="
)


def test_a_parquet_footer_that_kills_pyarrow_is_one_error_line(tmp_path: Path) -> None:
    import base64

    pytest.importorskip("pyarrow")
    db = balanced(tmp_path / "c.db", {"cat": 4, "dog": 4})
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(base64.b64decode("".join(_KILLS_PYARROW)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "dlindex", "features", "import", "-t", "v", str(bad), "--db", str(db)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr[-2000:]
    if done.returncode == 1:
        assert done.stderr.startswith("Error: ") and done.stderr.count("\n") == 1, done.stderr
