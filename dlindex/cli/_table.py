"""Rows as a rich table, streamed: the first rows show at once, memory stays flat.

One rich Table holding every row would print nothing until the last row was read and keep
them all. Here rows go out in chunks, each a borderless table with the same fixed column
widths (taken from the first chunk and the terminal width), so the chunks line up as one.
Paths are shortened in the middle, keeping the root and the file name readable. Headers stay
readable at 80 columns: a column is never cut below its header's longest word (a header
wider than its column breaks at its underscores), and when those floors do not fit with
rich's padding, columns are set one space apart instead of three.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

FIRST_CHUNK = 50  # rows read before the first line is printed
CHUNK = 500
_PATH_COLUMNS = ("path", "file_path", "root")
_MIN_PATH = 12
_MIN_OTHER = 4
_MAX_HEADER_FLOOR = 12  # a column keeps this much of its header's longest word at least ("orientation": 11)
ELLIPSIS = "…"


@dataclass(frozen=True)
class TableResult:
    shown: int
    more: int  # rows past max_rows, counted without being kept


def stream_table(
    console: Any, rows: Iterable[dict[str, Any]], columns: Sequence[str], max_rows: int | None = None
) -> TableResult:
    """Print up to ``max_rows`` rows (all when None) on ``console``; count the rest."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    it: Iterator[dict[str, Any]] = iter(rows)
    cap = max_rows if max_rows is not None else -1

    def take(n: int) -> list[list[str]]:
        if cap >= 0:
            n = min(n, cap - shown)
        return [[_printable(v) for v in row.values()] for row in islice(it, max(n, 0))]

    shown = 0
    chunk = take(FIRST_CHUNK)
    headers = [str(c) for c in columns]
    shorten = [h in _PATH_COLUMNS for h in headers]
    gap = 3 if table_width(natural_widths(headers, chunk), 3) <= console.width else 1  # cut nothing if it can
    widths = fit_widths(headers, chunk, console.width, gap)
    header = True
    while True:
        widths = grow_widths(widths, chunk, shorten, console.width, gap)  # paths keep theirs
        table = Table(
            box=box.SIMPLE_HEAD, show_edge=False, show_header=header, pad_edge=True, highlight=False,
            padding=(0, 1) if gap == 3 else 0,
        )  # fmt: skip
        for name, width in zip(headers, widths, strict=False):
            table.add_column(wrap_header(name, width), width=width, no_wrap=True, overflow="ellipsis")
        for cells in chunk:
            table.add_row(
                *(Text(shorten_middle(c, w) if s else c) for c, w, s in zip(cells, widths, shorten, strict=False))
            )
        if chunk or header:
            console.print(table)
        shown += len(chunk)
        header = False
        if not chunk or shown == cap:
            break
        chunk = take(CHUNK)
    more = sum(1 for _ in it) if cap >= 0 else 0
    return TableResult(shown, more)


def header_floor(header: str) -> int:
    """The narrowest a column may get: its header's longest word (at most 12), 12 for a path."""
    if header in _PATH_COLUMNS:
        return _MIN_PATH
    return max(_MIN_OTHER, min(_MAX_HEADER_FLOOR, max(len(w) for w in _words(header))))


def _words(header: str) -> list[str]:
    """``processing_status`` as ``processing``, ``_status``: where a header may break."""
    first, *rest = header.split("_")
    return [first, *("_" + w for w in rest)]


def wrap_header(header: str, width: int) -> str:
    """A header in lines of at most ``width`` cells, broken before its underscores."""
    if len(header) <= width:
        return header
    lines = [""]
    for word in _words(header):
        if lines[-1] and len(lines[-1]) + len(word) > width:
            lines.append("")
        lines[-1] += word
    return "\n".join(lines)


def fit_widths(headers: Sequence[str], chunk: Sequence[Sequence[str]], total: int, gap: int = 3) -> list[int]:
    """Column widths that fit ``total`` terminal cells with ``gap`` cells between columns: each
    column's widest cell; if that is too wide, headers wider than their values are wrapped
    first, then paths cut down to a third of the width, then the widest other columns (never
    below their header's longest word), then paths again."""
    values = [_natural(chunk, i) for i in range(len(headers))]
    widths = natural_widths(headers, chunk)
    excess = table_width(widths, gap) - total
    path = [h in _PATH_COLUMNS for h in headers]
    others = [i for i in range(len(widths)) if not path[i]]
    paths = [i for i in range(len(widths)) if path[i]]
    floors = [header_floor(h) for h in headers]
    for i in others:  # "processing_status" over values like "queued"
        excess -= _cut(widths, [i], max(values[i], floors[i]), excess)
    excess -= _cut(widths, paths, max(_MIN_PATH, total // 3), excess)
    excess -= _cut_to_floors(widths, others, floors, excess)
    _cut(widths, paths, _MIN_PATH, excess)
    return widths


def natural_widths(headers: Sequence[str], chunk: Sequence[Sequence[str]]) -> list[int]:
    """Each column's header or widest cell, a digit more for a column of numbers (id 100
    after 99 keeps the chunks aligned)."""
    widths = []
    for i, h in enumerate(headers):
        v = _natural(chunk, i)
        digits = v >= len(h) and len(chunk) > 1 and all(cells[i].isdigit() for cells in chunk)
        widths.append(max(len(h), v) + digits)
    return widths


def grow_widths(
    widths: list[int], chunk: Sequence[Sequence[str]], shorten: Sequence[bool], total: int, gap: int = 3
) -> list[int]:
    """Widen the non-path columns a later chunk needs wider, as far as the terminal allows."""
    widths = list(widths)
    for i, s in enumerate(shorten):
        need = _natural(chunk, i) - widths[i]
        slack = total - table_width(widths, gap)
        if not s and need > 0 and slack > 0:
            widths[i] += min(need, slack)
    return widths


def table_width(widths: Sequence[int], gap: int = 3) -> int:
    """Cells a row takes: with gap 3, a cell of padding on each side and one between columns
    (the outer two are blank); with gap 1, only the one between columns."""
    return sum(widths) + 3 * len(widths) - 1 if gap == 3 else sum(widths) + len(widths) - 1


def _cut(widths: list[int], columns: Sequence[int], floor: int, excess: int) -> int:
    """Narrow the widest of ``columns`` one cell at a time (never below ``floor``); return the cut."""
    cut = 0
    while cut < excess:
        wide = [i for i in columns if widths[i] > floor]
        if not wide:
            break
        widest = max(wide, key=lambda i: widths[i])
        widths[widest] -= 1
        cut += 1
    return cut


def _cut_to_floors(widths: list[int], columns: Sequence[int], floors: Sequence[int], excess: int) -> int:
    """Narrow the widest of ``columns`` one cell at a time, each down to its own floor; return the cut."""
    cut = 0
    while cut < excess:
        wide = [i for i in columns if widths[i] > floors[i]]
        if not wide:
            break
        widths[max(wide, key=lambda i: widths[i])] -= 1
        cut += 1
    return cut


def shorten_middle(text: str, width: int) -> str:
    """``/data/train/n01440764/img_0001.png`` as ``/data/tr…/img_0001.png`` in ``width`` cells."""
    if len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    keep = width - 1
    head = max(keep // 3, 1)
    tail = text[len(text) - (keep - head) :]
    slash = tail.find("/")
    if 0 < slash <= len(tail) // 2:  # start the tail at a folder boundary (the head stays as
        tail = tail[slash:]  # long on every row, so the shortened paths of a column line up)
    return text[:head] + ELLIPSIS + tail


def _natural(chunk: Sequence[Sequence[str]], i: int) -> int:
    return max((len(cells[i]) for cells in chunk), default=0)


def _printable(value: Any) -> str:
    """A cell's text: control characters (an ESC in a file name) and the surrogate escapes of
    non-UTF-8 names are shown as escapes, never sent to the terminal."""
    text = "" if value is None else str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
