"""Row writers for commands that print rows: table, jsonl, csv, tsv, paths. Each streams."""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import StrEnum
from itertools import chain
from typing import Annotated, Any, TextIO

import typer

from dlindex.cli._shared import stderr_console, stdout_console

ELLIPSIS = "…"
_BATCH = 512  # jsonl lines joined per write


class OutputFormat(StrEnum):
    table = "table"
    jsonl = "jsonl"
    csv = "csv"
    tsv = "tsv"
    paths = "paths"


FormatOption = Annotated[
    OutputFormat | None,
    typer.Option(
        "--format",
        "-f",
        help="Output format: table, jsonl, csv, tsv or paths (one absolute path per line).",
        show_default="table at a terminal, jsonl otherwise",
    ),
]
NullFlag = Annotated[
    bool, typer.Option("-0", "--null", help="With --format paths: end each path with NUL, not newline.")
]


def at_terminal() -> bool:
    return bool(stdout_console.is_terminal)


def resolve_format(fmt: OutputFormat | None) -> OutputFormat:
    return fmt or (OutputFormat.table if at_terminal() else OutputFormat.jsonl)


def emit_rows(
    rows: Iterable[dict[str, Any]],
    fmt: OutputFormat,
    columns: Sequence[str],
    null: bool = False,
    max_rows: int | None = None,
) -> int:
    """Write rows to stdout in ``fmt``; return how many were written.

    A table stops after ``max_rows`` rows and says on stderr how many more there were (the
    rest are counted, not kept). A reader that goes away (`| head`) ends the command quietly
    with 141, like other Unix tools under `set -o pipefail` (click's own handling would say 1).
    """
    try:
        return _emit(rows, fmt, columns, null, max_rows)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail too
        raise SystemExit(141) from None


def _emit(
    rows: Iterable[dict[str, Any]], fmt: OutputFormat, columns: Sequence[str], null: bool, max_rows: int | None
) -> int:
    if fmt is OutputFormat.paths:
        return _paths(rows, b"\0" if null else b"\n")
    if fmt is not OutputFormat.jsonl:
        rows = _projected(rows, columns)
    if fmt is OutputFormat.table:
        return _table(rows, columns, max_rows)
    # File names that are not UTF-8 come back from the library as surrogate escapes: written
    # as their original bytes in csv/tsv, as \udcXX escapes in JSON (valid JSON either way).
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="surrogateescape")
    return WRITERS[fmt](rows, sys.stdout, columns)


def _projected(rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> Iterator[dict[str, Any]]:
    """The rows as the columns name them, for the writers that take a row's values in order
    (a table, csv, tsv): as they are where the first row's keys are the columns (a command's
    rows all have one shape), else each cut to the columns (jsonl keeps every key)."""
    it = iter(rows)
    first = next(it, None)
    if first is None:
        return
    if list(first) == list(columns):
        yield first
        yield from it
        return
    for row in chain((first,), it):
        yield {column: row.get(column) for column in columns}


def _jsonl(rows: Iterable[dict[str, Any]], out: TextIO, columns: Sequence[str]) -> int:
    n = 0
    write = out.write
    dumps = _json_line()
    batch: list[str] = []
    keep = batch.append
    for row in rows:
        line = dumps(row)
        if not line.isascii():  # the rare line to check: a lone surrogate cannot be UTF-8
            try:
                line.encode("utf-8")
            except UnicodeEncodeError:
                line = json.dumps(row, ensure_ascii=True, default=str)
        keep(line)
        n += 1
        if len(batch) == _BATCH:
            write("\n".join(batch) + "\n")  # one write call for many lines
            batch.clear()
    if batch:
        write("\n".join(batch) + "\n")
    out.flush()
    return n


def _json_line() -> Callable[[dict[str, Any]], str]:
    """``json.JSONEncoder(ensure_ascii=False, default=str).encode``, the same text, with the C
    encoder made once instead of once a row (as ``encode`` does; a third of its time)."""
    encoder = json.JSONEncoder(ensure_ascii=False, default=str)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # an interpreter without the C accelerator
        return encoder.encode
    chunks = make(None, str, json.encoder.encode_basestring, None, ": ", ", ", False, False, True)
    join = "".join
    return lambda row: join(chunks(row, 0))


def _delimited(delimiter: str) -> Callable[[Iterable[dict[str, Any]], TextIO, Sequence[str]], int]:
    def write(rows: Iterable[dict[str, Any]], out: TextIO, columns: Sequence[str]) -> int:
        writer = csv.writer(out, delimiter=delimiter, lineterminator="\n")
        writer.writerow(columns)
        n = 0
        for row in rows:
            writer.writerow(["" if v is None else v for v in row.values()])
            n += 1
        out.flush()
        return n

    return write


def _paths(rows: Iterable[dict[str, Any]], end: bytes) -> int:
    out = sys.stdout.buffer
    n = 0
    for row in rows:
        path = row.get("path")
        if path is not None:
            out.write(os.fsencode(path) + end)  # the exact file name, whatever its encoding
            n += 1
    out.flush()
    return n


def _table(rows: Iterable[dict[str, Any]], columns: Sequence[str], max_rows: int | None) -> int:
    from dlindex.cli._table import stream_table

    result = stream_table(stdout_console, rows, columns, max_rows)
    if result.more:
        stderr_console.print(
            f"{ELLIPSIS} {result.more:,} more row{'s' if result.more != 1 else ''}; "
            "use --all or --limit N to print them, or --format jsonl",
            markup=False, highlight=False,
        )  # fmt: skip
    return result.shown


WRITERS: dict[OutputFormat, Callable[[Iterable[dict[str, Any]], TextIO, Sequence[str]], int]] = {
    OutputFormat.jsonl: _jsonl,
    OutputFormat.csv: _delimited(","),
    OutputFormat.tsv: _delimited("\t"),
}
