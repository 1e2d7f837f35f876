"""Rows as a rich table, streamed: the first rows show at once, memory stays flat.

One rich Table holding every row would print nothing until the last row was read and keep
them all. Here rows go out in chunks, each a borderless table with the same fixed column
widths (taken from the first chunk and the terminal width), so the chunks line up as one.
Paths are shortened in the middle, keeping the root and the file name readable.
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
    widths = fit_widths(headers, chunk, console.width)
    header = True
    while True:
        widths = grow_widths(widths, chunk, shorten, console.width)  # paths keep theirs
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, show_header=header, pad_edge=True, highlight=False)
        for name, width in zip(headers, widths, strict=False):
            table.add_column(name, width=width, no_wrap=True, overflow="ellipsis")
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


def fit_widths(headers: Sequence[str], chunk: Sequence[Sequence[str]], total: int) -> list[int]:
    """Column widths that fit ``total`` terminal cells: each column's widest cell; if that is
    too wide, headers wider than their values are cut first, then paths down to a third of
    the width, then the widest other columns, then paths again."""
    values = [_natural(chunk, i) for i in range(len(headers))]
    widths = [max(len(h), v) for h, v in zip(headers, values, strict=False)]
    for i, v in enumerate(values):
        if v and v == widths[i] and len(chunk) > 1 and all(cells[i].isdigit() for cells in chunk):
            widths[i] += 1  # room for one more digit (id 100 after 99) keeps the chunks aligned
    excess = table_width(widths) - total
    path = [h in _PATH_COLUMNS for h in headers]
    others = [i for i in range(len(widths)) if not path[i]]
    paths = [i for i in range(len(widths)) if path[i]]
    for i in others:  # "processing_status" over values like "queued"
        excess -= _cut(widths, [i], max(values[i], _MIN_OTHER), excess)
    excess -= _cut(widths, paths, max(_MIN_PATH, total // 3), excess)
    excess -= _cut(widths, others, _MIN_OTHER, excess)
    _cut(widths, paths, _MIN_PATH, excess)
    return widths


def grow_widths(widths: list[int], chunk: Sequence[Sequence[str]], shorten: Sequence[bool], total: int) -> list[int]:
    """Widen the non-path columns a later chunk needs wider, as far as the terminal allows."""
    widths = list(widths)
    for i, s in enumerate(shorten):
        need = _natural(chunk, i) - widths[i]
        slack = total - table_width(widths)
        if not s and need > 0 and slack > 0:
            widths[i] += min(need, slack)
    return widths


def table_width(widths: Sequence[int]) -> int:
    return sum(widths) + 3 * len(widths) - 1  # a cell of padding on each side, one between columns


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
