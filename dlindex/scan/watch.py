"""``dlindex scan ROOT --watch``: keep the catalog current while the tree changes.

Events are hints, the rescan is the truth. The watcher scans ROOT once, then waits for the file
system to say something changed under it (inotify and the like, through ``watchfiles``), and
answers each batch of events with an ordinary rescan of ROOT: the same incremental scan as
``dlindex scan`` (an unchanged folder costs a ``find`` line per file), then, where feature types
are automatic, ``features compute --queued``. So nothing depends on an event arriving: a lost or
overflowed event queue, a file system that sends none (NFS, a FUSE mount), or a change made
while a batch was being scanned is caught by the next rescan, and a rescan runs at least every
``interval_s`` whatever the events (the safety net). A flood of events is one batch.

The events are drained on a thread of their own as they come and only counted (``_Events``):
a flood holds at most one debounce window's paths. One watcher per catalog on a machine: a
second one is refused (a lock file under the user's cache folder, keyed by the catalog's
identity). Each batch is restart-safe, as every scan is: a watcher killed at any moment leaves
whole transactions, and the next run (or the next batch) finishes the work.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlindex.cache_dir import cache_dir
from dlindex.errors import InputError
from dlindex.scan.options import ScanOptions, ScanSummary, check_root

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.features.pipeline import ComputeSummary

_WAKE_S = 1.0  # the event thread wakes at least this often (its first wake: the library watches)
_READY_S = 10.0  # the longest wait for the library to watch, and for its thread to end


@dataclass(frozen=True)
class WatchOptions:
    """How to watch: rescan at least every ``interval_s``; gather events for ``debounce_ms``
    into one batch; ``events`` False: timed rescans only; ``compute``: the automatic feature
    types' queues after each batch."""

    interval_s: float = 300.0
    debounce_ms: int = 500
    events: bool = True
    compute: bool = True
    compute_workers: int = 0  # features compute's worker processes (0: one per CPU)


@dataclass(frozen=True)
class WatchBatch:
    """One rescan of the watcher: why it ran, what it found, what it computed."""

    number: int  # 0: the first scan
    reason: str  # "start", "catch-up" (the first after watching began), "events" or "timer"
    events: int  # changes the file system reported for this batch
    scan: ScanSummary
    features: tuple[ComputeSummary, ...] = field(default=())
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch": self.number, "reason": self.reason, "events": self.events, "scan": self.scan.as_dict(),
            "features": [f.as_dict() for f in self.features], "seconds": self.seconds,
        }  # fmt: skip

    @property
    def changed(self) -> bool:
        """Whether the batch changed the catalog (a line is printed for it)."""
        s = self.scan
        return bool(
            s.new or s.changed or s.missing or s.relabeled or s.pruned or any(f.computed for f in self.features)
        )

    def describe(self) -> str:
        s = self.scan
        changed = f"new {s.new}  changed {s.changed}  missing {s.missing}  unchanged {s.unchanged}"
        computed = "".join(f"  {f.feature_type} +{f.computed}" for f in self.features if f.selected)
        when = time.strftime("%H:%M:%S")
        why = f"{self.events} event(s)" if self.reason == "events" else self.reason
        return f"{when} batch {self.number} ({why}): {changed}{computed}  {self.seconds:.2f} s"


def watch_tree(
    catalog: Catalog,
    root: str | os.PathLike[str],
    options: ScanOptions = ScanOptions(),
    watching: WatchOptions = WatchOptions(),
    on_batch: Callable[[WatchBatch], None] | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Scan ``root``, then rescan it whenever it changes, until ``stop`` is set (or Ctrl-C);
    the number of batches run. InputError: another watcher holds the catalog, ``root`` is gone
    (also while watched), or events were asked for without ``watchfiles`` installed."""
    from dlindex.scan.run import scan_tree

    check_root(root)
    if watching.interval_s <= 0:
        raise InputError(f"--interval must be positive, not {watching.interval_s:g}")
    stop = stop or threading.Event()
    batches = 0
    with _WatchLock(catalog):
        for reason, events in _triggers(Path(root), watching, stop):
            if stop.is_set():
                break
            began = time.perf_counter()
            if not os.path.isdir(root):
                raise _gone(Path(root))
            summary = scan_tree(catalog, root, options)
            features = _compute_automatic(catalog, watching) if watching.compute else ()
            batch = WatchBatch(batches, reason, events, summary, features, round(time.perf_counter() - began, 3))
            batches += 1
            if on_batch is not None:
                on_batch(batch)
    return batches


def _triggers(root: Path, watching: WatchOptions, stop: threading.Event) -> Iterator[tuple[str, int]]:
    """("start", 0) once; then ("catch-up", 0) once the file system is watched (what changed
    before that, during the first scan, is caught there), ("events", n) for each batch of
    changes, and ("timer", 0) after each interval without any."""
    if not watching.events:
        yield "start", 0
        while not stop.wait(watching.interval_s):
            yield "timer", 0
        return
    events = _Events(root, watching, stop)  # watching from before the first scan, where it can
    try:
        yield "start", 0
        if events.ready.wait(_READY_S) or events.failed():
            events.check()
            yield "catch-up", 0
        due = time.monotonic() + watching.interval_s
        while not stop.is_set():  # woken each second at most: a caller's stop is seen soon
            changed = events.dirty.wait(min(_WAKE_S, max(0.0, due - time.monotonic())))
            events.check()
            if changed or time.monotonic() >= due:
                yield ("events", events.take()) if changed else ("timer", 0)
                due = time.monotonic() + watching.interval_s
    finally:
        events.close()


class _Events:
    """The file system's change events under ``root``, drained on a thread of their own as they
    come (``watchfiles``): a count and a flag, no path kept, so a flood of changes holds at most
    one debounce window's paths, whatever the rescans' pace. A Python thread is fine here: it
    waits inside the library (no lock of Python's held) and never touches the catalog."""

    def __init__(self, root: Path, watching: WatchOptions, stop: threading.Event) -> None:
        try:
            import watchfiles
        except ImportError:
            raise InputError(
                "scan --watch needs the watchfiles package for file-system events: pip install 'dlindex[watch]' "
                "(or give --no-events for timed rescans only)"
            ) from None
        self.root = root
        self.ready = threading.Event()  # the library watches
        self.dirty = threading.Event()  # something changed since the last take()
        self.count = 0
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.changes = watchfiles.watch(
            root, watch_filter=None, debounce=watching.debounce_ms, stop_event=_Either(stop, self.done),
            rust_timeout=int(_WAKE_S * 1000), yield_on_timeout=True, raise_interrupt=False,
            ignore_permission_denied=True,
        )  # fmt: skip
        self.thread = threading.Thread(target=self._drain, name="dlindex-watch-events", daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        try:
            for batch in self.changes:
                self.ready.set()
                if batch:
                    with self.lock:
                        self.count += len(batch)
                    self.dirty.set()
        except BaseException as e:  # handed to the scanning thread by check()
            self.error = e
            self.dirty.set()
            self.ready.set()

    def failed(self) -> bool:
        return self.error is not None

    def check(self) -> None:
        """InputError if the watching failed (the folder deleted or unmounted under it)."""
        if self.error is None:
            return
        if not self.root.is_dir():
            raise _gone(self.root)
        raise InputError(f"cannot watch {self.root}: {self.error}")

    def take(self) -> int:
        """The changes counted since the last call."""
        with self.lock:
            count, self.count = self.count, 0
            self.dirty.clear()
        return count

    def close(self) -> None:
        self.done.set()
        self.thread.join(_READY_S)


class _Either:
    """Set when either event is: the library's stop event for the caller's stop and our close."""

    def __init__(self, first: threading.Event, second: threading.Event) -> None:
        self.first, self.second = first, second

    def is_set(self) -> bool:
        return self.first.is_set() or self.second.is_set()


def _gone(root: Path) -> InputError:
    return InputError(f"{root} is gone: the watch stopped (the catalog keeps what it had)")


def _compute_automatic(catalog: Catalog, watching: WatchOptions) -> tuple[ComputeSummary, ...]:
    from dlindex.features.pipeline import ComputeOptions, compute_queued

    return tuple(compute_queued(catalog, ComputeOptions(workers=watching.compute_workers)))


class _WatchLock:
    """An exclusive lock per catalog on this machine: one watcher at a time."""

    def __init__(self, catalog: Catalog) -> None:
        key = hashlib.sha256(catalog.identity().encode("utf-8", "surrogateescape")).hexdigest()[:32]
        self.path = cache_dir() / "watch" / f"{key}.lock"
        self.shown = catalog.location
        self.fd: int | None = None

    def __enter__(self) -> _WatchLock:
        import fcntl

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise InputError(f"cannot make the watch lock {self.path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise InputError(
                f"another dlindex scan --watch (pid {holder}) is watching catalog {self.shown}; one watcher a catalog"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
            os.close(self.fd)  # the lock goes with the descriptor; the file stays (ours, tiny)
            self.fd = None
