"""The scan's single writer: rows in batched transactions, labels, roots and the scans table.

Each batch of results is committed in its own short transaction, so a kill at any moment
leaves whole rows, and the next scan skips what was written and probes the rest.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Mapping
from contextlib import suppress

from dlindex.catalog.backend import INTEGRITY_ERRORS, SQL_ERRORS, Connection
from dlindex.catalog.connection import Catalog
from dlindex.catalog.sqlite.migrations import path_hash
from dlindex.catalog.state import read_state
from dlindex.errors import DlindexError
from dlindex.pids import pid_alive
from dlindex.query.spec import LOADER_FAILURE
from dlindex.scan.diff import ToProbe
from dlindex.scan.probe import Probe

_COLUMNS = (
    "root_id", "file_path", "file_path_bytes", "label_id", "width", "height", "format", "mode", "bytes",
    "mtime_ns", "xxh3_128", "status", "error", "warning", "split", "pixel_limit", "orientation", "inode",
    "ctime_ns", "path_hash", "valid_from",
)  # fmt: skip
# valid_from given: the state of this transaction, read once per batch (catalog.state.READ), so
# the history trigger that fills it for other writers' inserts (history_schema) does nothing.
_INSERT = """INSERT INTO image_metadata (root_id, file_path, file_path_bytes, label_id, width, height,
        format, mode, bytes, mtime_ns, xxh3_128, status, error, warning, split, pixel_limit, orientation, inode,
        ctime_ns, path_hash, valid_from)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"""
_UPSERT = (
    _INSERT
    + """
    ON CONFLICT (root_id, file_path) DO UPDATE SET
        file_path_bytes = excluded.file_path_bytes, label_id = excluded.label_id, split = excluded.split,
        width = excluded.width, height = excluded.height, format = excluded.format,
        mode = excluded.mode, bytes = excluded.bytes, mtime_ns = excluded.mtime_ns,
        status = excluded.status, error = excluded.error, warning = excluded.warning,
        pixel_limit = excluded.pixel_limit, orientation = excluded.orientation,
        inode = excluded.inode, ctime_ns = excluded.ctime_ns,
        -- new content invalidates whatever was derived from the old one; a file the training
        -- loader failed to read (query.spec.LOADER_FAILURE) that reads well again loses that mark
        processed = CASE WHEN image_metadata.xxh3_128 IS excluded.xxh3_128
            THEN image_metadata.processed ELSE 0 END,
        processing_status = CASE WHEN image_metadata.xxh3_128 IS NOT excluded.xxh3_128 THEN NULL
            WHEN image_metadata.processing_status = 'failed'
                AND substr(image_metadata.error, 1, {loader_length}) = '{loader}'
                AND excluded.status = 'ok' THEN NULL
            ELSE image_metadata.processing_status END,
        xxh3_128 = excluded.xxh3_128,
        updated_at = CURRENT_TIMESTAMP"""
).format(loader=LOADER_FAILURE, loader_length=len(LOADER_FAILURE))  # a constant: the prefix, case and all
_MARK_MISSING = (
    "UPDATE image_metadata SET status = 'missing', updated_at = CURRENT_TIMESTAMP WHERE id = ? AND status != 'missing'"
)
# An unchanged row catalogued before schema 15: its identity, with no change to what it says.
_IDENTIFY = "UPDATE image_metadata SET inode = ?, ctime_ns = ? WHERE id = ?"
_RELABEL = "UPDATE image_metadata SET label_id = ?, split = ?, updated_at = CURRENT_TIMESTAMP WHERE id = ?"
_PRUNE = "DELETE FROM image_metadata WHERE root_id = ? AND status = 'missing'"
# Two statements per flush whatever the labels, not two per label: a server catalog pays a
# round trip per statement (docs/benchmarks.md, bench_postgres). New names get ids in name order.
_INSERT_LABELS = "INSERT OR IGNORE INTO labels (name) SELECT value FROM json_each(:names) ORDER BY key"
_LABEL_IDS = "SELECT name, id FROM labels WHERE name IN (SELECT value FROM json_each(:names))"
# The labels table holds only labels that some row has, so it *is* the catalog's class list
# (dlindex/catalog/classes.py) and reading that list costs nothing; see docs/design.md.
_DROP_UNUSED_LABELS = (
    "DELETE FROM labels WHERE id NOT IN (SELECT DISTINCT label_id FROM image_metadata WHERE label_id IS NOT NULL)"
)
_SET_PRESPLIT = "UPDATE roots SET presplit = ? WHERE id = ? AND presplit IS NOT ?"
_INSERT_ROOT = "INSERT OR IGNORE INTO roots (path, path_bytes) VALUES (?, ?)"
_ROOT_ID = "SELECT id FROM roots WHERE path = ?"
_START_SCAN = "INSERT INTO scans (root_id, options, pid) VALUES (?, ?, ?)"
_RUNNING_SCANS = "SELECT id, pid FROM scans WHERE state = 'running'"
_ABANDON_SCAN = "UPDATE scans SET state = 'interrupted' WHERE id = ? AND state = 'running'"
_FINISH_SCAN = """UPDATE scans SET state = :state, finished_at = CURRENT_TIMESTAMP, seen = :seen,
    new = :new, changed = :changed, unchanged = :unchanged, missing = :missing, corrupt = :corrupt,
    skipped = :skipped, errors = :errors, seconds = :seconds
    WHERE id = :scan_id"""

_FLUSH_ROWS = 2000
_FLUSH_SECONDS = 0.5


class BatchWriter:
    """The single writer: buffers results and commits them in short batched transactions."""

    def __init__(self, catalog: Catalog, root_id: int) -> None:
        self.catalog = catalog
        self.root_id = root_id
        self.rows: list[tuple[Probe, ToProbe]] = []
        self.missing: list[int] = []
        self.relabel: list[tuple[int, str | None, str | None]] = []  # (id, label name, split)
        self.identified: list[tuple[int, int, int]] = []  # (inode, ctime_ns, id)
        self._last_flush = time.monotonic()

    @staticmethod
    def _label_ids(conn: Connection, names: set[str | None]) -> dict[str | None, int | None]:
        """Label ids, inserting new names, in the transaction that writes the rows using them:
        another scan dropping unused labels can never remove one in between."""
        ids: dict[str | None, int | None] = {None: None}  # no class: directly under ROOT (or a split folder)
        named = sorted(n for n in names if n is not None)  # sorted: the same ids for the same tree
        if named:
            listed = json.dumps(named, ensure_ascii=False)
            conn.execute(_INSERT_LABELS, {"names": listed})
            ids.update((name, int(id_)) for name, id_ in conn.execute(_LABEL_IDS, {"names": listed}))
        return ids

    def maybe_flush(self) -> None:
        """Commit when enough rows wait, or they have waited long enough."""
        size = len(self.rows) + len(self.missing) + len(self.relabel) + len(self.identified)
        if size >= _FLUSH_ROWS or (size and time.monotonic() - self._last_flush > _FLUSH_SECONDS):
            self.flush()

    def flush(self) -> None:
        """Commit every buffered row, missing mark, relabel and identity (inode, ctime) in one transaction."""
        if self.rows or self.missing or self.relabel or self.identified:
            new: list[tuple[object, ...]] = []
            changed: list[tuple[object, ...]] = []
            with self.catalog.write_transaction() as conn:
                names = {item.label for _, item in self.rows} | {name for _, name, _ in self.relabel}
                label_id = self._label_ids(conn, names)
                state = read_state(conn).changes  # moved at the transaction's start: the state it makes
                for p, item in self.rows:
                    row = (
                        self.root_id, p.key, item.raw, label_id[item.label], p.width, p.height,
                        p.format, p.mode, p.bytes, p.mtime_ns, p.xxh3_128, p.kind, p.error, p.warning, item.split,
                        p.pixel_limit, p.orientation, p.inode, p.ctime_ns, path_hash(p.key), state,
                    )  # fmt: skip
                    (new if item.known_id is None else changed).append(row)
                relabels = [(label_id[name], split, row_id) for row_id, name, split in self.relabel]
                try:
                    # A plain INSERT costs two thirds of an upsert, and files the walk found
                    # no row for are new unless another scan of this root raced us here.
                    self.catalog.backend.bulk_insert(conn, "image_metadata", _COLUMNS, new, statement=_INSERT)
                except INTEGRITY_ERRORS:
                    conn.executemany(_UPSERT, new)  # same transaction: rows inserted so far are updated
                conn.executemany(_UPSERT, changed)
                conn.executemany(_MARK_MISSING, ((i,) for i in self.missing))
                conn.executemany(_RELABEL, relabels)
                conn.executemany(_IDENTIFY, self.identified)
            self.rows.clear()
            self.identified.clear()
            self.missing.clear()
            self.relabel.clear()
        self._last_flush = time.monotonic()


def register_root(catalog: Catalog, text: str, raw: bytes | None) -> int:
    """The root's id, adding its roots row on its first scan."""
    with catalog.write_transaction() as conn:
        conn.execute(_INSERT_ROOT, (text, raw))
        return int(conn.execute(_ROOT_ID, (text,)).fetchone()[0])


def known_root(catalog: Catalog, text: str) -> int | None:
    """The root's id if it has been scanned before, else None; a read (None where it fails:
    ``register_root`` then writes, after the catalog's check, and reports what is wrong)."""
    try:
        row = catalog.conn.execute(_ROOT_ID, (text,)).fetchone()
    except SQL_ERRORS:
        return None
    return None if row is None else int(row[0])


def start_scan(catalog: Catalog, root_id: int, options: Mapping[str, object]) -> int:
    """Add the scans row of a running scan, first closing those of scans killed without a word."""
    with catalog.write_transaction() as conn:
        for scan_id, pid in conn.execute(_RUNNING_SCANS).fetchall():
            if not pid_alive(pid):
                conn.execute(_ABANDON_SCAN, (scan_id,))  # killed without a chance to say so
        cursor = conn.execute(_START_SCAN, (root_id, json.dumps(options), os.getpid()))
        return int(cursor.lastrowid or 0)


def abandon_scan(catalog: Catalog, scan_id: int) -> None:
    """Best effort after a failure: the scans row must not stay 'running'.

    If even this write fails, the next scan sees the dead pid and does it.
    """
    with suppress(DlindexError, sqlite3.Error), catalog.write_transaction(bookkeeping=True) as conn:
        conn.execute(_ABANDON_SCAN, (scan_id,))


def finish_scan(catalog: Catalog, summary: Mapping[str, object]) -> None:
    """Record a scan's totals in its scans row; ``summary`` is ``ScanSummary.as_dict()``."""
    state = "interrupted" if summary["interrupted"] else "completed"
    with catalog.write_transaction() as conn:
        conn.execute(_FINISH_SCAN, {**summary, "state": state})


def set_presplit(catalog: Catalog, root_id: int, presplit: bool) -> None:
    """Record whether the root's top folders are split folders (train/, val/...)."""
    # `export` reads this to decide, without reading every row, whether to keep tree splits.
    with catalog.write_transaction() as conn:
        conn.execute(_SET_PRESPLIT, (int(presplit), root_id, int(presplit)))


def drop_unused_labels(catalog: Catalog) -> None:
    """Keep the labels table the class list: drop labels no row has any more."""
    with catalog.write_transaction() as conn:
        conn.execute(_DROP_UNUSED_LABELS)


def prune_missing(catalog: Catalog, root_id: int) -> int:
    """Delete the root's rows of files gone missing (``--prune``); how many."""
    with catalog.write_transaction() as conn:
        return conn.execute(_PRUNE, (root_id,)).rowcount
