"""The `dlindex` command: a thin typer layer over the library."""

from __future__ import annotations

import os
import sys

import typer

from . import demo, log, mark, query, scan, stats

app = typer.Typer(
    name="dlindex",
    help="An SQLite catalog for deep-learning image datasets.",
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command()(scan.scan)
app.command()(stats.stats)
app.command()(demo.demo)
app.command()(query.query)
app.command()(mark.mark)
app.add_typer(log.app, name="log")


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        # `dlindex query | head`: the reader left; exit quietly like other Unix tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(141)
