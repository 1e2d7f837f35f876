"""The worker processes of ``features compute``: decode each image and run the extractor.

A small fork pool with one pipe per worker, built like the scan's ``dlindex.pool``: no
helper threads, so stopping is immediate; and the parent knows which batches each worker
holds, so when an extractor crashes its process (a segfault in a C extension) the batches
are rerun one image at a time in fresh processes and only the culprit fails.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import stat
import warnings
from collections import deque
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np
from PIL import Image

from .. import worker
from ..cstderr import CStderrCapture
from ..errors import DlindexError
from ..probe import ProbeOptions
from .extractors import Extractor
from .storage import encode

_ERROR_CHARS = 500
_state: dict[str, Any] = {}  # set in the parent before forking: the workers inherit it

Results = list[tuple[int, bytes | None, str | None]]


class _Worker:
    def __init__(self, context: Any) -> None:
        self.conn, child = context.Pipe(duplex=True)
        self.process = context.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        child.close()
        self.tasks: deque[list[tuple[int, bytes]]] = deque()


class Pool:
    """``submit`` batches of (id, path), ``wait_any`` for the results of finished ones."""

    def __init__(self, workers: int, extractor: Extractor, dtype: np.dtype[Any]) -> None:
        _state["extractor"] = extractor  # forked workers inherit it, whatever module it came from
        _state["dtype"] = dtype
        # fork: workers start in milliseconds and inherit the extractor and imported modules.
        self.context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        self.workers = [_Worker(self.context) for _ in range(workers)]

    @property
    def inflight(self) -> int:
        return sum(len(w.tasks) for w in self.workers)

    def submit(self, batch: list[tuple[int, bytes]]) -> None:
        # Tasks are a few KiB: writing one never blocks on a worker busy writing its result.
        w = min(self.workers, key=lambda w: len(w.tasks))
        w.tasks.append(batch)
        w.conn.send(batch)

    def wait_any(self) -> list[Results]:
        busy = {w.conn: w for w in self.workers if w.tasks}
        busy_by_sentinel = {w.process.sentinel: w for w in busy.values()}
        done: list[Results] = []
        for ready in wait([*busy, *busy_by_sentinel]):
            w = busy.get(ready) or busy_by_sentinel[ready]
            if not w.tasks:
                continue  # its pipe and its sentinel were both ready: handled once
            try:
                results = w.conn.recv()
            except (EOFError, OSError):
                done.extend(self._replace(w))
                continue
            w.tasks.popleft()
            done.append(results)
        return done

    def _replace(self, dead: _Worker) -> list[Results]:
        dead.process.join(1)
        dead.conn.close()
        self.workers[self.workers.index(dead)] = _Worker(self.context)
        batches = list(dead.tasks)
        dead.tasks.clear()  # its sentinel may be among the ready handles too: handle it once
        if self._run_alone([]) is None:
            raise DlindexError("extractor worker processes die as they start; try the extractor on one image by hand")
        return [[self._alone(item) for item in batch] for batch in batches]

    def _alone(self, item: tuple[int, bytes]) -> tuple[int, bytes | None, str | None]:
        results = self._run_alone([item])
        if results is None:
            return item[0], None, "the extractor crashed the worker process on this image"
        return results[0]

    def _run_alone(self, batch: list[tuple[int, bytes]]) -> Results | None:
        """A batch in a fresh worker of its own; None if the worker dies doing it."""
        solo = _Worker(self.context)
        try:
            solo.conn.send(batch)
            return solo.conn.recv()  # type: ignore[no-any-return]
        except (EOFError, OSError):
            return None
        finally:
            solo.conn.close()
            solo.process.terminate()
            solo.process.join()

    def close(self, abort: bool = False) -> None:
        for w in self.workers:
            if abort:
                w.process.terminate()  # busy or not: the catalog is the parent's
            else:
                try:
                    w.conn.send(None)
                except OSError:
                    pass
        for w in self.workers:
            w.process.join(5 if abort else None)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.conn.close()


def _serve(conn: Connection) -> None:
    _init()
    while True:
        try:
            batch = conn.recv()
        except EOFError:
            return  # the parent is gone
        if batch is None:
            return
        conn.send(_extract_batch(batch))


def _init() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C means
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    worker._die_with_parent()
    worker.keep_freed_memory()
    capture = CStderrCapture()
    capture.start()  # libjpeg & co. write to fd 2; keep it off the user's terminal
    _state["capture"] = capture
    warnings.simplefilter("ignore")
    Image.MAX_IMAGE_PIXELS = ProbeOptions().max_pixels


def _extract_batch(batch: list[tuple[int, bytes]]) -> list[tuple[int, bytes | None, str | None]]:
    """In a worker: (id, vector bytes, None) or (id, None, error) for each image."""
    extractor: Extractor = _state["extractor"]
    dtype = _state["dtype"]
    capture = _state.get("capture")
    results: list[tuple[int, bytes | None, str | None]] = []
    for image_id, path in batch:
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # opening a FIFO would hang the worker
                raise OSError("not a regular file")
            if extractor.from_file is not None:
                value = extractor.from_file(path)
            else:
                with Image.open(path) as image:
                    value = extractor.fn(image)
            vector = encode(value, dtype)
            results.append((image_id, vector.tobytes(), None))
        except Exception as e:  # noqa: BLE001 -- any failure of the image or the user's code fails this sample only
            text = f"{type(e).__name__}: {e}"
            if isinstance(capture, CStderrCapture):
                printed = capture.take()
                if printed:
                    text += f" ({printed})"
            results.append((image_id, None, text[:_ERROR_CHARS]))
    return results
