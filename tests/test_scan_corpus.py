"""Pillow's own test images (many malformed): one row each, agreement, a clean terminal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import CORPUS, CORPUS_EXPECTED, rows

pytestmark = pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpus is not present")


def _scan(db: Path, *extra: str) -> subprocess.CompletedProcess[bytes]:
    # A real process: libtiff writes to the C-level stderr, which CliRunner cannot see.
    return subprocess.run(
        [sys.executable, "-m", "dlindex", "scan", str(CORPUS), "--db", str(db), "--json", *extra],
        capture_output=True, timeout=300,
    )  # fmt: skip


def _expected() -> dict[str, dict[str, object]]:
    return json.loads(CORPUS_EXPECTED.read_text())


@pytest.mark.timeout(300)
def test_default_scan_has_one_row_per_file_and_a_clean_terminal(tmp_path: Path) -> None:
    done = _scan(tmp_path / "c.db")
    assert done.returncode == 0
    assert done.stderr == b"", done.stderr.decode(errors="replace")[:2000]
    summary = json.loads(done.stdout)
    expected = _expected()
    assert summary["seen"] == summary["new"] == len(expected)
    found = dict(rows(tmp_path / "c.db", "SELECT file_path, status FROM image_metadata"))
    assert set(found) == set(expected)
    # Header-only: a file Pillow decodes must never be called corrupt; one whose header
    # Pillow already refuses must be corrupt; truncation past a good header may pass.
    for name, exp in expected.items():
        if exp["status"] == "ok":
            assert found[name] == "ok", name
        elif exp.get("header") == "fails":
            assert found[name] == "corrupt", name


@pytest.mark.timeout(300)
def test_verify_scan_agrees_with_pillow_full_decode(tmp_path: Path) -> None:
    done = _scan(tmp_path / "v.db", "--verify")
    assert done.returncode == 0
    assert done.stderr == b"", done.stderr.decode(errors="replace")[:2000]
    expected = _expected()
    found = dict(rows(tmp_path / "v.db", "SELECT file_path, status FROM image_metadata"))
    disagreements = {n: (e["status"], found[n]) for n, e in expected.items() if e["status"] != found[n]}
    assert disagreements == {}
    headers = rows(
        tmp_path / "v.db", "SELECT file_path, format, width, height, mode FROM image_metadata WHERE status = 'ok'"
    )
    for name, fmt, width, height, mode in headers:
        exp = expected[str(name)]
        assert (fmt, width, height, mode) == (exp["format"], exp["width"], exp["height"], exp["mode"]), name


@pytest.mark.timeout(300)
def test_libtiff_warnings_land_in_the_record(tmp_path: Path) -> None:
    _scan(tmp_path / "w.db", "--verify")
    warnings = dict(rows(tmp_path / "w.db", "SELECT file_path, warning FROM image_metadata WHERE warning IS NOT NULL"))
    assert any("TIFF" in str(w) or "tiff" in str(w) for w in warnings.values())
