"""Options, consoles and error handling shared by every command."""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar

import typer

from dlindex.errors import DlindexError, DlindexWarning

if TYPE_CHECKING:
    from dlindex.engines.parts import Part

P = ParamSpec("P")
R = TypeVar("R")

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="DLINDEX_DB",
        help="Catalog: a file, or a postgresql:// URL (a server catalog; see dlindex postgres --help).",
        show_default="./dlindex.db",
    ),
]
AtOption = Annotated[
    str | None,
    typer.Option(
        "--at",
        help="Read the catalog as it stood at this version, tag or export folder (dlindex versions lists them).",
        show_default=False,
    ),
]
PartOption = Annotated[
    str | None,
    typer.Option(
        "--part",
        metavar="I/N",
        help="Do part I of N (I from 0) of the work, for N machines; join the parts with dlindex merge.",
        show_default=False,
    ),
]
# --shard was --part's name before a shard came to mean only an export's file (#33): still read, hidden.
OldShardOption = Annotated[str | None, typer.Option("--shard", metavar="I/N", hidden=True, show_default=False)]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print the result as one JSON object on stdout.")]
QuietFlag = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress bar and no summary (errors and warnings still print).")
]


def _set_wait(seconds: float | None) -> float | None:
    from dlindex.catalog.sqlite.connect import set_default_wait  # catalogs opened by this command wait this long

    set_default_wait(seconds)
    return seconds


# Every write command takes it; the callback applies it to every catalog the command opens.
WaitOption = Annotated[
    float | None,
    typer.Option(
        "--wait", envvar="DLINDEX_WAIT", min=0, metavar="SECONDS", callback=_set_wait, show_default="30",
        help="Wait up to SECONDS for another process's write lock on the catalog.",
    ),
]  # fmt: skip


class Engine(StrEnum):
    local = "local"
    ray = "ray"


EngineOption = Annotated[
    Engine,
    typer.Option(
        "--engine", envvar="DLINDEX_ENGINE",
        help="Where the work runs: local worker processes, or a Ray cluster (needs the ray extra).",
    ),
]  # fmt: skip
AddressOption = Annotated[
    str | None,
    typer.Option(
        "--address", metavar="HOST:PORT", show_default="$RAY_ADDRESS, else a local cluster",
        help="The Ray cluster's head, for --engine ray.",
    ),
]  # fmt: skip


RayTasksOption = Annotated[
    int,
    typer.Option(
        "--ray-tasks", min=0, metavar="N",
        help="With --engine ray: the number of parts, one Ray task each; 0 means one per CPU of the cluster.",
    ),
]  # fmt: skip


class _LazyConsole:
    """A rich Console made on first use: importing rich costs ~35 ms of every start-up, and
    `scan --json` or `similar --format jsonl` never print through it."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
            if not self._console.is_terminal:
                self._console.soft_wrap = True  # a pipe or file gets whole lines, not 80 columns
        return getattr(self._console, name)


stdout_console: Any = _LazyConsole(highlight=False)
stderr_console: Any = _LazyConsole(stderr=True, highlight=False)


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn a DlindexError into one line on stderr and its exit code; bugs keep tracebacks.

    A full disk, a damaged or read-only catalog or a held lock, wherever it surfaces as an
    sqlite3 or OS error, becomes its DlindexError here (dlindex.faults), so every command
    reports it the same way; any other sqlite3 or OS error is a bug and keeps its traceback.
    A DlindexWarning is one ``warning:`` line, once per command.
    """

    @functools.wraps(fn)  # typer reads the signature through __wrapped__
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        from dlindex import faults

        with warnings.catch_warnings():
            warnings.simplefilter("default", DlindexWarning)
            shown: set[str] = set()
            previous = warnings.showwarning

            def show(message: Warning | str, category: type[Warning], *rest: Any, **more: Any) -> None:
                if not issubclass(category, DlindexWarning):
                    previous(message, category, *rest, **more)
                elif str(message) not in shown:
                    shown.add(str(message))
                    typer.echo(f"warning: {message}", err=True)

            warnings.showwarning = show
            try:
                return fn(*args, **kwargs)
            except DlindexError as e:
                typer.echo(f"Error: {e}", err=True)
                raise typer.Exit(e.exit_code) from None
            except (sqlite3.Error, OSError) as e:
                if isinstance(e, BrokenPipeError):
                    raise
                error = faults.translate_error(e, catalog=_catalog_arg(kwargs), paths=_path_args(kwargs))
                if error is None:
                    raise
                typer.echo(f"Error: {error}", err=True)
                raise typer.Exit(error.exit_code) from None
            finally:
                from dlindex.catalog.sqlite.connect import set_default_wait

                set_default_wait(None, write_command=False)  # what --wait set lasts one command

    return wrapper


def _catalog_arg(kwargs: dict[str, Any]) -> str:
    db = kwargs.get("db")
    return os.fspath(db) if db is not None else os.environ.get("DLINDEX_DB", "dlindex.db")


def _path_args(kwargs: dict[str, Any]) -> list[str]:
    """The command's file and folder arguments: where a full disk may be (an export folder)."""
    return [os.fspath(v) for k, v in kwargs.items() if k != "db" and isinstance(v, Path)]


@contextmanager
def progress_bar(quiet: bool, **tqdm_options: Any) -> Iterator[Callable[[int], None]]:
    """An ``update(n)`` for tqdm's bar when stderr is a terminal; otherwise a no-op, and tqdm
    (~15 ms to import) is never loaded."""
    if quiet or not sys.stderr.isatty():
        yield lambda n: None
        return
    from tqdm import tqdm  # type: ignore[import-untyped]  # tqdm ships no type information

    with tqdm(**tqdm_options) as bar:
        yield bar.update


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
    typer.Option(
        "--no-log", envvar="DLINDEX_NO_LOG", help="Do not record this command's reads and writes in the query log."
    ),
]


def part_option(part: str | None, shard: str | None) -> Part | None:
    """The ``--part I/N`` given, or the same by its deprecated name ``--shard`` (one warning line)."""
    from dlindex.engines.parts import parse_part

    if shard is not None:
        if part is not None:
            raise typer.BadParameter("give --part alone (--shard is its deprecated name)", param_hint="'--shard'")
        deprecated = "--shard I/N is deprecated: write --part I/N (a shard is a file an export writes)"
        warnings.warn(deprecated, DlindexWarning, stacklevel=2)
        part = shard
    return parse_part(part)
