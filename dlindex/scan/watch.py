"""``dlindex scan ROOT --watch``: keep the catalog current while the tree changes.

Events are hints, the rescan is the truth. The watcher scans ROOT once, then waits for the file
system to say something changed under it (inotify and the like, through ``watchfiles``), and
answers each batch of events with an ordinary rescan of ROOT: the same incremental scan as
``dlindex scan`` (an unchanged folder costs a ``find`` line per file), then, where feature types
are automatic, ``features compute --queued``. So nothing depends on an event arriving: a lost or
overflowed event queue, a file system that sends none (NFS, a FUSE mount), or a change made
while a batch was being scanned is caught by the next rescan, and a rescan runs at least every
``interval_s`` whatever the events (the safety net). A flood of events is one batch; the
watcher keeps no path of its own, only the library's set of changed paths while it debounces.

One watcher per catalog on a machine: a second one is refused (a lock file under the user's
cache folder, keyed by the catalog's identity). Each batch is restart-safe, as every scan is:
a watcher killed at any moment leaves whole transactions, and the next run (or the next batch)
finishes the work.
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

from dlindex.errors import InputError
from dlindex.scan.options import ScanOptions, ScanSummary, check_root

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.features.pipeline import ComputeSummary

_WAKE_S = 1.0  # the watcher wakes at least this often (to count the interval and see Ctrl-C)


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
                raise InputError(f"{os.fspath(root)} is gone: the watch stopped (the catalog keeps what it had)")
            summary = scan_tree(catalog, root, options)
            features = _compute_automatic(catalog, watching) if watching.compute else ()
            batch = WatchBatch(batches, reason, events, summary, features, round(time.perf_counter() - began, 3))
            batches += 1
            if on_batch is not None:
                on_batch(batch)
    return batches


def _triggers(root: Path, watching: WatchOptions, stop: threading.Event) -> Iterator[tuple[str, int]]:
    """("start", 0) once; then ("events", n) for each batch of changes, and ("timer", 0) after
    each interval without any. The file system is watched from after the first scan on, so the
    first word from the watcher (whatever it is) is answered by a rescan ("catch-up"): what
    changed while the first scan ran, before anything watched, is caught there."""
    yield "start", 0
    if not watching.events:
        while not stop.wait(watching.interval_s):
            yield "timer", 0
        return
    try:
        import watchfiles
    except ImportError:
        raise InputError(
            "scan --watch needs the watchfiles package for file-system events: pip install 'dlindex[watch]' "
            "(or give --no-events for timed rescans only)"
        ) from None
    # Woken at least every second (nothing to do then but look at the clock): the first wake
    # says the watcher is in place; the interval is counted here, not by the library.
    changes = watchfiles.watch(
        root, watch_filter=None, debounce=watching.debounce_ms, stop_event=stop,
        rust_timeout=int(min(watching.interval_s, _WAKE_S) * 1000), yield_on_timeout=True, raise_interrupt=True,
        ignore_permission_denied=True,
    )  # fmt: skip
    last = time.monotonic()
    first = True
    try:
        for batch in changes:
            now = time.monotonic()
            if first or batch or now - last >= watching.interval_s:
                yield ("events", len(batch)) if batch else ("catch-up" if first else "timer", 0)
                first, last = False, time.monotonic()
    except (OSError, RuntimeError) as e:  # the watched folder deleted or unmounted under the library
        if not root.is_dir():
            raise InputError(f"{root} is gone: the watch stopped (the catalog keeps what it had)") from None
        raise InputError(f"cannot watch {root}: {e}") from None


def _compute_automatic(catalog: Catalog, watching: WatchOptions) -> tuple[ComputeSummary, ...]:
    from dlindex.features.pipeline import ComputeOptions, compute_queued

    return tuple(compute_queued(catalog, ComputeOptions(workers=watching.compute_workers)))


class _WatchLock:
    """An exclusive lock per catalog on this machine: one watcher at a time."""

    def __init__(self, catalog: Catalog) -> None:
        key = hashlib.sha256(catalog.identity().encode("utf-8", "surrogateescape")).hexdigest()[:32]
        self.path = _lock_dir() / f"{key}.lock"
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


def _lock_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dlindex" / "watch"
