"""The worker processes of a scan: a small fork pool with one pipe per worker.

Why not ``concurrent.futures.ProcessPoolExecutor``: a worker killed by a crashing C decoder
breaks that pool for good and loses track of which task killed it, and terminating busy
workers can leave its manager thread blocked on a half-written result, hanging the
interpreter at exit. Here each worker has its own pipe and the parent knows exactly which
tasks each worker holds: a dead worker is replaced and only its own tasks are retried —
probe batches one file at a time, so only the culprit is marked corrupt. There are no
background threads, so stopping is always immediate.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pickle
import traceback
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from . import worker
from .errors import DlindexError
from .probe import Probe, ProbeOptions

Task = tuple[str, Callable[..., Any], tuple[Any, ...]]  # (kind, function, arguments)
# A second task is queued to a busy worker only if it is small, so that a worker blocked
# writing a large result can never be blocked by us writing a large task to it.
_SMALL_TASK = 64 * 1024


class _Worker:
    def __init__(self, context: Any, initargs: tuple[Any, ...]) -> None:
        self.conn, child_conn = context.Pipe(duplex=True)
        self.process = context.Process(target=_serve, args=(child_conn, initargs), daemon=True)
        self.process.start()
        child_conn.close()
        self.tasks: deque[Task] = deque()


def _serve(conn: Connection, initargs: tuple[Any, ...]) -> None:
    worker.init(*initargs)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return  # the parent is gone
        if message is None:
            return
        fn, args = message
        try:
            result = fn(*args)
        except Exception:  # a bug, not a bad file: the parent re-raises it with this traceback
            result = _Failed(traceback.format_exc())
        conn.send(result)


class WorkerPool:
    """``submit`` tasks, then ``wait_any`` returns (kind, result) pairs as they finish."""

    def __init__(self, workers: int, options: ProbeOptions, io_threads: int, catalog_path: str) -> None:
        # fork: workers start in milliseconds and inherit the imported modules.
        self.context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        self.initargs = (options, io_threads, catalog_path)
        self.workers = [_Worker(self.context, self.initargs) for _ in range(max(1, workers))]
        self.backlog: deque[tuple[Task, bytes]] = deque()  # tasks no worker could take yet

    @property
    def inflight(self) -> int:
        return len(self.backlog) + sum(len(w.tasks) for w in self.workers)

    def submit(self, kind: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        data = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        self.backlog.append(((kind, fn, args), data))
        self._dispatch()

    def _dispatch(self) -> None:
        while self.backlog:
            idle = min(self.workers, key=lambda w: len(w.tasks))
            task, data = self.backlog[0]
            if idle.tasks and (len(idle.tasks) >= 2 or len(data) > _SMALL_TASK):
                return
            self.backlog.popleft()
            idle.tasks.append(task)
            idle.conn.send_bytes(data)

    def wait_any(self) -> list[tuple[str, Any]]:
        busy = {w.conn: w for w in self.workers if w.tasks}
        sentinels = {w.process.sentinel: w for w in busy.values()}
        results: list[tuple[str, Any]] = []
        for ready in wait([*busy, *sentinels]):
            w = busy.get(ready) or sentinels[ready]  # type: ignore[index, call-overload]
            if not w.tasks:
                continue  # both its pipe and its sentinel were ready: handled once
            try:
                result = w.conn.recv()
            except (EOFError, OSError):
                results.extend(self._replace(w))
                continue
            kind, _, _ = w.tasks.popleft()
            results.append((kind, _unwrap(result)))
        self._dispatch()
        return results

    def _replace(self, dead: _Worker) -> list[tuple[str, Any]]:
        """A worker died: start another and redo its tasks so that one bad file is isolated."""
        dead.process.join(1)
        dead.conn.close()
        self.workers[self.workers.index(dead)] = _Worker(self.context, self.initargs)
        tasks = list(dead.tasks)
        dead.tasks.clear()  # its sentinel may also be among the ready handles: handle once
        return [self._isolate(task) for task in tasks]

    def _isolate(self, task: Task) -> tuple[str, Any]:
        kind, fn, args = task
        if kind == "diff":
            # Walk again without probing in the walker: its files then come back as
            # ordinary probe batches, where a crashing file is isolated like any other.
            root_id, units, options = args
            try:
                return kind, self._run_alone(fn, (root_id, units, dataclasses.replace(options, probe_inline=0)))
            except _WorkerDied:
                raise DlindexError("a worker process died while walking the tree; try --workers 1") from None
        probes: list[Probe] = []
        for path, key in args[0]:
            try:
                probes.extend(self._run_alone(fn, ([(path, key)],)))
            except _WorkerDied:
                self._check_workers_start()
                probes.append(Probe(key, "corrupt", error="a decoder crashed the worker process on this file"))
        return kind, probes

    def _run_alone(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """Run one task in a fresh worker of its own; _WorkerDied if it dies doing it."""
        solo = _Worker(self.context, self.initargs)
        try:
            solo.conn.send((fn, args))
            return _unwrap(solo.conn.recv())
        except (EOFError, OSError):
            raise _WorkerDied from None
        finally:
            solo.conn.close()
            solo.process.terminate()
            solo.process.join()

    def _check_workers_start(self) -> None:
        try:
            self._run_alone(int, ())
        except _WorkerDied:
            raise DlindexError("worker processes die as they start; try --workers 1") from None

    def close(self, abort: bool = False) -> None:
        for w in self.workers:
            if abort:
                w.process.terminate()  # busy or idle: stop now; the catalog is the parent's
            else:
                try:
                    w.conn.send(None)
                except OSError:
                    pass
        for w in self.workers:
            w.process.join(None if not abort else 5)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.conn.close()


class _WorkerDied(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class _Failed:
    traceback: str


def _unwrap(result: Any) -> Any:
    if isinstance(result, _Failed):
        raise RuntimeError(f"a dlindex worker failed:\n{result.traceback}")
    return result
