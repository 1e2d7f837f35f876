"""`dlindex log show|import|clear`: the query log that `dlindex index` learns from."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from dlindex.catalog.connection import Catalog
from dlindex.cli._shared import (
    DbOption,
    JsonFlag,
    QuietFlag,
    WaitOption,
    handle_errors,
    print_json,
    stderr_console,
    stdout_console,
)
from dlindex.querylog.importer import LineSource, file_lines, spooled_lines
from dlindex.querylog.views import LogSummary, clear_log, import_log, log_summary

app = typer.Typer(
    name="log",
    help="Show, import and clear the query log (the evidence for index advice).",
    no_args_is_help=True,
)


@app.command("show")
@handle_errors
def show(
    top: Annotated[int, typer.Option("--top", min=1, help="How many fingerprints to list.")] = 10,
    as_json: JsonFlag = False,
    db: DbOption = None,
) -> None:
    """Fingerprints ranked by total time: calls, mean and p95 ms, rows, plan.

    dlindex log show --top 5 --json | jq '.fingerprints[].sql'
    """
    with Catalog(db, log=False) as catalog:
        summary = log_summary(catalog, top=top)
    if as_json:
        print_json(summary.as_dict())
    else:
        _print(summary)


@app.command("import")
@handle_errors
def import_(
    file: Annotated[
        str, typer.Argument(metavar="FILE", help="SQL statements, one per line or ;-separated; - reads stdin.")
    ],
    as_json: JsonFlag = False,
    quiet: QuietFlag = False,
    db: DbOption = None,
    wait: WaitOption = None,  # applied by the option itself to every catalog opened
) -> None:
    """Store SQL captured elsewhere (sqlite3 .trace, set_trace_callback) in the log; never run it.

    python train.py 2> trace.sql && dlindex log import trace.sql
    """
    text = _read(file)
    with Catalog(db, log=False) as catalog:
        summary = import_log(catalog, text)
    if as_json:
        print_json(summary.as_dict())
    elif not quiet:
        stdout_console.print(f"imported {summary.imported:,} statements, skipped {summary.skipped:,}", markup=False)
    for line, reason in summary.skipped_lines:
        stderr_console.print(f"line {line}: skipped: {reason}", markup=False, highlight=False)


@app.command("clear")
@handle_errors
def clear(
    as_json: JsonFlag = False,
    db: DbOption = None,
    wait: WaitOption = None,  # applied by the option itself to every catalog opened
) -> None:
    """Delete every entry of the query log.

    dlindex log clear && dlindex query --per-label 8 > /dev/null && dlindex log show
    """
    with Catalog(db, log=False) as catalog:
        removed = clear_log(catalog)
    if as_json:
        print_json({"removed": removed})
    else:
        stdout_console.print(f"removed {removed:,} log entries", markup=False)


def _read(file: str) -> LineSource:
    return spooled_lines(sys.stdin.buffer) if file == "-" else file_lines(file)


def _print(summary: LogSummary) -> None:
    if not summary.fingerprints:
        stdout_console.print("the query log is empty", markup=False)
        return
    wide = stdout_console.width >= 130  # else the statements follow the table, one a line
    table = Table()
    for name in ("fingerprint", "kind", "calls", "total ms", "mean ms", "p95 ms", "rows", "plan"):
        table.add_column(name, no_wrap=True, justify="left" if name in ("fingerprint", "kind", "plan") else "right")
    width = stdout_console.width - 100
    if wide:
        table.add_column("sql", no_wrap=True, overflow="ellipsis", max_width=width)
    for f in summary.fingerprints:
        cells = [
            f.fingerprint, f.kind, f"{f.calls:,}" + (f" ({f.cached:,} cached)" if f.cached else ""),
            f"{f.total_ms:,.1f}", _ms(f.mean_ms), _ms(f.p95_ms), f"{f.rows:,}", f.plan,
        ]  # fmt: skip
        table.add_row(*cells, *([Text(_shorten(" ".join(f.sql.split()), width))] if wide else []))
    stdout_console.print(table)
    if not wide:
        for f in summary.fingerprints:
            line = f"{f.fingerprint}  {' '.join(f.sql.split())}"
            stdout_console.print(_shorten(line, stdout_console.width), markup=False, highlight=False)
    stdout_console.print(f"{summary.entries:,} log entries", markup=False)


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"
