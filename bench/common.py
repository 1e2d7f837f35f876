"""What every bench script shares: compiled sources, and writing its own section of the docs."""

from __future__ import annotations

import compileall
import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

HEADER = (
    "# Benchmarks\n\nFigures measured by the scripts in `bench/`. Each section is rewritten by the "
    "script named in it; edit outside the marked sections only.\n"
)


def write_section(path: Path, start: str, end: str, section: str) -> None:
    """Replace the text between ``start`` and ``end`` (markers included in ``section``), or append
    it; every other section stays as it is. Atomic: another bench script may read the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text() if path.exists() else HEADER
    if start in text and end in text:
        before, rest = text.split(start, 1)
        text = before + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def compile_sources() -> None:
    """Byte-compile dlindex/ as ``pip install`` does, so that timed runs of an editable checkout
    do not compile every module at start-up (PYTHONDONTWRITEBYTECODE, set on some machines,
    would otherwise make that happen on every run: ~60-100 ms each, measured)."""
    compileall.compile_dir(REPO / "dlindex", quiet=1)


def fill_path_hash(path: Path) -> None:
    """Give generated rows the path_hash a scan writes (dlindex.catalog.sqlite.migrations.path_hash), so
    seeded samples rank them as they rank a scanned tree's rows, not by the id fallback."""
    import sqlite3

    from dlindex.catalog.sqlite.migrations import path_hash

    conn = sqlite3.connect(path)
    try:
        conn.create_function("dlindex_path_hash", 1, path_hash, deterministic=True)
        with conn:
            conn.execute("UPDATE image_metadata SET path_hash = dlindex_path_hash(file_path)")
    finally:
        conn.close()
