"""``scan``: walk a tree, diff it against the catalog, probe what changed, write in batches.

One process walks and writes; a pool of worker processes only probes (read, hash, sniff).
Each batch of results is committed in its own short transaction, so a kill at any moment
leaves whole rows, and the next scan skips what was written and probes the rest.
"""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import signal
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from . import worker
from .catalog import Catalog
from .errors import DlindexError, InputError, Interrupted
from .probe import Probe, ProbeOptions
from .walk import DEFAULT_EXTENSIONS, WalkedFile, WalkOptions, WalkReport, display_name, walk_tree

_CATALOG_ROWS = (
    "SELECT file_path, id, bytes, mtime_ns, status, label_id FROM image_metadata "
    "WHERE root_id = ? ORDER BY file_path"
)
_HAS_ROWS = "SELECT 1 FROM image_metadata WHERE root_id = ? LIMIT 1"
_UPSERT = """INSERT INTO image_metadata (root_id, file_path, file_path_bytes, label_id, width, height,
        format, mode, bytes, mtime_ns, xxh3_128, status, error, warning)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (root_id, file_path) DO UPDATE SET
        file_path_bytes = excluded.file_path_bytes, label_id = excluded.label_id,
        width = excluded.width, height = excluded.height, format = excluded.format,
        mode = excluded.mode, bytes = excluded.bytes, mtime_ns = excluded.mtime_ns,
        status = excluded.status, error = excluded.error, warning = excluded.warning,
        -- new content invalidates whatever was derived from the old one
        processed = CASE WHEN image_metadata.xxh3_128 IS excluded.xxh3_128
            THEN image_metadata.processed ELSE 0 END,
        processing_status = CASE WHEN image_metadata.xxh3_128 IS excluded.xxh3_128
            THEN image_metadata.processing_status ELSE NULL END,
        xxh3_128 = excluded.xxh3_128,
        updated_at = CURRENT_TIMESTAMP"""
_MARK_MISSING = (
    "UPDATE image_metadata SET status = 'missing', updated_at = CURRENT_TIMESTAMP "
    "WHERE id = ? AND status != 'missing'"
)
_RELABEL = "UPDATE image_metadata SET label_id = ?, updated_at = CURRENT_TIMESTAMP WHERE id = ?"
_PRUNE = "DELETE FROM image_metadata WHERE root_id = ? AND status = 'missing'"
_INSERT_LABEL = "INSERT OR IGNORE INTO labels (name) VALUES (?)"
_LABEL_ID = "SELECT id FROM labels WHERE name = ?"
_INSERT_ROOT = "INSERT OR IGNORE INTO roots (path, path_bytes) VALUES (?, ?)"
_ROOT_ID = "SELECT id FROM roots WHERE path = ?"
_START_SCAN = "INSERT INTO scans (root_id, options, pid) VALUES (?, ?, ?)"
_RUNNING_SCANS = "SELECT id, pid FROM scans WHERE state = 'running'"
_ABANDON_SCAN = "UPDATE scans SET state = 'interrupted' WHERE id = ? AND state = 'running'"
_FINISH_SCAN = """UPDATE scans SET state = ?, finished_at = CURRENT_TIMESTAMP, seen = ?, new = ?,
    changed = ?, unchanged = ?, missing = ?, corrupt = ?, skipped = ?, errors = ?, seconds = ?
    WHERE id = ?"""

_FLUSH_ROWS = 2000
_FLUSH_SECONDS = 0.5


@dataclass(frozen=True)
class ScanOptions:
    extensions: tuple[str, ...] = DEFAULT_EXTENSIONS
    hidden: bool = False
    exclude: tuple[str, ...] = ()
    follow_symlinks: bool = False
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
    skipped: int
    errors: int
    relabeled: int
    pruned: int
    seconds: float
    files_per_s: float
    interrupted: bool = False
    error_samples: tuple[tuple[str, str], ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["error_samples"] = [{"path": p, "error": e} for p, e in self.error_samples]
        return data


class _Known(NamedTuple):
    file_path: str
    id: int
    bytes: int | None
    mtime_ns: int | None
    status: str
    label_id: int


class _Pending(NamedTuple):
    label: str
    raw: bytes | None
    known_id: int | None


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
    progress: Callable[[int], None] | None = None,
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
    restore = _raise_on_sigterm()
    try:
        _run(catalog, root_bytes, root_id, options, label_overrides, report, counts, writer, progress)
        writer.flush()
        if options.prune:
            writer.pruned = _prune(catalog, root_id)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        restore()
    seconds = time.perf_counter() - started
    summary = ScanSummary(
        scan_id=scan_id, root=root_text, seen=counts.seen, new=counts.new, changed=counts.changed,
        unchanged=counts.unchanged, missing=counts.missing, corrupt=counts.corrupt,
        skipped=report.skipped, errors=report.error_count, relabeled=counts.relabeled,
        pruned=writer.pruned, seconds=round(seconds, 3),
        files_per_s=round(counts.seen / seconds, 1) if seconds > 0 else 0.0,
        interrupted=interrupted, error_samples=tuple(report.errors[:20]),
    )  # fmt: skip
    _finish_scan(catalog, summary)
    if interrupted:
        raise Interrupted(
            f"scan interrupted after {counts.new + counts.changed} files were written; "
            "the catalog is consistent, run the same scan again to finish"
        )
    return summary


def _run(
    catalog: Catalog,
    root_bytes: bytes,
    root_id: int,
    options: ScanOptions,
    label_overrides: dict[str, str] | None,
    report: WalkReport,
    counts: _Counts,
    writer: _Writer,
    progress: Callable[[int], None] | None,
) -> None:
    walk_options = WalkOptions(options.extensions, options.hidden, options.exclude, options.follow_symlinks)
    rescan = catalog.conn.execute(_HAS_ROWS, (root_id,)).fetchone() is not None
    walked = walk_tree(root_bytes, walk_options, report, stat_files=rescan)
    probe_options = ProbeOptions(options.verify, options.max_pixels, options.follow_symlinks)
    pool = _ProbePool(options.workers or os.cpu_count() or 1, options.io_threads, probe_options)
    # A second connection reads the catalog as it was when the scan began, while the
    # first one writes: the merge never sees its own inserts.
    reader = sqlite3.connect(os.fspath(catalog.path), isolation_level=None, timeout=30)
    try:
        reader.execute("BEGIN")
        known_rows = (_Known(*row) for row in reader.execute(_CATALOG_ROWS, (root_id,)))
        batch: list[tuple[bytes, str]] = []
        pending: dict[str, _Pending] = {}

        def handle(results: Iterable[Probe]) -> None:
            done = 0
            for probe in results:
                _record(probe, pending.pop(probe.key), counts, report, writer)
                done += 1
            if progress is not None:
                progress(done)
            writer.maybe_flush()

        for item, known in _merge(walked, known_rows):
            if item is None:
                assert known is not None
                if known.status != "missing" and not _under(known.file_path, report.unlisted):
                    writer.missing.append(known.id)
                    counts.missing += 1
                continue
            counts.seen += 1
            label = label_overrides.get(item.key, item.label) if label_overrides else item.label
            if known is not None and not options.force and _unchanged(item, known):
                counts.unchanged += 1
                label_id = writer.label_id(label)
                if label_id != known.label_id:
                    writer.relabel.append((label_id, known.id))
                    counts.relabeled += 1
                if progress is not None:
                    progress(1)
                continue
            pending[item.key] = _Pending(label, item.raw, known.id if known else None)
            batch.append((item.path, item.key))
            if len(batch) >= pool.batch_size():
                handle(pool.submit(batch))
                batch = []
            writer.maybe_flush()
        if batch:
            handle(pool.submit(batch))
        handle(pool.drain())
    finally:
        reader.close()
        pool.close()


def _merge(
    walked: Iterator[WalkedFile], known_rows: Iterator[_Known]
) -> Iterator[tuple[WalkedFile | None, _Known | None]]:
    """Merge-join two streams sorted by path: (file, row), (file, None) or (None, row)."""
    known = next(known_rows, None)
    for item in walked:
        while known is not None and known.file_path < item.key:
            yield None, known
            known = next(known_rows, None)
        if known is not None and known.file_path == item.key:
            yield item, known
            known = next(known_rows, None)
        else:
            yield item, None
    while known is not None:
        yield None, known
        known = next(known_rows, None)


def _unchanged(item: WalkedFile, known: _Known) -> bool:
    st = item.stat
    return (
        st is not None
        and known.status != "missing"
        and st.st_size == known.bytes
        and st.st_mtime_ns == known.mtime_ns
    )


def _under(path: str, prefixes: list[str]) -> bool:
    return any(path.startswith(prefix) for prefix in prefixes)


def _record(probe: Probe, pending: _Pending, counts: _Counts, report: WalkReport, writer: _Writer) -> None:
    if probe.kind == "skipped":
        counts.seen -= 1
        report.skipped += 1
        return
    if probe.kind == "error":
        report.error(probe.key, probe.error or "unreadable")
        if pending.known_id is not None and probe.error and "No such file" in probe.error:
            writer.missing.append(pending.known_id)  # vanished between the walk and the read
            counts.missing += 1
        return
    if pending.known_id is None:
        counts.new += 1
    else:
        counts.changed += 1
    if probe.kind == "corrupt":
        counts.corrupt += 1
    writer.rows.append((probe, pending))


class _Writer:
    """The single writer: buffers results and commits them in short batched transactions."""

    def __init__(self, catalog: Catalog, root_id: int) -> None:
        self.catalog = catalog
        self.root_id = root_id
        self.rows: list[tuple[Probe, _Pending]] = []
        self.missing: list[int] = []
        self.relabel: list[tuple[int, int]] = []
        self.pruned = 0
        self._labels: dict[str, int] = dict(
            (name, id_) for id_, name in catalog.conn.execute("SELECT id, name FROM labels")
        )
        self._last_flush = time.monotonic()

    def label_id(self, name: str) -> int:
        label_id = self._labels.get(name)
        if label_id is None:
            with self.catalog.write_transaction() as conn:
                conn.execute(_INSERT_LABEL, (name,))
                label_id = int(conn.execute(_LABEL_ID, (name,)).fetchone()[0])
            self._labels[name] = label_id
        return label_id

    def maybe_flush(self) -> None:
        size = len(self.rows) + len(self.missing) + len(self.relabel)
        if size >= _FLUSH_ROWS or (size and time.monotonic() - self._last_flush > _FLUSH_SECONDS):
            self.flush()

    def flush(self) -> None:
        if self.rows or self.missing or self.relabel:
            upserts = [
                (
                    self.root_id, p.key, pending.raw, self.label_id(pending.label), p.width, p.height,
                    p.format, p.mode, p.bytes, p.mtime_ns, p.xxh3_128, p.kind, p.error, p.warning,
                )  # fmt: skip
                for p, pending in self.rows
            ]
            with self.catalog.write_transaction() as conn:
                conn.executemany(_UPSERT, upserts)
                conn.executemany(_MARK_MISSING, ((i,) for i in self.missing))
                conn.executemany(_RELABEL, self.relabel)
            self.rows.clear()
            self.missing.clear()
            self.relabel.clear()
        self._last_flush = time.monotonic()


class _ProbePool:
    """Worker processes that probe batches of files, with a bounded number in flight.

    A worker killed by a crashing decoder breaks the pool; the batches in flight are then
    retried one file at a time in a fresh pool, so only the culprit is marked corrupt.
    """

    def __init__(self, workers: int, io_threads: int, options: ProbeOptions) -> None:
        self.workers = max(1, workers)
        self.io_threads = io_threads
        self.options = options
        self.inflight: deque[tuple[Future[list[Probe]], list[tuple[bytes, str]]]] = deque()
        self.submitted = 0
        self.executor = self._new_executor()

    def _new_executor(self) -> ProcessPoolExecutor:
        # fork: workers start in milliseconds and inherit the imported modules.
        context = multiprocessing.get_context("fork") if os.name == "posix" else None
        return ProcessPoolExecutor(
            self.workers, mp_context=context, initializer=worker.init, initargs=(self.options, self.io_threads)
        )

    def batch_size(self) -> int:
        # Small first batches get every worker busy at once; later ones amortise overhead.
        return 32 if self.submitted < self.workers * 2 else 256

    def submit(self, batch: list[tuple[bytes, str]]) -> list[Probe]:
        self.inflight.append((self.executor.submit(worker.probe_batch, batch), batch))
        self.submitted += 1
        results: list[Probe] = []
        while len(self.inflight) > self.workers * 3:
            results.extend(self._collect_oldest())
        while self.inflight and self.inflight[0][0].done():
            results.extend(self._collect_oldest())
        return results

    def drain(self) -> list[Probe]:
        results: list[Probe] = []
        while self.inflight:
            results.extend(self._collect_oldest())
        return results

    def _collect_oldest(self) -> list[Probe]:
        future, batch = self.inflight.popleft()
        try:
            return future.result()
        except BrokenProcessPool:
            return self._recover([batch] + [b for _, b in self.inflight])

    def _recover(self, batches: list[list[tuple[bytes, str]]]) -> list[Probe]:
        self.inflight.clear()
        self.executor.shutdown(wait=False, cancel_futures=True)
        results = []
        for path, key in (item for batch in batches for item in batch):
            self.executor = self._new_executor()
            self._check_workers_start()
            try:
                results.extend(self.executor.submit(worker.probe_batch, [(path, key)]).result())
            except BrokenProcessPool:
                results.append(Probe(key, "corrupt", error="a decoder crashed the worker process on this file"))
                self.executor.shutdown(wait=False)
        self.executor = self._new_executor()
        return results

    def _check_workers_start(self) -> None:
        try:
            self.executor.submit(int).result()
        except BrokenProcessPool:
            raise DlindexError("probe worker processes die on start; try --workers 1") from None

    def close(self) -> None:
        processes = list((getattr(self.executor, "_processes", None) or {}).values())
        self.executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:  # idle workers, or busy ones after an interrupt
            process.terminate()


def check_root(root: str | os.PathLike[str]) -> bytes:
    path = os.fsencode(root)
    if not os.path.exists(path):
        raise InputError(f"root {os.fsdecode(path)!r} does not exist")
    if not os.path.isdir(path):
        raise InputError(f"root {os.fsdecode(path)!r} is not a folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise InputError(f"root {os.fsdecode(path)!r} is not readable")
    return os.path.realpath(path)


def _read_labels_file(path: Path) -> dict[str, str]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or not {"path", "label"} <= set(reader.fieldnames):
                raise InputError(f"labels file {path} needs a header row with columns path,label")
            labels = {}
            for line, row in enumerate(reader, start=2):
                if not row["path"] or row["label"] is None:
                    raise InputError(f"labels file {path}, line {line}: empty path or label")
                labels[row["path"].lstrip("/")] = row["label"]
            return labels
    except OSError as e:
        raise InputError(f"cannot read labels file {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"labels file {path} is not a UTF-8 CSV file: {e}") from None


def _register_root(catalog: Catalog, text: str, raw: bytes | None) -> int:
    with catalog.write_transaction() as conn:
        conn.execute(_INSERT_ROOT, (text, raw))
        return int(conn.execute(_ROOT_ID, (text,)).fetchone()[0])


def _start_scan(catalog: Catalog, root_id: int, options: ScanOptions) -> int:
    recorded = {k: (os.fspath(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()}
    with catalog.write_transaction() as conn:
        for scan_id, pid in conn.execute(_RUNNING_SCANS).fetchall():
            if not _alive(pid):
                conn.execute(_ABANDON_SCAN, (scan_id,))  # killed without a chance to say so
        cursor = conn.execute(_START_SCAN, (root_id, json.dumps(recorded), os.getpid()))
        return int(cursor.lastrowid or 0)


def _finish_scan(catalog: Catalog, s: ScanSummary) -> None:
    state = "interrupted" if s.interrupted else "completed"
    values = (state, s.seen, s.new, s.changed, s.unchanged, s.missing, s.corrupt, s.skipped, s.errors, s.seconds)
    with catalog.write_transaction() as conn:
        conn.execute(_FINISH_SCAN, (*values, s.scan_id))


def _prune(catalog: Catalog, root_id: int) -> int:
    with catalog.write_transaction() as conn:
        return conn.execute(_PRUNE, (root_id,)).rowcount


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _raise_on_sigterm() -> Callable[[], None]:
    """SIGTERM behaves like Ctrl-C: stop, keep what is committed, record the interruption."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, previous)
