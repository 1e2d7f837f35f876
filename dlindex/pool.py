"""The worker processes of a scan: one fork pool for unit diffs and probe batches.

Workers start in milliseconds (fork), ignore Ctrl-C, and die with their parent. A worker
killed by a crashing C decoder breaks a ProcessPoolExecutor for good; this pool replaces
it and retries what was in flight so that only the culprit file is marked corrupt.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from . import worker
from .errors import DlindexError
from .probe import Probe, ProbeOptions


class WorkerPool:
    """Worker processes running diff and probe tasks, answering in completion order.

    A worker killed by a crashing decoder breaks the pool; the probe batches in flight are
    then retried one file at a time in fresh pools, so only the culprit is marked corrupt,
    and the unit walks in flight are simply run again.
    """

    def __init__(self, workers: int, options: ProbeOptions, io_threads: int, catalog_path: str) -> None:
        self.initargs = (options, io_threads, catalog_path)
        self.workers = workers
        self.inflight: dict[Future[Any], tuple[str, Callable[..., Any], tuple[Any, ...]]] = {}
        self.executor = self._new_executor()

    def _new_executor(self) -> ProcessPoolExecutor:
        # fork: workers start in milliseconds and inherit the imported modules.
        context = multiprocessing.get_context("fork") if os.name == "posix" else None
        return ProcessPoolExecutor(self.workers, mp_context=context, initializer=worker.init, initargs=self.initargs)

    def submit(self, kind: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.inflight[self.executor.submit(fn, *args)] = (kind, fn, args)

    def wait_any(self) -> list[tuple[str, Any]]:
        done, _ = wait(self.inflight, return_when=FIRST_COMPLETED)
        results = []
        for future in done:
            kind, fn, args = self.inflight.pop(future)
            try:
                results.append((kind, future.result()))
            except BrokenProcessPool:
                return results + self._recover([(kind, fn, args)] + list(self.inflight.values()))
        return results

    def _recover(self, tasks: list[tuple[str, Callable[..., Any], tuple[Any, ...]]]) -> list[tuple[str, Any]]:
        self.inflight.clear()
        self.executor.shutdown(wait=False, cancel_futures=True)
        results: list[tuple[str, Any]] = []
        for kind, fn, args in tasks:
            if kind == "diff":
                # Walk again without probing in the walker, so that probing goes through
                # batches below and a crashing file is isolated like any other.
                root_id, units, options = args
                args = (root_id, units, dataclasses.replace(options, probe_inline=0))
                self.executor = self._new_executor()
                try:
                    results.append((kind, self.executor.submit(fn, *args).result()))
                except BrokenProcessPool:
                    raise DlindexError("a worker process died while walking the tree; try --workers 1") from None
                continue
            probes: list[Probe] = []
            for path, key in args[0]:
                self.executor = self._new_executor()
                self._check_workers_start()
                try:
                    probes.extend(self.executor.submit(fn, [(path, key)]).result())
                except BrokenProcessPool:
                    probes.append(Probe(key, "corrupt", error="a decoder crashed the worker process on this file"))
                    self.executor.shutdown(wait=False)
            results.append((kind, probes))
        self.executor = self._new_executor()
        return results

    def _check_workers_start(self) -> None:
        try:
            self.executor.submit(int).result()
        except BrokenProcessPool:
            raise DlindexError("probe worker processes die on start; try --workers 1") from None

    def close(self, abort: bool = False) -> None:
        if abort:  # stop busy workers now; then the manager thread sees them gone and exits
            for process in list((getattr(self.executor, "_processes", None) or {}).values()):
                process.terminate()
        self.executor.shutdown(wait=True, cancel_futures=True)
