"""Worker processes: a small fork pool with one pipe per worker (``ForkPool``), and the scan's
pool of kinds of tasks on top of it (``WorkerPool``; ``features compute`` has its own).

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
import functools
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


class WorkerDied(Exception):
    """The worker running a task alone exited (a crash in a C library) before answering."""


class ForkWorker:
    def __init__(self, context: Any, init: Callable[[], None], handle: Callable[[Any], Any]) -> None:
        self.conn, child_conn = context.Pipe(duplex=True)
        self.process = context.Process(target=_serve, args=(child_conn, init, handle), daemon=True)
        self.process.start()
        child_conn.close()
        self.tasks: deque[Any] = deque()


def _serve(conn: Connection, init: Callable[[], None], handle: Callable[[Any], Any]) -> None:
    init()
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return  # the parent is gone
        if message is None:
            return
        conn.send(handle(message))


class ForkPool:
    """Forked workers with one duplex pipe each, and in the parent the tasks each one holds.

    A worker runs ``init()`` once, then answers every message with ``handle(message)``. The
    scan and ``features compute`` build on it; each decides what a task is and how to redo
    the tasks of a worker that died.
    """

    def __init__(self, workers: int, init: Callable[[], None], handle: Callable[[Any], Any]) -> None:
        # fork: workers start in milliseconds and inherit the imported modules.
        self.context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        self.target = (init, handle)
        self.workers = [self._start() for _ in range(max(1, workers))]

    def _start(self) -> ForkWorker:
        return ForkWorker(self.context, *self.target)

    @property
    def inflight(self) -> int:
        return sum(len(w.tasks) for w in self.workers)

    def least_busy(self) -> ForkWorker:
        return min(self.workers, key=lambda w: len(w.tasks))

    def send(self, w: ForkWorker, task: Any, message: Any = None, *, pickled: bytes | None = None) -> None:
        """Give ``w`` a task: ``message`` (or its ``pickled`` bytes) goes down its pipe."""
        w.tasks.append(task)
        if pickled is not None:
            w.conn.send_bytes(pickled)
        else:
            w.conn.send(message)

    def wait_any(self) -> tuple[list[tuple[Any, Any]], list[Any]]:
        """Block until a busy worker answers or dies: (task, answer) pairs, and the tasks of
        workers that died (each dead worker is replaced; redoing its tasks is the caller's)."""
        busy = {w.conn: w for w in self.workers if w.tasks}
        sentinels = {w.process.sentinel: w for w in busy.values()}
        answers: list[tuple[Any, Any]] = []
        orphans: list[Any] = []
        for ready in wait([*busy, *sentinels]):
            w = busy.get(ready) or sentinels[ready]  # type: ignore[index, call-overload]
            if not w.tasks:
                continue  # both its pipe and its sentinel were ready: handled once
            try:
                answer = w.conn.recv()
            except (EOFError, OSError):
                orphans.extend(self._replace(w))
                continue
            answers.append((w.tasks.popleft(), answer))
        return answers, orphans

    def _replace(self, dead: ForkWorker) -> list[Any]:
        dead.process.join(1)
        dead.conn.close()
        self.workers[self.workers.index(dead)] = self._start()
        tasks = list(dead.tasks)
        dead.tasks.clear()  # its sentinel may also be among the ready handles: handle once
        return tasks

    def run_alone(self, message: Any) -> Any:
        """Answer one message in a fresh worker of its own; WorkerDied if it dies doing it."""
        solo = self._start()
        try:
            solo.conn.send(message)
            return solo.conn.recv()
        except (EOFError, OSError):
            raise WorkerDied from None
        finally:
            solo.conn.close()
            solo.process.terminate()
            solo.process.join()

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


class WorkerPool:
    """The scan's pool: ``submit`` (kind, function, arguments) tasks, then ``wait_any``
    returns (kind, result) pairs as they finish."""

    def __init__(self, workers: int, options: ProbeOptions, io_threads: int, catalog_path: str) -> None:
        self.pool = ForkPool(workers, functools.partial(worker.init, options, io_threads, catalog_path), _call)
        self.backlog: deque[tuple[Task, bytes]] = deque()  # tasks no worker could take yet

    @property
    def inflight(self) -> int:
        return len(self.backlog) + self.pool.inflight

    def submit(self, kind: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
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
        answers, orphans = self.pool.wait_any()
        # A worker died: redo its tasks so that one bad file is isolated.
        results = [self._isolate(task) for task in orphans]
        results += [(kind, _unwrap(answer)) for (kind, _, _), answer in answers]
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
        return _unwrap(self.pool.run_alone((fn, args)))

    def _check_workers_start(self) -> None:
        try:
            self._run_alone(int, ())
        except WorkerDied:
            raise DlindexError("worker processes die as they start; try --workers 1") from None

    def close(self, abort: bool = False) -> None:
        self.pool.close(abort)


def _call(message: tuple[Callable[..., Any], tuple[Any, ...]]) -> Any:
    fn, args = message
    try:
        return fn(*args)
    except Exception:  # a bug, not a bad file: the parent re-raises it with this traceback
        return _Failed(traceback.format_exc())


@dataclasses.dataclass(frozen=True)
class _Failed:
    traceback: str


def _unwrap(result: Any) -> Any:
    if isinstance(result, _Failed):
        raise RuntimeError(f"a dlindex worker failed:\n{result.traceback}")
    return result
