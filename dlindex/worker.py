"""The probe worker process: many reads in flight, then hashing and sniffing on one core.

On a cold cache a scan waits on the disk, which serves random reads far faster with
dozens in flight than one at a time; so each worker reads a batch with a small thread
pool (reads release the GIL), then inspects the bytes sequentially.
"""

from __future__ import annotations

import ctypes
import os
import signal
import warnings
from concurrent.futures import ThreadPoolExecutor

from PIL import Image

from .probe import CStderrCapture, Probe, ProbeOptions, inspect_content, read_content

_state: dict[str, object] = {}


def init(options: ProbeOptions, io_threads: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C means
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()
    capture = CStderrCapture()
    capture.start()  # libtiff & co. write to fd 2; keep it off the user's terminal
    warnings.simplefilter("ignore")
    Image.MAX_IMAGE_PIXELS = options.max_pixels
    _state["options"] = options
    _state["capture"] = capture
    _state["io"] = ThreadPoolExecutor(io_threads) if io_threads > 1 else None
    _state["io_threads"] = io_threads


def probe_batch(batch: list[tuple[bytes, str]]) -> list[Probe]:
    options = _state["options"]
    capture = _state["capture"]
    io = _state["io"]
    assert isinstance(options, ProbeOptions) and isinstance(capture, CStderrCapture)
    paths = [path for path, _ in batch]
    if isinstance(io, ThreadPoolExecutor) and len(batch) > 1:
        groups = _split(paths, int(_state["io_threads"]))  # type: ignore[call-overload]
        contents = [c for group in io.map(_read_group, groups, [options.follow_symlinks] * len(groups)) for c in group]
    else:
        contents = [read_content(path, options.follow_symlinks) for path in paths]
    results = []
    for (path, key), content in zip(batch, contents):
        if isinstance(content, Probe):
            results.append(content._replace(key=key))
        else:
            results.append(inspect_content(path, key, content, options, capture))
    return results


def _read_group(paths: list[bytes], follow_symlinks: bool) -> list[object]:
    return [read_content(path, follow_symlinks) for path in paths]


def _split(items: list[bytes], parts: int) -> list[list[bytes]]:
    size = max(1, -(-len(items) // parts))
    return [items[i : i + size] for i in range(0, len(items), size)]


def _die_with_parent() -> None:
    """Linux: if the scan is killed with -9, its workers go too instead of lingering."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
