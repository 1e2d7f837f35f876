"""Options, consoles and error handling shared by every command."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console

from ..errors import DlindexError

P = ParamSpec("P")
R = TypeVar("R")

DbOption = Annotated[
    Path | None,
    typer.Option(
        "--db",
        envvar="DLINDEX_DB",
        help="Catalog database file (default: ./dlindex.db).",
        show_default=False,
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print the result as one JSON object on stdout.")]
QuietFlag = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or summary on stderr.")]

stdout_console = Console(highlight=False)
stderr_console = Console(stderr=True, highlight=False)


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn a DlindexError into one line on stderr and its exit code; bugs keep tracebacks."""

    @functools.wraps(fn)  # typer reads the signature through __wrapped__
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except DlindexError as e:
            typer.echo(f"Error: {e}", err=True)
            raise typer.Exit(e.exit_code) from None

    return wrapper


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, ensure_ascii=False, default=str) + "\n")


def human_bytes(n: int | float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


NoLogFlag = Annotated[
    bool,
    typer.Option("--no-log", envvar="DLINDEX_NO_LOG", help="Do not record this command's reads and writes in the query log."),
]
