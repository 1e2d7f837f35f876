"""The scan's worker processes: diff and probe tasks, and the pool that runs them.

Each worker reads many files at once, then hashes and sniffs them on one core.

On a cold cache a scan waits on the disk, which serves random reads far faster with
dozens in flight than one at a time; so each worker reads a batch with a small thread
pool (reads release the GIL), then inspects the bytes sequentially.
"""

from __future__ import annotations

import dataclasses
import functools
import pickle
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from PIL import Image

from dlindex.catalog.backend import ReadConnection
from dlindex.engines.local import CStderrCapture, ForkPool, WorkerDied, call_task, init_child, task_result
from dlindex.errors import DlindexError
from dlindex.scan.diff import DiffOptions, LabelIds, UnitDiff, diff_unit
from dlindex.scan.probe import NOT_CACHED, Content, Probe, ProbeOptions, inspect_content, read_content
from dlindex.scan.units import Unit


@dataclasses.dataclass
class _Worker:
    """What one worker process holds between tasks (set by ``init``)."""

    options: ProbeOptions
    capture: CStderrCapture
    io: ThreadPoolExecutor | None  # reader threads for batches not in the page cache
    io_threads: int
    catalog_path: str | None
    reader: ReadConnection | None = None  # opened by the first diff task
    labels: LabelIds | None = None


_worker: _Worker | None = None


def init(options: ProbeOptions, io_threads: int, catalog_path: str | None = None) -> None:
    """A scan worker's set-up: the common child set-up, then its probe options and reader threads."""
    global _worker
    capture = init_child()
    Image.MAX_IMAGE_PIXELS = options.max_pixels
    io = ThreadPoolExecutor(io_threads) if io_threads > 1 else None
    _worker = _Worker(options, capture, io, io_threads, catalog_path)


def _this_worker() -> _Worker:
    assert _worker is not None, "scan tasks run in workers set up by init"
    return _worker


def diff_task(root_id: int, units: list[Unit], options: DiffOptions) -> list[UnitDiff]:
    """Walk units and diff them against the catalog through this process's read-only connection;
    probe a unit's new and changed files right here when there are few enough."""
    worker = _this_worker()
    if worker.reader is None or worker.labels is None:
        from dlindex.catalog.connection import connect_reader

        worker.reader = connect_reader(str(worker.catalog_path), timeout=30)
        worker.labels = LabelIds(worker.reader)
    reader, labels = worker.reader, worker.labels
    diffs = []
    for unit in units:
        diff = diff_unit(reader, root_id, unit, options, labels)
        if 0 < len(diff.to_probe) <= options.probe_inline:
            probes = probe_batch([(item.path, item.key) for item in diff.to_probe])
            diff.probed = list(zip(probes, diff.to_probe, strict=True))
            diff.to_probe = []
        diffs.append(diff)
    return diffs


def probe_task(batch: list[tuple[bytes, str]]) -> list[tuple[object, ...]]:
    """probe_batch for the pool: Probes as plain tuples, which pickle in C (see UnitDiff);
    the parent rebuilds them with ``tuple.__new__(Probe, ...)``."""
    return [tuple(probe) for probe in probe_batch(batch)]


def probe_batch(batch: list[tuple[bytes, str]]) -> list[Probe]:
    """Probe files in order; from the first file not in the page cache on, read in threads.

    A warm batch never touches the thread pool (thread hand-offs cost more than reads
    from memory); a cold one gets up to ``io_threads`` reads in flight.
    """
    worker = _this_worker()
    options, capture, io = worker.options, worker.capture, worker.io
    results: list[Probe] = []
    for index, (path, key) in enumerate(batch):
        content = read_content(path, options.follow_symlinks, only_if_cached=io is not None)
        if content is NOT_CACHED and io is not None:
            rest = batch[index:]
            groups = _split([p for p, _ in rest], worker.io_threads)
            follow = [options.follow_symlinks] * len(groups)
            contents = [c for group in io.map(_read_group, groups, follow) for c in group]
            results.extend(_inspect(p, k, c, options, capture) for (p, k), c in zip(rest, contents, strict=True))
            break
        results.append(_inspect(path, key, content, options, capture))
    return results


def _inspect(path: bytes, key: str, content: Content | Probe, options: ProbeOptions, capture: CStderrCapture) -> Probe:
    if isinstance(content, Probe):
        return content._replace(key=key)
    return inspect_content(path, key, content, options, capture)


def _read_group(paths: list[bytes], follow_symlinks: bool) -> list[Content | Probe]:
    return [read_content(path, follow_symlinks) for path in paths]


def _split(items: list[bytes], parts: int) -> list[list[bytes]]:
    size = max(1, -(-len(items) // parts))
    return [items[i : i + size] for i in range(0, len(items), size)]


# A second task is queued to a busy worker only if it is small, so that a worker blocked
# writing a large result can never be blocked by us writing a large task to it.
_SMALL_TASK = 64 * 1024
Task = tuple[str, Callable[..., Any], tuple[Any, ...]]  # (kind, function, arguments)


class WorkerPool:
    """The scan's pool: ``submit`` (kind, function, arguments) tasks, then ``wait_any``
    returns (kind, result) pairs as they finish."""

    def __init__(self, workers: int, options: ProbeOptions, io_threads: int, catalog_path: str) -> None:
        self.pool = ForkPool(workers, functools.partial(init, options, io_threads, catalog_path), call_task)
        self.backlog: deque[tuple[Task, bytes]] = deque()  # tasks no worker could take yet

    @property
    def inflight(self) -> int:
        """Tasks submitted and not answered yet."""
        return len(self.backlog) + self.pool.inflight

    def submit(self, kind: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Run ``fn(*args)`` in a worker; its result comes back from ``wait_any`` as (kind, result)."""
        data = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        self.backlog.append(((kind, fn, args), data))
        self._dispatch()

    def _dispatch(self) -> None:
        while self.backlog:
            idle = self.pool.least_busy()
            task, data = self.backlog[0]
            if idle.tasks and (len(idle.tasks) >= 2 or len(data) > _SMALL_TASK):
                return
            self.backlog.popleft()
            self.pool.send(idle, task, pickled=data)

    def wait_any(self) -> list[tuple[str, Any]]:
        """Block until some tasks finish: their (kind, result) pairs, a dead worker's redone."""
        answers, orphans = self.pool.wait_any()
        # A worker died: redo its tasks so that one bad file is isolated.
        results = [self._isolate(task) for task in orphans]
        results += [(kind, task_result(answer)) for (kind, _, _), answer in answers]
        self._dispatch()
        return results

    def _isolate(self, task: Task) -> tuple[str, Any]:
        kind, fn, args = task
        if kind == "diff":
            # Walk again without probing in the walker: its files then come back as
            # ordinary probe batches, where a crashing file is isolated like any other.
            root_id, units, options = args
            try:
                return kind, self._run_alone(fn, (root_id, units, dataclasses.replace(options, probe_inline=0)))
            except WorkerDied:
                raise DlindexError("a worker process died while walking the tree; try --workers 1") from None
        probes: list[Probe] = []
        for path, key in args[0]:
            try:
                probes.extend(self._run_alone(fn, ([(path, key)],)))
            except WorkerDied:
                self._check_workers_start()
                probes.append(Probe(key, "corrupt", error="a decoder crashed the worker process on this file"))
        return kind, probes

    def _run_alone(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        return task_result(self.pool.run_alone((fn, args)))

    def _check_workers_start(self) -> None:
        try:
            self._run_alone(int, ())
        except WorkerDied:
            raise DlindexError("worker processes die as they start; try --workers 1") from None

    def close(self, abort: bool = False) -> None:
        """Stop the workers: when idle, or at once with ``abort``."""
        self.pool.close(abort)
