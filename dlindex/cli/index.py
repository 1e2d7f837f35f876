"""`dlindex index`: indexes the query log proves worth it, applied, listed or undone."""

from __future__ import annotations

import sys
from contextlib import nullcontext
from typing import Annotated

import typer

from dlindex.catalog.connection import Catalog
from dlindex.cli._shared import DbOption, JsonFlag, WaitOption, handle_errors, print_json, stderr_console
from dlindex.querylog.importer import LineSource, file_lines, spooled_lines


@handle_errors
def index(
    suggest: Annotated[
        bool, typer.Option("--suggest", help="Propose indexes, verified on a scratch copy (the default).")
    ] = False,
    apply: Annotated[
        bool,
        typer.Option(
            "--apply",
            help="Create what --suggest printed for this state (else the advice computed now) and run ANALYZE, in one transaction.",
        ),
    ] = False,
    drop_unused: Annotated[
        bool,
        typer.Option(
            "--drop-unused",
            help="Drop indexes dlindex created that the logged workload does not use or that make it slower.",
        ),
    ] = False,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes", "-y", help="Do not ask before --drop-unused drops (required when stdin is not a terminal)."
        ),
    ] = False,
    revert: Annotated[bool, typer.Option("--revert", help="Undo the latest --apply / --drop-unused run.")] = False,
    list_: Annotated[
        bool, typer.Option("--list", help="List every index with how often logged statements used it.")
    ] = False,
    log: Annotated[
        list[str] | None,
        typer.Option(
            "--log",
            metavar="FILE",
            help="Also read SQL captured elsewhere (as `dlindex log import` reads it; never run); - is stdin. Repeatable.",
            show_default=False,
        ),
    ] = None,
    top: Annotated[
        int, typer.Option("--top", min=1, max=1000, help="How many of the heaviest read statements may earn an index.")
    ] = 10,
    time_limit: Annotated[
        float,
        typer.Option(
            "--time-limit",
            min=0.01,
            max=3600,
            metavar="SECONDS",
            help="Stop replaying a logged statement after this long; it is reported as skipped.",
        ),
    ] = 10.0,
    memory_limit: Annotated[
        int,
        typer.Option(
            "--memory-limit",
            min=16,
            max=1 << 20,
            metavar="MIB",
            help="SQLite heap limit while replaying; a statement needing more is reported as skipped.",
        ),
    ] = 512,
    as_json: JsonFlag = False,
    db: DbOption = None,
    wait: WaitOption = None,  # applied by the option itself to every catalog opened
) -> None:
    """Suggest, verify and apply indexes from the query log; list, drop unused, revert.

    dlindex index --suggest --log trace.sql && dlindex index --apply --drop-unused --yes
    """
    from dlindex.cli import _advice  # the advisor pulls in sqlglot: only this command pays for it

    if (revert or list_) and (suggest or apply or drop_unused or log):
        raise typer.BadParameter("--revert and --list take no other action", param_hint="'--revert' / '--list'")
    if revert and list_:
        raise typer.BadParameter("choose --revert or --list", param_hint="'--revert'")
    if drop_unused and not yes and not sys.stdin.isatty():
        raise typer.BadParameter(
            "it asks before dropping and stdin is not a terminal; add --yes", param_hint="'--drop-unused'"
        )
    logs = [(name, _read(name)) for name in log or ()]
    with Catalog(db, log=False) as catalog:
        if apply or drop_unused or revert:
            catalog.ensure_writable()  # before minutes of analysis, not after
        if revert or list_:
            (_advice.revert if revert else _advice.listing)(catalog, as_json)
            return
        options = {"top": top}
        advice = _advice.stored(catalog, logs, options) if apply or drop_unused else None
        if advice is None:
            status = stderr_console.status("analysing the query log") if stderr_console.is_terminal else nullcontext()
            with status as shown:
                advice = _advice.suggest(catalog, logs, options, shown, time_limit, memory_limit)
        _advice.report_skipped(advice)
        if not as_json and (suggest or not (apply or drop_unused)):  # --apply alone prints what it did, no more
            _advice.print_advice(advice)
        drops = advice.droppable() if drop_unused else ()
        if drops and not yes and not _advice.confirm_drops(drops):
            drops = ()
        changes = _advice.apply(catalog, advice, create=apply, drops=drops) if apply or drops else None
    if as_json:
        print_json({**advice.as_dict(), **({"applied": changes.as_dict()} if changes else {})})
    elif changes is not None:
        _advice.print_changes(changes)


def _read(name: str) -> LineSource:
    return spooled_lines(sys.stdin.buffer) if name == "-" else file_lines(name)
