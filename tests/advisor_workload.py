"""A small logged catalog for index-advice tests: 20,000 rows written by SQL, a workload run through dlindex."""

from __future__ import annotations

import random
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dlindex import Catalog
from dlindex.advisor import replay

ROWS, LABELS = 20_000, 200
LABEL_FILES = "SELECT file_path, label_id FROM image_metadata WHERE label_id = ? AND processed = 1"
FAILED = "SELECT id, file_path, error FROM image_metadata WHERE processing_status = 'failed' ORDER BY id"
RANDOM = "SELECT id, file_path FROM image_metadata ORDER BY random() LIMIT 8"
HOURLY = "SELECT id FROM image_metadata WHERE bytes > ? ORDER BY bytes DESC LIMIT 5"
MARK = "UPDATE image_metadata SET processed = 1 WHERE id = ?"
_GENERATE = """WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :rows),
h(i, a, b) AS (SELECT i, (i * 2654435761) % 4294967296, (i * 40503 + 12345) % 65536 FROM n)
INSERT INTO image_metadata (id, root_id, file_path, label_id, width, height, format, mode, bytes, mtime_ns,
    xxh3_128, status, processed, processing_status, created_at, updated_at)
SELECT i, 1, printf('class_%04d/%08d.jpg', 1 + ((i / 100) * 7919) % :labels, i), 1 + ((i / 100) * 7919) % :labels,
    64 + a % 961, 64 + (a / 961) % 961, 'JPEG', 'RGB', 20000 + a % 200000, i, printf('%016x', a),
    CASE WHEN b % 1000 < 10 THEN 'corrupt' ELSE 'ok' END, CASE WHEN b % 100 < 70 THEN 1 ELSE 0 END,
    CASE WHEN b % 100 < 70 THEN 'completed' WHEN b % 100 < 72 THEN 'failed' END,
    datetime('now', printf('-%d seconds', (:rows - i) * 130)), datetime('now', printf('-%d seconds', (:rows - i) * 130))
FROM h"""
_LABELS = """WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :labels)
INSERT INTO labels (id, name) SELECT i, printf('class_%04d', i) FROM n"""


def make_catalog(path: Path, planted: dict[str, str] | None = None) -> Path:
    """ROWS images in LABELS labels, ~70% processed, 2% failed; ``planted`` name -> columns indexes."""
    with Catalog(path, create=True, log=False) as catalog, catalog.write_transaction() as conn:
        conn.execute("INSERT INTO roots (id, path) VALUES (1, '/data/train')")
        conn.execute(_LABELS, {"labels": LABELS})
        conn.execute(_GENERATE, {"rows": ROWS, "labels": LABELS})
        for name, columns in (planted or {}).items():
            conn.execute(f"CREATE INDEX {name} ON image_metadata ({columns})")
    return path


def run_workload(path: Path, scale: int = 1) -> None:
    """Hot label and failed queries, rare ones, and processed-flag updates, logged by dlindex."""
    rng = random.Random(0)
    with Catalog(path) as catalog:
        for _ in range(300 * scale):
            list(catalog.read(LABEL_FILES, (rng.randint(1, LABELS),)))
        for _ in range(30 * scale):
            list(catalog.read(FAILED))
        for _ in range(4 * scale):
            list(catalog.read(RANDOM))
        list(catalog.read(HOURLY, (210_000,)))
        with catalog.write_transaction() as conn:
            conn.executemany(MARK, [(i,) for i in range(1, 200 * scale)])


# The logged ms per call of each statement, as a machine with nothing else to do logs them
# (measured under load they were about twice these, in the same proportions).
LOGGED_MS = {LABEL_FILES: 2.5, FAILED: 5.0, RANDOM: 6.0, HOURLY: 5.0, MARK: 0.01}
STEPS_PER_MS = 10_000  # a replay's time in tests that pin it: its VM steps at 10 million a second


def pin_logged_durations(path: Path) -> None:
    """The query log's durations set to ``LOGGED_MS``: which statements are hot (calls x logged ms)
    is then the same however loaded the machine was while the workload ran."""
    conn = sqlite3.connect(path)
    try:
        with conn:
            for sql, ms in LOGGED_MS.items():
                conn.execute("UPDATE query_log SET duration_ms = calls * ? WHERE sql = ? AND duration_ms IS NOT NULL",
                             (ms, sql))  # fmt: skip
    finally:
        conn.close()


@contextmanager
def steps_clock() -> Iterator[None]:
    """Replays (reads, the 10,000-row writes) take as long as their VM steps say, not the wall clock:
    every decision the advice still weighs by time comes out the same under any load."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(replay, "replay_ms", lambda _measured_ms, steps: steps / STEPS_PER_MS)
        yield


def copy_catalog(src: Path, dst: Path) -> Path:
    conn = sqlite3.connect(src)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    shutil.copyfile(src, dst)
    return dst


def snapshot(path: Path) -> tuple[object, ...]:
    """What index advice may never change without --apply: schema, rows, log."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return (
            conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall(),
            conn.execute("SELECT count(*), sum(processed), sum(id) FROM image_metadata").fetchone(),
            conn.execute("SELECT count(*) FROM labels").fetchone(),
            conn.execute("SELECT count(*) FROM query_log").fetchone(),
        )
    finally:
        conn.close()
