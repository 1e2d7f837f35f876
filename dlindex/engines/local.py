"""The local engine: a fork pool of worker processes and the set-up every worker runs.

Why not ``concurrent.futures.ProcessPoolExecutor``: a worker killed by a crashing C decoder
breaks that pool for good and loses track of which task killed it, and terminating busy
workers can leave its manager thread blocked on a half-written result, hanging the
interpreter at exit. Here each worker has its own pipe and the parent knows exactly which
tasks each worker holds: a dead worker is replaced and only its own tasks are retried (the
scan and ``features compute`` each decide how). There are no background threads, so stopping
is always immediate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import warnings
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dlindex.errors import DlindexError

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

# multiprocessing, ctypes and tempfile are imported where they are used: scan, features compute
# and export import this module, and those three cost ~10 ms of each command's start.

MAX_CAPTURED_CHARS = 500


class WorkerDied(Exception):
    """The worker running a task alone exited (a crash in a C library) before answering."""


class ForkWorker:
    """One forked worker: its process, its end of the pipe, and the tasks it holds."""

    def __init__(self, context: Any, init: Callable[[], None], handle: Callable[[Any], Any]) -> None:
        self.conn, child_conn = context.Pipe(duplex=True)
        args = (child_conn, self.conn, os.getpid(), init, handle)
        self.process = context.Process(target=_serve, args=args, daemon=True)
        self.process.start()
        child_conn.close()
        self.tasks: deque[Any] = deque()


def _serve(
    conn: Connection, parent_end: Connection, parent: int, init: Callable[[], None], handle: Callable[[Any], Any]
) -> None:
    # First of all: a worker that outlives a parent killed with -9 keeps the catalog open.
    die_with_parent(parent)
    parent_end.close()  # the parent's end, inherited by the fork: else recv never sees EOF
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
        import multiprocessing

        self.context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        self.target = (init, handle)
        self.workers = [self._start() for _ in range(max(1, workers))]

    def _start(self) -> ForkWorker:
        return ForkWorker(self.context, *self.target)

    @property
    def inflight(self) -> int:
        """Tasks sent and not answered yet, all workers together."""
        return sum(len(w.tasks) for w in self.workers)

    def least_busy(self) -> ForkWorker:
        """The worker holding the fewest tasks."""
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
        from multiprocessing.connection import wait

        for ready in wait([*busy, *sentinels]):
            w = busy.get(ready) or sentinels[ready]
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
        """Stop every worker: after its tasks, or at once with ``abort``."""
        for w in self.workers:
            if abort:
                w.process.terminate()  # busy or idle: stop now; the catalog is the parent's
            else:
                with contextlib.suppress(OSError):
                    w.conn.send(None)
        for w in self.workers:
            w.process.join(None if not abort else 5)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.conn.close()


def call_task(message: tuple[Callable[..., Any], tuple[Any, ...]]) -> Any:
    """A worker's ``handle`` for (function, arguments) messages: the result, or the traceback of a bug."""
    fn, args = message
    try:
        return fn(*args)
    except DlindexError as e:  # the user's to fix (a lost server): the parent says it in one line
        return _Refused(type(e), str(e))
    except Exception:  # a bug, not a bad file: the parent re-raises it with this traceback
        import traceback

        return _Failed(traceback.format_exc())


@dataclasses.dataclass(frozen=True)
class _Failed:
    traceback: str


@dataclasses.dataclass(frozen=True)
class _Refused:
    kind: type[DlindexError]
    message: str


def task_result(result: Any) -> Any:
    """In the parent: the answer of ``call_task``, re-raising a worker's DlindexError as it
    was, and a worker's bug with its traceback."""
    if isinstance(result, _Refused):
        raise result.kind(result.message)
    if isinstance(result, _Failed):
        raise RuntimeError(f"a dlindex worker failed:\n{result.traceback}")
    return result


def sigterm_as_interrupt() -> Callable[[], None]:
    """Make SIGTERM raise KeyboardInterrupt, so a killed run stops the way Ctrl-C stops it
    (keep what is committed, record the interruption); returns the function that restores
    the previous handler."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        return lambda: None

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore


class CStderrCapture:
    """Redirect file descriptor 2 into a private temp file, so C libraries (libtiff) that
    print warnings straight to stderr end up in the file's record, not on the user's screen."""

    def __init__(self) -> None:
        import tempfile

        self._file = tempfile.TemporaryFile()  # noqa: SIM115 (open for the whole life of the worker)
        self._saved_fd: int | None = None

    def start(self) -> None:
        """Point fd 2 at the capture file."""
        self._saved_fd = os.dup(2)
        os.dup2(self._file.fileno(), 2)

    def stop(self) -> None:
        """Give fd 2 back."""
        if self._saved_fd is not None:
            os.dup2(self._saved_fd, 2)
            os.close(self._saved_fd)
            self._saved_fd = None

    def take(self) -> str | None:
        """What was printed since the last call, de-duplicated lines joined; None if nothing."""
        fd = self._file.fileno()
        written = os.lseek(fd, 0, os.SEEK_CUR)
        if written == 0:
            return None
        text = os.pread(fd, min(written, 4 * MAX_CAPTURED_CHARS), 0).decode("utf-8", "replace")
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        lines = dict.fromkeys(line.strip() for line in text.splitlines() if line.strip())
        return "; ".join(lines)[:MAX_CAPTURED_CHARS] or None


def init_child() -> CStderrCapture:
    """The set-up every worker process runs first; returns its capture of C libraries' stderr."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C means
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    keep_freed_memory()
    capture = CStderrCapture()
    capture.start()  # libtiff & co. write to fd 2; keep it off the user's terminal
    warnings.simplefilter("ignore")
    return capture


def keep_freed_memory() -> None:
    """glibc: keep freed read buffers in the heap instead of returning them to the kernel.

    Every file's bytes are a fresh allocation; by default glibc hands large ones back
    (munmap, heap trim) and the next file page-faults them in again, ~15 faults a file,
    which doubled the probe's CPU time in measurements. Heap growth stays bounded by the
    largest batch in flight.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: files up to 32 MiB come from the heap
        libc.mallopt(-8, 2)  # M_ARENA_MAX: reader threads share arenas instead of making new ones
    except (OSError, AttributeError):
        pass


def die_with_parent(parent: int) -> None:
    """In a child of process ``parent``: die when it dies, even of kill -9 (Linux), instead of
    lingering with the catalog open; exits at once if it is already gone."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    # A parent killed between the fork and the prctl sent no signal: it is gone if we were
    # handed to another parent (init or a subreaper).
    if os.getppid() != parent:
        os._exit(1)
