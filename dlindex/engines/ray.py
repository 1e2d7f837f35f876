"""Ray as an engine: connecting (``--address``, ``RAY_ADDRESS``), Arrow batches through actors, retried tasks.

Ray is imported here only, and only when a job runs with ``engine="ray"``. ``connected``
joins the cluster at ``address`` (``--address``, else the ``RAY_ADDRESS`` convention), or
starts a local one with a CPU per core; a process already connected (a notebook, a test's
cluster) is used as it is. The stages keep their single writer: ``map_arrow`` streams Arrow
tables through a pool of actors and yields the result tables in the driver, and
``run_tasks`` runs one retried task per static part. See docs/scale-out.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

from dlindex.engines.local import CStderrCapture, die_with_parent
from dlindex.errors import DlindexError, InputError
from dlindex.pids import host_tag, pid_alive, process_start

INSTALL_HINT = "--engine ray needs the ray extra: pip install 'dlindex[ray]'"
_PROBE_SECONDS = 5.0  # a TCP connect to the head; ray.init itself would retry for a minute
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # and empty SETTINGS
_SETTINGS_FRAME = 4
_LOCAL_ADDRESSES = ("auto", "local")  # ray.init's own: find a cluster on this machine / start one

T = TypeVar("T")
_TASK = "dlindex-task-"
_TASK_FOLDER = re.compile(r"^dlindex-task-(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-(?P<start>\d+)\.[^/]+$")


def import_ray() -> Any:
    """The ``ray`` module with Ray Data; InputError naming the extra if it cannot be imported."""
    try:
        import ray
        import ray.data  # the features pipeline needs it: fail here, not mid-job
    except ImportError as e:
        raise InputError(f"{INSTALL_HINT} ({e})") from None
    return ray


@contextmanager
def connected(address: str | None = None) -> Iterator[Any]:
    """Ray, connected for the duration of a job: to ``address`` (or ``$RAY_ADDRESS``), else to
    a local cluster started here; shut down afterwards only if this call connected.

    Raises:
        InputError: ray is not installed, or the address is unreachable (one line).
    """
    ray = import_ray()
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is not None and address not in _LOCAL_ADDRESSES:
        _probe(address)
    # Ray's driver prints its notes ("A worker died ...") on stdout, which carries results only.
    with contextlib.redirect_stdout(sys.stderr):
        if ray.is_initialized():
            yield ray
            return
        with _started(ray, address):
            yield ray


@contextmanager
def _started(ray: Any, address: str | None) -> Iterator[None]:
    """``ray.init`` for one job, quietly; ``ray.shutdown`` after it."""
    # Ray's C++ core prints notes on stderr as errors ("constructor arguments in the object store"),
    # and says so when told not to: silenced unless the user chose a level, and init's fd 2 captured.
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR, "include_dashboard": False}
    capture = CStderrCapture()
    capture.start()
    try:
        if address is None:
            ray.init(num_cpus=os.cpu_count() or 1, **quiet)
        else:
            ray.init(address=address, **quiet)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
        raise InputError(
            f"cannot connect to the Ray cluster at {address or 'a new local cluster'}: {_line(e)}"
        ) from None
    finally:
        capture.stop()
    _quiet_data(ray)
    try:
        yield
    finally:
        ray.shutdown()


def _probe(address: str) -> None:
    """InputError unless something listens at ``address`` (``host:port`` or ``ray://host:port``)."""
    hostport = address.removeprefix("ray://").rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise InputError(f"bad Ray address {address!r}: expected HOST:PORT (the head's GCS port, 6379 by default)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_SECONDS) as conn:
            speaks_grpc = _answers_http2(conn)
    except OSError as e:
        raise InputError(
            f"cannot reach the Ray cluster at {address}: {e.strerror or e}; "
            "start it with `ray start --head`, or leave out --address and RAY_ADDRESS for a local one"
        ) from None
    if not speaks_grpc:
        # ray.init would wait forever on a listener that is not Ray's (an HTTP server, redis)
        raise InputError(
            f"something listens at {address}, but it does not answer as a Ray cluster does (gRPC); "
            "give the head's GCS address, which `ray start --head` prints"
        )


def _answers_http2(conn: socket.socket) -> bool:
    """Whether the server on ``conn`` answers an HTTP/2 client preface with a SETTINGS frame,
    as Ray's GCS and Ray Client servers (gRPC) do; True unchecked where Ray uses TLS."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return True
    conn.sendall(_HTTP2_PREFACE)
    head = b""
    try:
        while len(head) < 9:  # a frame header: length (3), type (1), flags (1), stream (4)
            chunk = conn.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
    except TimeoutError:
        return False
    return len(head) == 9 and head[3] == _SETTINGS_FRAME


def _quiet_data(ray: Any) -> None:
    """No progress bars or execution plans from Ray Data on the user's terminal: the CLI has its own."""
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # "execution finished in 3.4 seconds" & co.
    with warnings.catch_warnings():  # its own deprecated settings, warned about as it reads them
        warnings.simplefilter("ignore", DeprecationWarning)
        context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False


def _line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


def cluster_resources() -> dict[str, float]:
    """The cluster's total resources (``CPU``, ``GPU``, ...), as Ray counts them."""
    ray = import_ray()
    resources: dict[str, float] = ray.cluster_resources()
    return resources


def map_arrow(
    tables: Sequence[Any],
    actor: type,
    constructor_kwargs: dict[str, Any],
    *,
    batch_size: int,
    actors: int,
    num_gpus: float = 0,
) -> Iterator[Any]:
    """``actor(**constructor_kwargs)`` on ``actors`` Ray actors, called with pyarrow tables of at
    most ``batch_size`` rows cut from ``tables``; yields the pyarrow tables they return, in the
    order they finish. An actor that dies is restarted and its batches rerun (Ray Data's
    defaults: ``max_restarts=-1``, ``max_task_retries=-1``)."""
    ray = import_ray()
    _quiet_data(ray)
    dataset = ray.data.from_arrow(list(tables)).map_batches(
        actor,
        fn_constructor_kwargs=constructor_kwargs,
        batch_format="pyarrow",
        batch_size=batch_size,
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=0 if num_gpus else 1,
        num_gpus=num_gpus,
    )
    try:
        yield from dataset.iter_batches(batch_format="pyarrow", batch_size=None, prefetch_batches=2)
    except ray.exceptions.RayError as e:
        raise _as_dlindex_error(e) from None


def run_tasks(fn: Callable[..., T], calls: Sequence[tuple[Any, ...]], *, max_retries: int = 3) -> list[T]:
    """``fn(*args)`` for each ``args`` in ``calls``, one Ray task each (a CPU each), in parallel
    over the cluster; a task whose worker, node or process dies is run again, up to
    ``max_retries`` times, so ``fn`` must be safe to rerun (a scan or export part is: it
    resumes). The results in the order of ``calls``; the first DlindexError a task raised is
    raised here as itself.

    Each call runs in a fresh Python process that the task starts (see ``_isolated``): ``fn``
    and its arguments must pickle by reference (module-level functions, plain values)."""
    ray = import_ray()
    remote = ray.remote(_isolated).options(
        num_cpus=1, max_retries=max_retries, retry_exceptions=[ProcessDied], name=getattr(fn, "__name__", "task")
    )
    refs = [remote.remote(fn, args) for args in calls]
    try:
        results: list[T] = ray.get(refs)
    except ray.exceptions.RayError as e:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise _as_dlindex_error(e) from None
    return results


class ProcessDied(RuntimeError):
    """A task's process was killed (a signal, the OOM killer): Ray runs the task again."""


def _isolated(fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """In a Ray worker: ``fn(*args)`` in a child Python process, whose result comes back pickled.

    A Ray worker holds gRPC threads, and dlindex's scan and export fork worker pools: a fork of
    a process with gRPC threads can leave it stuck. A fresh interpreter forks safely, gets
    dlindex's own signal handling, and dies with the worker (PR_SET_PDEATHSIG)."""
    _remove_dead_tasks(Path(tempfile.gettempdir()))
    with tempfile.TemporaryDirectory(
        prefix=f"{_TASK}{host_tag()}-{os.getpid()}-{process_start(os.getpid())}."
    ) as folder:
        task, result = Path(folder, "task.pickle"), Path(folder, "result.pickle")
        task.write_bytes(pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL))
        code = "from dlindex.engines.ray import child_main; child_main()"
        proc = subprocess.run([sys.executable, "-c", code, str(task), str(result), str(os.getpid())], check=False)
        if not result.exists():
            raise ProcessDied(f"{getattr(fn, '__name__', 'the task')} exited with {proc.returncode}")
        ok, value = pickle.loads(result.read_bytes())
    if not ok:
        raise value
    return cast(T, value)


def _remove_dead_tasks(parent: Path) -> None:
    """The task folders of Ray workers on this host that were killed mid-task (their own
    cleanup never ran); a live worker's are left alone."""
    host = host_tag()
    with contextlib.suppress(OSError):
        for entry in os.listdir(parent):
            found = _TASK_FOLDER.match(entry)
            if found and found["host"] == host and not pid_alive(int(found["pid"]), int(found["start"])):
                shutil.rmtree(parent / entry, ignore_errors=True)


def child_main() -> None:
    """The child process of ``_isolated``: run the pickled call, pickle (ok, result or error)."""
    task, result, parent = sys.argv[1], sys.argv[2], int(sys.argv[3])
    die_with_parent(parent)
    fn, args = pickle.loads(Path(task).read_bytes())
    try:
        outcome: tuple[bool, Any] = (True, fn(*args))
    except DlindexError as e:
        outcome = (False, e)
    except Exception as e:  # any other failure: one line, and the task is not retried
        outcome = (False, DlindexError(f"{type(e).__name__}: {_line(e)}"))
    Path(result + ".tmp").write_bytes(pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL))
    os.replace(result + ".tmp", result)


def _as_dlindex_error(error: BaseException) -> DlindexError:
    """A DlindexError a task raised, as itself; any other Ray failure as one line."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, DlindexError):
        return cause
    if cause is not None:
        return DlindexError(f"a Ray task failed: {type(cause).__name__}: {_line(cause)}")
    return DlindexError(f"the Ray job failed: {type(error).__name__}: {_line(error)}")
