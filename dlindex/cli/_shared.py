"""Options, consoles and error handling shared by every command."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer

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
QuietFlag = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar and no summary (errors and warnings still print).")]



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
    """Turn a DlindexError into one line on stderr and its exit code; bugs keep tracebacks."""

    @functools.wraps(fn)  # typer reads the signature through __wrapped__
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except DlindexError as e:
            typer.echo(f"Error: {e}", err=True)
            raise typer.Exit(e.exit_code) from None

    return wrapper


@contextmanager
def progress_bar(quiet: bool, **tqdm_options: Any) -> Iterator[Callable[[int], object]]:
    """An ``update(n)`` for tqdm's bar when stderr is a terminal; otherwise a no-op, and tqdm
    (~15 ms to import) is never loaded."""
    if quiet or not sys.stderr.isatty():
        yield lambda n: None
        return
    from tqdm import tqdm

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
    typer.Option("--no-log", envvar="DLINDEX_NO_LOG", help="Do not record this command's reads and writes in the query log."),
]


# The selection options of `dlindex query`, shared with `dlindex export` (same names, same meaning).
class Status(str, Enum):
    ok = "ok"
    corrupt = "corrupt"
    missing = "missing"


class ProcessingStatus(str, Enum):
    queued = "queued"
    completed = "completed"
    failed = "failed"


LabelOption = Annotated[list[str] | None, typer.Option("--label", "-l", help="Only this label (repeatable).", show_default=False)]
StatusOption = Annotated[list[Status] | None, typer.Option("--status", help="Only this status (repeatable). [default: ok]", show_default=False)]
ProcessedOption = Annotated[bool | None, typer.Option("--processed/--unprocessed", help="Only processed, or only unprocessed, samples.", show_default=False)]
ProcessingStatusOption = Annotated[list[ProcessingStatus] | None, typer.Option("--processing-status", help="Only this processing status (repeatable).", show_default=False)]
SinceOption = Annotated[str | None, typer.Option("--since", help="Created at or after WHEN: ISO date-time (UTC unless given) or a duration back from now: 30m, 24h, 7d.", metavar="WHEN", show_default=False)]
UntilOption = Annotated[str | None, typer.Option("--until", help="Created before WHEN (same forms as --since).", metavar="WHEN", show_default=False)]
MinWidthOption = Annotated[int | None, typer.Option("--min-width", min=0, help="Only images at least this wide.", show_default=False)]
MinHeightOption = Annotated[int | None, typer.Option("--min-height", min=0, help="Only images at least this tall.", show_default=False)]
PerLabelOption = Annotated[int | None, typer.Option("--per-label", min=1, help="Class balance: at most N random samples per label (deterministic for a --seed).", show_default=False)]


def selection(
    label: list[str] | None, status: list[Any] | None, processed: bool | None, processing_status: list[Any] | None,
    since: str | None, until: str | None, min_width: int | None, min_height: int | None, **more: Any,
) -> Any:
    """The QuerySpec of the shared selection options, as every selecting command builds it."""
    from ..query import QuerySpec  # on use: scan and stats never select

    return QuerySpec(
        labels=tuple(label or ()), status=tuple(s.value for s in status) if status else ("ok",),
        processed=processed, processing_status=tuple(s.value for s in processing_status or ()),
        since=since, until=until, min_width=min_width, min_height=min_height, **more,
    )  # fmt: skip
