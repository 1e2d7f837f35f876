"""The lint, format and strict type checks of pyproject.toml, as part of the test suite.

They run here so that the README's test command (and so CI) fails on a regression. Each
tool is the pinned one from the ``test`` extra; a machine without it skips, never passes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _tool(name: str) -> list[str]:
    beside = Path(sys.executable).with_name(name)
    if beside.exists():
        return [str(beside)]
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return [found]


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff_check_is_clean() -> None:
    proc = _run([*_tool("ruff"), "check", "--no-cache", "dlindex", "tests", "bench"])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_is_clean() -> None:
    proc = _run([*_tool("ruff"), "format", "--check", "--no-cache", "dlindex", "tests", "bench"])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict_is_clean(tmp_path: Path) -> None:
    proc = _run([*_tool("mypy"), "--cache-dir", str(tmp_path / "mypy-cache")])  # files and flags: pyproject.toml
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found" in proc.stdout
