"""The probe worker process: many reads in flight, then hashing and sniffing on one core.

On a cold cache a scan waits on the disk, which serves random reads far faster with
dozens in flight than one at a time; so each worker reads a batch with a small thread
pool (reads release the GIL), then inspects the bytes sequentially.
"""

from __future__ import annotations

import ctypes
import signal
import sqlite3
import warnings
from concurrent.futures import ThreadPoolExecutor

from PIL import Image

from .treediff import DiffOptions, LabelIds, UnitDiff, diff_unit
from .walk import Unit
from .cstderr import CStderrCapture
from .probe import NOT_CACHED, Probe, ProbeOptions, inspect_content, read_content

_state: dict[str, object] = {}


def init(options: ProbeOptions, io_threads: int, catalog_path: str | None = None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C means
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()
    keep_freed_memory()
    capture = CStderrCapture()
    capture.start()  # libtiff & co. write to fd 2; keep it off the user's terminal
    warnings.simplefilter("ignore")
    Image.MAX_IMAGE_PIXELS = options.max_pixels
    _state["options"] = options
    _state["capture"] = capture
    _state["io"] = ThreadPoolExecutor(io_threads) if io_threads > 1 else None
    _state["io_threads"] = io_threads
    _state["catalog_path"] = catalog_path
    _state["reader"] = None


def stderr_capture() -> CStderrCapture | None:
    """This worker's capture of what C libraries print (set by ``init``)."""
    return _state.get("capture")


def diff_task(root_id: int, units: list[Unit], options: DiffOptions) -> list[UnitDiff]:
    """Walk units and diff them against the catalog through this process's read-only connection;
    probe a unit's new and changed files right here when there are few enough."""
    reader = _state.get("reader")
    if reader is None:
        from .catalog import connect_readonly  # the one place that builds the read-only URI

        reader = connect_readonly(str(_state["catalog_path"]), timeout=30)
        _state["reader"] = reader
        _state["labels"] = LabelIds(reader)
    assert isinstance(reader, sqlite3.Connection)
    labels = _state["labels"]
    assert isinstance(labels, LabelIds)
    diffs = []
    for unit in units:
        diff = diff_unit(reader, root_id, unit, options, labels)
        if 0 < len(diff.to_probe) <= options.probe_inline:
            probes = probe_batch([(item.path, item.key) for item in diff.to_probe])
            diff.probed = list(zip(probes, diff.to_probe))
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
    options = _state["options"]
    capture = _state["capture"]
    io = _state["io"]
    assert isinstance(options, ProbeOptions) and isinstance(capture, CStderrCapture)
    results: list[Probe] = []
    for index, (path, key) in enumerate(batch):
        content = read_content(path, options.follow_symlinks, only_if_cached=io is not None)
        if content is NOT_CACHED:
            assert isinstance(io, ThreadPoolExecutor)
            rest = batch[index:]
            groups = _split([p for p, _ in rest], int(_state["io_threads"]))  # type: ignore[call-overload]
            follow = [options.follow_symlinks] * len(groups)
            contents = [c for group in io.map(_read_group, groups, follow) for c in group]
            results.extend(_inspect(p, k, c, options, capture) for (p, k), c in zip(rest, contents))
            break
        results.append(_inspect(path, key, content, options, capture))
    return results


def _inspect(path: bytes, key: str, content: object, options: ProbeOptions, capture: CStderrCapture) -> Probe:
    if isinstance(content, Probe):
        return content._replace(key=key)
    return inspect_content(path, key, content, options, capture)  # type: ignore[arg-type]


def _read_group(paths: list[bytes], follow_symlinks: bool) -> list[object]:
    return [read_content(path, follow_symlinks) for path in paths]


def _split(items: list[bytes], parts: int) -> list[list[bytes]]:
    size = max(1, -(-len(items) // parts))
    return [items[i : i + size] for i in range(0, len(items), size)]


def keep_freed_memory() -> None:
    """glibc: keep freed read buffers in the heap instead of returning them to the kernel.

    Every file's bytes are a fresh allocation; by default glibc hands large ones back
    (munmap, heap trim) and the next file page-faults them in again, ~15 faults a file,
    which doubled the probe's CPU time in measurements. Heap growth stays bounded by the
    largest batch in flight.
    """
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: files up to 32 MiB come from the heap
        libc.mallopt(-8, 2)  # M_ARENA_MAX: reader threads share arenas instead of making new ones
    except (OSError, AttributeError):
        pass


def _die_with_parent() -> None:
    """Linux: if the scan is killed with -9, its workers go too instead of lingering."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
