"""An export's rows routed to their (split, rank) groups in one pass, in bounded memory.

The rows come from the catalog once, in the query's order (by id, or the seeded ``--shuffle``
order SQLite sorts with its own external merge sort). Each row goes to its split (by content
hash) and, by its place in that split, to a rank, exactly as a list per split cut with
``members[rank::world_size]`` would; the first ``world_size`` rows of each split stay in
memory, being all that ``--pad`` repeats. The rows wait in one buffer per group; once the
buffers together hold the memory budget's worth of rows, each is written in chunks of
``CHUNK_ROWS`` (``marshal``) to a spill file and their places noted; a group's rows are later
read back chunk by chunk, then what its buffer held at the end. An export that fits in the
budget never touches the disk.

The spill file is made with ``tempfile.TemporaryFile`` inside the export's temporary folder:
on Linux it has no name at all (``O_TMPFILE``), elsewhere on POSIX it is unlinked at once, so
no exit (an error, Ctrl-C, kill -9) can leave it behind; its space is freed when it is closed.
"""

from __future__ import annotations

import array
import marshal
import os
import tempfile
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from dlindex.exported import ExportError

ENV_BUDGET = "DLINDEX_MEMORY_BUDGET"
DEFAULT_BUDGET = 256 << 20
ROW_BYTES = 640  # what a buffered row tuple costs in Python objects, measured on catalog rows
MIN_GROUP_ROWS = 8  # rows a group's chunk needs at least when it spills: smaller ones are mostly seeks
CHUNK_ROWS = 1 << 16  # rows per chunk in the file: one read back stays small


def budget_rows(budget: int, groups: int, held: int) -> int:
    """How many rows the buffers may hold together under ``budget`` bytes, with ``held`` rows
    (--pad's repeats) kept besides; ExportError (one line, before a row is read) when those
    alone do not fit."""
    if budget <= held * ROW_BYTES:
        raise ExportError(_too_small(budget, groups, held))
    return max(1, (budget - held * ROW_BYTES) // ROW_BYTES)


def _too_small(budget: int, groups: int, held: int) -> str:
    need = (groups * MIN_GROUP_ROWS + held) * ROW_BYTES
    return (
        f"memory budget {_human(budget)} is too small for this export: its {groups} (split, rank) group(s) "
        f"need at least {_human(need)}; give a larger --memory-budget (or DLINDEX_MEMORY_BUDGET) "
        "or fewer --world-size ranks"
    )


class Spill:
    """The chunks of every group written so far, and the buffers not yet written."""

    def __init__(self, folder: Path, groups: int, limit: int, held: int = 0, budget: int = 0) -> None:
        self.folder = folder
        self.limit = limit
        self.budget = (budget, held)  # for the message when spilling is needed but cannot be done
        self.buffers: list[list[tuple[Any, ...]]] = [[] for _ in range(groups)]
        self.held = 0
        self.file: IO[bytes] | None = None
        self.size = 0
        # per group: the offsets and lengths of its chunks in the file, in order
        self.offsets = [array.array("q") for _ in range(groups)]
        self.lengths = [array.array("q") for _ in range(groups)]

    def flush(self) -> None:
        """Write every non-empty buffer to the file as chunks of its group; empty the buffers."""
        if self.file is None:
            if self.limit < len(self.buffers) * MIN_GROUP_ROWS:  # chunks this small: mostly seeks
                raise ExportError(_too_small(self.budget[0], len(self.buffers), self.budget[1]))
            self.file = tempfile.TemporaryFile(dir=self.folder, prefix=".spill-")  # noqa: SIM115 (kept open)
            weakref.finalize(self, self.file.close)  # closed (its space freed) with the plan
        for k, buffer in enumerate(self.buffers):
            if not buffer:
                continue
            for start in range(0, len(buffer), CHUNK_ROWS):  # a chunk read back stays small
                blob = marshal.dumps(buffer[start : start + CHUNK_ROWS])
                try:
                    self.file.write(blob)
                except OSError as e:  # a full disk: name the export's temporary folder, not the catalog
                    raise OSError(e.errno, e.strerror, os.fspath(self.folder)) from None
                self.offsets[k].append(self.size)
                self.lengths[k].append(len(blob))
                self.size += len(blob)
            self.buffers[k] = []
        self.held = 0

    def finish(self) -> None:
        """After the last row: what the buffers hold stays there, each group's last rows."""
        if self.file is not None:
            self.file.flush()

    def rows(self, group: int, count: int, tail: Sequence[tuple[Any, ...]] = ()) -> Collection[tuple[Any, ...]]:
        """The group's first ``count`` rows then ``tail``: a list while nothing was spilled,
        else rows read back from the file whenever they are iterated."""
        if self.file is None:
            buffer = self.buffers[group]
            return [*buffer[:count], *tail] if count < len(buffer) or tail else buffer
        return SpilledRows(self, group, count, tuple(tail))


class SpilledRows(Collection[tuple[Any, ...]]):
    """One group's rows in the spill file: sized, iterable any number of times, in order."""

    def __init__(self, spill: Spill, group: int, count: int, tail: tuple[tuple[Any, ...], ...]) -> None:
        self.spill, self.group, self.count, self.tail = spill, group, count, tail

    def __len__(self) -> int:
        return self.count + len(self.tail)

    def __contains__(self, row: object) -> bool:
        return any(row == mine for mine in self)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        left = self.count
        file = self.spill.file
        assert file is not None
        fd = file.fileno()
        for offset, length in zip(self.spill.offsets[self.group], self.spill.lengths[self.group], strict=True):
            if left <= 0:
                break
            chunk = marshal.loads(_pread(fd, length, offset))
            if len(chunk) > left:
                chunk = chunk[:left]
            left -= len(chunk)
            yield from chunk
        if left > 0:
            yield from self.spill.buffers[self.group][:left]
        yield from self.tail


def _pread(fd: int, length: int, offset: int) -> bytes:
    parts = []
    while length:
        data = os.pread(fd, length, offset)
        if not data:
            raise OSError(f"the export's spill file ended early (at byte {offset})")
        parts.append(data)
        length -= len(data)
        offset += len(data)
    return b"".join(parts)


def route(
    parts: Iterable[tuple[str | Callable[[tuple[Any, ...]], str], Iterable[tuple[Any, ...]]]],
    names: Sequence[str],
    world_size: int,
    spill: Spill,
    cut: int | None = None,
) -> tuple[dict[str, int], dict[str, list[tuple[Any, ...]]]]:
    """Send each row of each (split, rows) part (split: a name, or a function of the row) to
    group ``split_index * world_size + position % world_size``; returns the rows per split and
    each split's first ``world_size`` rows (--pad's repeats). ``cut``: keep only a row's first
    ``cut`` values once its split is known."""
    counts = dict.fromkeys(names, 0)
    heads: dict[str, list[tuple[Any, ...]]] = {name: [] for name in names}
    base = {name: k * world_size for k, name in enumerate(names)}
    buffers, limit = spill.buffers, spill.limit
    held = spill.held
    for split, rows in parts:
        assign = split if callable(split) else None
        name = split if isinstance(split, str) else ""
        for row in rows:
            if assign is not None:
                name = assign(row)
                if cut is not None:
                    row = row[:cut]
            position = counts[name]
            counts[name] = position + 1
            if position < world_size and world_size > 1:
                heads[name].append(row)
            buffers[base[name] + position % world_size].append(row)
            held += 1
            if held >= limit:
                spill.flush()
                held = 0
    spill.held = held
    spill.finish()
    return counts, heads


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
