"""``scan``: walk a tree, diff it against the catalog, probe what changed, write in batches.

The main process plans the work and is the single writer; a pool of worker processes
walks units of the tree (diffing each against the catalog through a read-only
connection) and probes files (read, hash, sniff). Each batch of results is committed in
its own short transaction, so a kill at any moment leaves whole rows, and the next scan
skips what was written and probes the rest.
"""

from __future__ import annotations

import csv
import json
import os
import sqlite3
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dlindex.catalog.connection import Catalog
from dlindex.catalog.paths import display_name
from dlindex.errors import DlindexError, InputError, Interrupted
from dlindex.procs import pid_alive, sigterm_as_interrupt
from dlindex.scan import tasks as worker
from dlindex.scan.diff import DiffOptions, ToProbe, UnitDiff
from dlindex.scan.links import LinkedFiles
from dlindex.scan.listing import DEFAULT_EXTENSIONS, SKIP_REASONS, WalkOptions, WalkReport
from dlindex.scan.probe import Probe, ProbeOptions
from dlindex.scan.tasks import WorkerPool
from dlindex.scan.units import Unit, plan_units

_INSERT = """INSERT INTO image_metadata (root_id, file_path, file_path_bytes, label_id, width, height,
        format, mode, bytes, mtime_ns, xxh3_128, status, error, warning, split, pixel_limit)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"""
_UPSERT = (
    _INSERT
    + """
    ON CONFLICT (root_id, file_path) DO UPDATE SET
        file_path_bytes = excluded.file_path_bytes, label_id = excluded.label_id, split = excluded.split,
        width = excluded.width, height = excluded.height, format = excluded.format,
        mode = excluded.mode, bytes = excluded.bytes, mtime_ns = excluded.mtime_ns,
        status = excluded.status, error = excluded.error, warning = excluded.warning,
        pixel_limit = excluded.pixel_limit,
        -- new content invalidates whatever was derived from the old one
        processed = CASE WHEN image_metadata.xxh3_128 IS excluded.xxh3_128
            THEN image_metadata.processed ELSE 0 END,
        processing_status = CASE WHEN image_metadata.xxh3_128 IS excluded.xxh3_128
            THEN image_metadata.processing_status ELSE NULL END,
        xxh3_128 = excluded.xxh3_128,
        updated_at = CURRENT_TIMESTAMP"""
)
_MARK_MISSING = (
    "UPDATE image_metadata SET status = 'missing', updated_at = CURRENT_TIMESTAMP WHERE id = ? AND status != 'missing'"
)
_RELABEL = "UPDATE image_metadata SET label_id = ?, split = ?, updated_at = CURRENT_TIMESTAMP WHERE id = ?"
_PRUNE = "DELETE FROM image_metadata WHERE root_id = ? AND status = 'missing'"
_INSERT_LABEL = "INSERT OR IGNORE INTO labels (name) VALUES (?)"
_LABEL_ID = "SELECT id FROM labels WHERE name = ?"
# The labels table holds only labels that some row has, so it *is* the catalog's class list
# (dlindex/classes.py) and reading that list costs nothing; see docs/design.md.
_DROP_UNUSED_LABELS = (
    "DELETE FROM labels WHERE id NOT IN (SELECT DISTINCT label_id FROM image_metadata WHERE label_id IS NOT NULL)"
)
_SET_PRESPLIT = "UPDATE roots SET presplit = ? WHERE id = ? AND presplit IS NOT ?"
_INSERT_ROOT = "INSERT OR IGNORE INTO roots (path, path_bytes) VALUES (?, ?)"
_ROOT_ID = "SELECT id FROM roots WHERE path = ?"
_START_SCAN = "INSERT INTO scans (root_id, options, pid) VALUES (?, ?, ?)"
_RUNNING_SCANS = "SELECT id, pid FROM scans WHERE state = 'running'"
_ABANDON_SCAN = "UPDATE scans SET state = 'interrupted' WHERE id = ? AND state = 'running'"
_FINISH_SCAN = """UPDATE scans SET state = ?, finished_at = CURRENT_TIMESTAMP, seen = ?, new = ?,
    changed = ?, unchanged = ?, missing = ?, corrupt = ?, skipped = ?, errors = ?, seconds = ?
    WHERE id = ?"""

# Paths of a --labels file that name no image of this root (a typo, a file not scanned).
_UNKNOWN_LABEL_PATHS = (
    "SELECT listed.value FROM json_each(:paths) AS listed WHERE NOT EXISTS (SELECT 1 FROM image_metadata "
    "WHERE image_metadata.root_id = :root_id AND image_metadata.file_path = listed.value "
    "AND image_metadata.status != 'missing')"
)
_LABEL_EXAMPLES = 5

_FLUSH_ROWS = 2000
_FLUSH_SECONDS = 0.5
_QUEUED_PROBES = 8192  # walk no further ahead than this many files waiting to be probed


@dataclass(frozen=True)
class ScanOptions:
    extensions: tuple[str, ...] = DEFAULT_EXTENSIONS
    hidden: bool = False
    exclude: tuple[str, ...] = ()
    follow_symlinks: bool = True
    split_folders: bool = True  # ROOT/train/<class>/...: class under the split, split in its column
    labels_file: Path | None = None
    verify: bool = False
    max_pixels: int = ProbeOptions().max_pixels
    workers: int = 0  # 0: one per CPU
    io_threads: int = 16
    prune: bool = False
    force: bool = False


@dataclass(frozen=True)
class ScanSummary:
    """What one scan did; ``corrupt`` counts corrupt files among those probed in this run."""

    scan_id: int
    root: str
    seen: int
    new: int
    changed: int
    unchanged: int
    missing: int
    corrupt: int
    skipped: int  # entries that got no row in this scan, all reasons together
    errors: int
    relabeled: int
    pruned: int
    seconds: float
    files_per_s: float
    interrupted: bool = False
    error_samples: tuple[tuple[str, str], ...] = field(default=())
    skipped_by_reason: dict[str, int] = field(default_factory=dict)  # walk.SKIP_REASONS order
    unknown_label_paths: int = 0  # paths in the --labels file matching no image under the root
    unknown_label_examples: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["error_samples"] = [{"path": p, "error": e} for p, e in self.error_samples]
        data["unknown_label_examples"] = list(self.unknown_label_examples)
        return data


@dataclass
class _Counts:
    seen: int = 0
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    missing: int = 0
    corrupt: int = 0
    relabeled: int = 0


def scan_tree(
    catalog: Catalog,
    root: str | os.PathLike[str],
    options: ScanOptions = ScanOptions(),
    progress: Callable[[int], object] | None = None,
) -> ScanSummary:
    """Bring the catalog in line with the tree under ``root``; see docs/commands/scan.md.

    Args:
        progress: called with the number of files finished since the last call.
    """
    started = time.perf_counter()
    root_bytes = check_root(root)
    label_overrides = _read_labels_file(options.labels_file) if options.labels_file else None
    root_text, root_lossless = display_name(root_bytes)
    root_id = _register_root(catalog, root_text, None if root_lossless else root_bytes)
    scan_id = _start_scan(catalog, root_id, options)
    report = WalkReport()
    counts = _Counts()
    writer = _Writer(catalog, root_id)
    interrupted = False
    restore = sigterm_as_interrupt()
    try:
        pipeline = _Pipeline(catalog, root_bytes, root_id, options, label_overrides, report, counts, writer, progress)
        _set_presplit(catalog, root_id, pipeline.presplit)
        pipeline.run()
        writer.flush()
        if options.prune:
            writer.pruned = _prune(catalog, root_id)
        if writer.pruned or counts.relabeled:
            _drop_unused_labels(catalog)
    except KeyboardInterrupt:
        interrupted = True
    except BaseException:
        # A full disk, a lost lock, a bug: the scan row must not stay 'running'. Best effort:
        # if even this write fails, the next write sees the dead pid and does it.
        with suppress(DlindexError, sqlite3.Error), catalog.write_transaction(bookkeeping=True) as conn:
            conn.execute(_ABANDON_SCAN, (scan_id,))
        raise
    finally:
        restore()
    unknown_labels = (
        _unknown_label_paths(catalog, root_id, label_overrides) if label_overrides and not interrupted else []
    )
    seconds = time.perf_counter() - started
    summary = ScanSummary(
        scan_id=scan_id, root=root_text, seen=counts.seen, new=counts.new, changed=counts.changed,
        unchanged=counts.unchanged, missing=counts.missing, corrupt=counts.corrupt,
        skipped=report.skipped, errors=report.error_count, relabeled=counts.relabeled,
        pruned=writer.pruned, seconds=round(seconds, 3),
        files_per_s=round(counts.seen / seconds, 1) if seconds > 0 else 0.0,
        interrupted=interrupted, error_samples=tuple(report.errors[:20]),
        skipped_by_reason={r: report.skips[r] for r in SKIP_REASONS if report.skips.get(r)},
        unknown_label_paths=len(unknown_labels), unknown_label_examples=tuple(unknown_labels[:_LABEL_EXAMPLES]),
    )  # fmt: skip
    _finish_scan(catalog, summary)
    if interrupted:
        raise Interrupted(
            f"scan interrupted after {counts.new + counts.changed} files were written; "
            "the catalog is consistent, run the same scan again to finish"
        )
    return summary


class _Pipeline:
    """Feeds units to walk and batches to probe through one pool, bounded in flight."""

    def __init__(
        self,
        catalog: Catalog,
        root: bytes,
        root_id: int,
        options: ScanOptions,
        label_overrides: dict[str, str | None] | None,
        report: WalkReport,
        counts: _Counts,
        writer: _Writer,
        progress: Callable[[int], object] | None,
    ) -> None:
        self.root, self.root_id, self.report, self.counts = root, root_id, report, counts
        self.writer, self.progress = writer, progress or (lambda n: None)
        walk_options = WalkOptions(
            options.extensions, options.hidden, options.exclude, options.follow_symlinks, options.split_folders, root
        )
        self.diff_options = DiffOptions(walk_options, options.force, label_overrides, options.max_pixels)
        self.workers = max(1, options.workers or os.cpu_count() or 1)
        self.pool = WorkerPool(
            self.workers, ProbeOptions(options.verify, options.max_pixels, options.follow_symlinks),
            options.io_threads, os.fspath(catalog.path),
        )  # fmt: skip
        self.units: deque[Unit] = deque(plan_units(root, walk_options, report, self.workers))
        self.presplit = any(unit.presplit for unit in self.units)
        self.queued: deque[ToProbe] = deque()
        self.pending: dict[str, ToProbe] = {}
        self.diffs_in_flight = 0
        self.probes_in_flight = 0
        self.batches = 0
        self.linked = LinkedFiles()

    def run(self) -> None:
        try:
            while self.units or self.queued or self.pool.inflight:
                self._submit()
                for kind, result in self.pool.wait_any():
                    if kind == "diff":
                        self.diffs_in_flight -= 1
                        for diff in result:
                            self._on_diff(diff)
                    else:
                        self.probes_in_flight -= 1
                        self._on_probes(result)
                if self.linked and not self.units and not self.diffs_in_flight:
                    self._resolve_linked()  # every unit is walked: each file's first path is known
                self.writer.maybe_flush()
        except BaseException:
            self.pool.close(abort=True)
            raise
        self.pool.close()

    def _submit(self) -> None:
        while self.units and self.diffs_in_flight < 2 * self.workers and len(self.queued) < _QUEUED_PROBES:
            # Many small units (a folder per class) go several to a task: less overhead per task.
            group = max(1, min(8, len(self.units) // (16 * self.workers)))
            units = [self.units.popleft() for _ in range(min(group, len(self.units)))]
            self.pool.submit("diff", worker.diff_task, (self.root_id, units, self.diff_options))
            self.diffs_in_flight += 1
        walking = bool(self.units) or self.diffs_in_flight > 0
        while self.queued and self.probes_in_flight < 3 * self.workers:
            # Small first batches get every worker busy at once; later ones amortise overhead.
            size = 32 if self.batches < 2 * self.workers else 256
            if walking and len(self.queued) < size:
                break
            batch = [self.queued.popleft() for _ in range(min(size, len(self.queued)))]
            for item in batch:
                self.pending[item.key] = item
            self.pool.submit("probe", worker.probe_task, ([(item.path, item.key) for item in batch],))
            self.probes_in_flight += 1
            self.batches += 1

    def _on_diff(self, diff: UnitDiff) -> None:
        self.report.absorb(diff.report)
        counts = self.counts
        counts.seen += diff.seen
        counts.unchanged += diff.unchanged
        missing = [i for i, path in diff.missing if not any(path.startswith(u) for u in self.report.unlisted)]
        counts.missing += len(missing)
        counts.relabeled += len(diff.relabel)
        self.writer.missing.extend(missing)
        self.writer.relabel.extend(diff.relabel)
        linked = self.linked
        if diff.linked_unchanged or diff.linked_missing:
            linked.add_unchanged(diff.linked_unchanged, diff.linked_missing)
        to_probe, probed = diff.to_probe, diff.probed
        if any(item.ident for item in to_probe) or any(i.ident for _, i in probed):
            to_probe, probed = linked.hold(to_probe, probed)  # until every unit is walked
        self.queued.extend(to_probe)
        self.progress(diff.unchanged)
        if probed:
            self._record(probed)

    def _resolve_linked(self) -> None:
        kept = self.linked.resolve()
        self.queued.extend(kept.to_probe)
        if kept.probed:
            self._record(kept.probed)
        self.report.skip("duplicate", kept.duplicates)
        self.counts.seen -= kept.duplicates
        self.counts.unchanged -= kept.unchanged_duplicates
        self.counts.missing += len(kept.missing)
        self.writer.missing.extend(kept.missing)

    def _on_probes(self, results: list[tuple[object, ...]]) -> None:
        probes = [tuple.__new__(Probe, fields) for fields in results]  # see worker.probe_task
        self._record([(probe, self.pending.pop(probe.key)) for probe in probes])

    def _record(self, results: list[tuple[Probe, ToProbe]]) -> None:
        counts, writer = self.counts, self.writer
        for probe, item in results:
            if probe.kind == "skipped":
                counts.seen -= 1
                self.report.skip(probe.error or "device")  # became a FIFO, socket or device
            elif probe.kind == "error":
                self.report.error(probe.key, probe.error or "unreadable")
                gone = bool(probe.error and "No such file" in probe.error)
                self.report.skip("vanished" if gone else "unreadable")
                if item.known_id is not None and gone:
                    writer.missing.append(item.known_id)  # vanished between the walk and the read
                    counts.missing += 1
            else:
                if item.known_id is None:
                    counts.new += 1
                else:
                    counts.changed += 1
                if probe.kind == "corrupt":
                    counts.corrupt += 1
                writer.rows.append((probe, item))
        self.progress(len(results))


class _Writer:
    """The single writer: buffers results and commits them in short batched transactions."""

    def __init__(self, catalog: Catalog, root_id: int) -> None:
        self.catalog = catalog
        self.root_id = root_id
        self.rows: list[tuple[Probe, ToProbe]] = []
        self.missing: list[int] = []
        self.relabel: list[tuple[int, str | None, str | None]] = []  # (id, label name, split)
        self.pruned = 0
        self._last_flush = time.monotonic()

    @staticmethod
    def _label_ids(conn: sqlite3.Connection, names: set[str | None]) -> dict[str | None, int | None]:
        """Label ids, inserting new names, in the transaction that writes the rows using them:
        another scan dropping unused labels can never remove one in between."""
        ids: dict[str | None, int | None] = {None: None}  # no class: directly under ROOT (or a split folder)
        for name in sorted(n for n in names if n is not None):  # sorted: the same ids for the same tree
            conn.execute(_INSERT_LABEL, (name,))
            ids[name] = int(conn.execute(_LABEL_ID, (name,)).fetchone()[0])
        return ids

    def maybe_flush(self) -> None:
        size = len(self.rows) + len(self.missing) + len(self.relabel)
        if size >= _FLUSH_ROWS or (size and time.monotonic() - self._last_flush > _FLUSH_SECONDS):
            self.flush()

    def flush(self) -> None:
        if self.rows or self.missing or self.relabel:
            new: list[tuple[object, ...]] = []
            changed: list[tuple[object, ...]] = []
            with self.catalog.write_transaction() as conn:
                names = {item.label for _, item in self.rows} | {name for _, name, _ in self.relabel}
                label_id = self._label_ids(conn, names)
                for p, item in self.rows:
                    row = (
                        self.root_id, p.key, item.raw, label_id[item.label], p.width, p.height,
                        p.format, p.mode, p.bytes, p.mtime_ns, p.xxh3_128, p.kind, p.error, p.warning, item.split,
                        p.pixel_limit,
                    )  # fmt: skip
                    (new if item.known_id is None else changed).append(row)
                relabels = [(label_id[name], split, row_id) for row_id, name, split in self.relabel]
                try:
                    # A plain INSERT costs two thirds of an upsert, and files the walk found
                    # no row for are new unless another scan of this root raced us here.
                    conn.executemany(_INSERT, new)
                except sqlite3.IntegrityError:
                    conn.executemany(_UPSERT, new)  # same transaction: rows inserted so far are updated
                conn.executemany(_UPSERT, changed)
                conn.executemany(_MARK_MISSING, ((i,) for i in self.missing))
                conn.executemany(_RELABEL, relabels)
            self.rows.clear()
            self.missing.clear()
            self.relabel.clear()
        self._last_flush = time.monotonic()


def check_root(root: str | os.PathLike[str]) -> bytes:
    path = os.fsencode(root)
    if not os.path.exists(path):
        raise InputError(f"root {os.fsdecode(path)!r} does not exist")
    if not os.path.isdir(path):
        raise InputError(f"root {os.fsdecode(path)!r} is not a folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise InputError(f"root {os.fsdecode(path)!r} is not readable")
    return os.path.realpath(path)


def _read_labels_file(path: Path) -> dict[str, str | None]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or not {"path", "label"} <= set(reader.fieldnames):
                raise InputError(f"labels file {path} needs a header row with columns path,label")
            labels: dict[str, str | None] = {}
            for line, row in enumerate(reader, start=2):
                if not row["path"] or row["label"] is None:
                    raise InputError(f"labels file {path}, line {line}: empty path or label")
                labels[row["path"].lstrip("/")] = row["label"] or None  # an empty label: no class
            return labels
    except OSError as e:
        raise InputError(f"cannot read labels file {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"labels file {path} is not a UTF-8 CSV file: {e}") from None


def _unknown_label_paths(catalog: Catalog, root_id: int, overrides: dict[str, str | None]) -> list[str]:
    rows = catalog.conn.execute(_UNKNOWN_LABEL_PATHS, {"paths": json.dumps(list(overrides)), "root_id": root_id})
    return sorted(str(r[0]) for r in rows)


def _register_root(catalog: Catalog, text: str, raw: bytes | None) -> int:
    with catalog.write_transaction() as conn:
        conn.execute(_INSERT_ROOT, (text, raw))
        return int(conn.execute(_ROOT_ID, (text,)).fetchone()[0])


def _start_scan(catalog: Catalog, root_id: int, options: ScanOptions) -> int:
    recorded = {k: (os.fspath(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()}
    with catalog.write_transaction() as conn:
        for scan_id, pid in conn.execute(_RUNNING_SCANS).fetchall():
            if not pid_alive(pid):
                conn.execute(_ABANDON_SCAN, (scan_id,))  # killed without a chance to say so
        cursor = conn.execute(_START_SCAN, (root_id, json.dumps(recorded), os.getpid()))
        return int(cursor.lastrowid or 0)


def _finish_scan(catalog: Catalog, s: ScanSummary) -> None:
    state = "interrupted" if s.interrupted else "completed"
    values = (state, s.seen, s.new, s.changed, s.unchanged, s.missing, s.corrupt, s.skipped, s.errors, s.seconds)
    with catalog.write_transaction() as conn:
        conn.execute(_FINISH_SCAN, (*values, s.scan_id))


def _set_presplit(catalog: Catalog, root_id: int, presplit: bool) -> None:
    # `export` reads this to decide, without reading every row, whether to keep tree splits.
    with catalog.write_transaction() as conn:
        conn.execute(_SET_PRESPLIT, (int(presplit), root_id, int(presplit)))


def _drop_unused_labels(catalog: Catalog) -> None:
    with catalog.write_transaction() as conn:
        conn.execute(_DROP_UNUSED_LABELS)


def _prune(catalog: Catalog, root_id: int) -> int:
    with catalog.write_transaction() as conn:
        return conn.execute(_PRUNE, (root_id,)).rowcount
