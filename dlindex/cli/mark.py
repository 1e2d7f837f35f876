"""`dlindex mark`: set processed flags, processing states or exclusion from ids, paths or JSON lines."""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import Annotated, BinaryIO

import typer

from dlindex.catalog.connection import Catalog
from dlindex.cli._shared import (
    DbOption,
    JsonFlag,
    NoLogFlag,
    QuietFlag,
    WaitOption,
    handle_errors,
    print_json,
    stderr_console,
    stdout_console,
)
from dlindex.errors import ExitCode, InputError, UsageError
from dlindex.query.mark import MarkResult, mark_samples, read_records


class By(StrEnum):
    id = "id"
    path = "path"


@handle_errors
def mark(
    file: Annotated[
        str, typer.Argument(metavar="[FILE|-]", help="Ids, paths or JSON lines, one per line; - reads stdin.")
    ] = "-",
    processed: Annotated[
        bool | None,
        typer.Option("--processed/--unprocessed", help="Set the processed flag, or clear it.", show_default=False),
    ] = None,
    processing_status: Annotated[
        str | None,
        typer.Option(
            "--processing-status",
            metavar="queued|completed|failed|none",
            help="Set processing_status (none clears it); not scan's status.",
            show_default=False,
        ),
    ] = None,
    exclude: Annotated[
        bool | None,
        typer.Option(
            "--exclude/--include",
            help="Leave the samples out of query, export and the loader; or bring them back.",
            show_default=False,
        ),
    ] = None,
    old_status: Annotated[str | None, typer.Option("--status", hidden=True, show_default=False)] = None,
    error: Annotated[
        str | None,
        typer.Option(
            "--error", help="Also set the error text (e.g. with --processing-status failed).", show_default=False
        ),
    ] = None,
    by: Annotated[
        By,
        typer.Option("--by", help="What plain lines hold: sample ids, or paths (absolute, or relative to their root)."),
    ] = By.id,
    null: Annotated[
        bool, typer.Option("-0", "--null", help="Records end with NUL instead of newline (find -print0, query -0).")
    ] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 3 if any id or path is not in the catalog.")] = False,
    as_json: JsonFlag = False,
    quiet: QuietFlag = False,
    no_log: NoLogFlag = False,
    db: DbOption = None,
    wait: WaitOption = None,  # applied by the option itself to every catalog opened
) -> None:
    """Set processed flags, processing status or exclusion for samples read from a file or stdin.

    dlindex query --unprocessed --format jsonl | ./resize.py | dlindex mark --processed -
    """
    if old_status is not None:  # it set processing_status, while query --status selects scan's status
        raise UsageError(
            f"mark --status is now --processing-status {old_status}: it sets processing_status (queued, completed, "
            "failed), not the scan status (ok, corrupt, missing) that query --status selects; "
            "to leave samples out of training use mark --exclude"
        )
    if processed is None and processing_status is None and exclude is None:
        raise typer.BadParameter(
            "give --processed, --unprocessed, --processing-status, --exclude or --include", param_hint="'--processed'"
        )
    with Catalog(db, log=not no_log) as catalog, _open(file) as stream:
        result = mark_samples(
            catalog, read_records(stream, null=null), processed=processed, processing_status=processing_status,
            error=error, excluded=exclude, by=by.value,
        )  # fmt: skip
    if as_json:
        print_json(result.as_dict())
    elif not quiet:
        _print(result)
    if result.unknown:
        shown = ", ".join(result.unknown_examples)
        more = " ..." if result.unknown > len(result.unknown_examples) else ""
        stderr_console.print(f"{result.unknown} not in the catalog: {shown}{more}", markup=False, highlight=False)
        if strict:
            raise typer.Exit(ExitCode.PARTIAL)


def _open(file: str) -> BinaryIO:
    if file == "-":
        return _KeepOpen(sys.stdin.buffer)  # type: ignore[return-value]
    try:
        return open(file, "rb")
    except OSError as e:
        raise InputError(f"cannot read {file}: {e.strerror or e}") from None


class _KeepOpen:
    """stdin as a context manager that leaves it open."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream

    def __enter__(self) -> BinaryIO:
        return self.stream

    def __exit__(self, *exc: object) -> None:
        pass


def _print(r: MarkResult) -> None:
    rate = f", {r.inputs / r.seconds:,.0f}/s" if r.seconds > 0 else ""
    stdout_console.print(
        f"matched {r.matched:,}  updated {r.updated:,}  unknown {r.unknown:,}  ({r.seconds:.2f} s{rate})",
        markup=False, highlight=False,
    )  # fmt: skip
