"""Catalogs written straight into the database (behind dlindex's back), for query and mark tests that
need no image files; on the backend of the run (tests/backends.py)."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dlindex import Catalog
from dlindex.catalog.sqlite.migrations import path_hash

from .backends import Location, is_server, raw, where

ROOT = "/data/train"


@dataclass(frozen=True)
class Row:
    label: str
    status: str = "ok"
    processed: int = 0
    processing_status: str | None = None
    width: int = 32
    height: int = 32
    age_hours: float = 100.0  # created this long ago


def stamp(hours_ago: float) -> str:
    moment = datetime.now(UTC) - timedelta(hours=hours_ago)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def present_root(folder: Path, rows: list[Row]) -> str:
    """A real root for ``make_catalog(..., root=...)``: an empty file at each row's path, so that
    check, stats and manifest exports find the tree there (they look for a few of its files)."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.label] = counts.get(r.label, 0) + 1
        (folder / r.label).mkdir(parents=True, exist_ok=True)
        (folder / r.label / f"{counts[r.label]:04d}.png").touch()
    return str(folder)


def make_catalog(path: Path, rows: list[Row], root: str = ROOT) -> Location:
    """A catalog whose image rows have ids 1..len(rows), in order, under one root; its location.
    Rows carry the path_hash a scan gives them, so seeded samples rank them as a scan's."""
    location = where(path, migrated=True)
    if not is_server(location):  # a server database comes with its (empty) catalog
        Catalog(location, create=True).close()
    with raw(location) as conn:
        conn.execute("INSERT INTO roots (id, path) VALUES (1, ?)", (root,))
        labels = sorted({r.label for r in rows})
        conn.executemany("INSERT INTO labels (name) VALUES (?)", [(name,) for name in labels])
        ids = dict(conn.execute("SELECT name, id FROM labels").fetchall())
        counts: dict[str, int] = {}
        values = []
        for i, r in enumerate(rows, start=1):
            counts[r.label] = counts.get(r.label, 0) + 1
            created = stamp(r.age_hours)
            key = f"{r.label}/{counts[r.label]:04d}.png"
            values.append((i, key, ids[r.label], r.width, r.height, r.status, r.processed, r.processing_status,
                           created, created, path_hash(key)))  # fmt: skip
        conn.executemany(
            "INSERT INTO image_metadata (id, root_id, file_path, label_id, width, height, format, "
            "mode, bytes, mtime_ns, xxh3_128, status, processed, processing_status, created_at, updated_at, path_hash) "
            "VALUES (?, 1, ?, ?, ?, ?, 'PNG', 'RGB', 100, 1, 'x', ?, ?, ?, ?, ?, ?)",
            values,
        )
        if is_server(location):
            conn.reset_ids()
    return location


def balanced(path: Path, labels: dict[str, int]) -> Location:
    """``labels`` maps a label to its number of plain ok, unprocessed rows."""
    return make_catalog(path, [Row(label) for label, n in labels.items() for _ in range(n)])


def generated_catalog(db: Path, *, chunk: int, **spec: Any) -> Path:
    """A catalog made by bench/make_catalog.py with ``CatalogSpec(**spec)`` (numpy needed: skips without it)."""
    pytest.importorskip("numpy")
    bench = str(Path(__file__).resolve().parents[1] / "bench")
    sys.path.insert(0, bench)
    try:
        make_catalog = importlib.import_module("make_catalog")
    finally:
        sys.path.remove(bench)
    make_catalog.make_sqlite(db, make_catalog.CatalogSpec(**spec), chunk=chunk)
    return db
