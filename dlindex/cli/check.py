"""`dlindex check`: integrity, schema version, orphan rows and dead scans of a catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dlindex.catalog.check import CheckReport, check_catalog
from dlindex.catalog.recover import recover_catalog
from dlindex.cli._shared import DbOption, JsonFlag, handle_errors, print_json
from dlindex.errors import ExitCode
from dlindex.faults import recovery_hint


@handle_errors
def check(
    quick: Annotated[
        bool,
        typer.Option("--quick", help="PRAGMA quick_check (pages and records) instead of the full integrity_check."),
    ] = False,
    recover_to: Annotated[
        Path | None,
        typer.Option(
            "--recover-to",
            metavar="NEW",
            help="Copy every row still readable into the new catalog file NEW, then check that.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonFlag = False,
    db: DbOption = None,
) -> None:
    """Check a catalog is whole (read-only); exit 1 if anything is wrong.

    dlindex check --db train.db || dlindex check --db train.db --recover-to recovered.db

    To recover a damaged catalog: keep a copy of it, run --recover-to NEW (every row still
    readable goes into NEW, which is then checked; stderr names the tables that lost rows),
    move NEW into place, and rescan the roots: image rows on lost pages come back, their
    processed flags and features must be set and computed again.
    """
    path = db if db is not None else _default_db()
    if recover_to is not None:
        recovered = recover_catalog(path, recover_to)
        lost = ", ".join(recovered.incomplete) or "none"
        typer.echo(f"recovered into {recovered.target}: {sum(recovered.rows.values()):,} rows; "
                   f"tables with unreadable rows: {lost}", err=True)  # fmt: skip
        path = recovered.target
    report = check_catalog(path, quick=quick)
    if as_json:
        print_json(report.as_dict())
    else:
        _print(report)
    if not report.healthy:
        raise typer.Exit(ExitCode.ERROR)


def _default_db() -> str:
    from dlindex.catalog.sqlite.connect import DEFAULT_DB

    return DEFAULT_DB


def _print(r: CheckReport) -> None:
    version = r.schema_version if r.schema_version is not None else "?"
    images = f"{r.images:,}" if r.images is not None else "?"
    typer.echo(f"catalog {r.path}: schema {version} (this dlindex: {r.dlindex_schema_version}), {images} images, "
               f"integrity {r.integrity}, {r.seconds:.2f} s")  # fmt: skip
    for problem in r.problems:
        typer.echo(f"problem: {problem}")
    if r.healthy:
        typer.echo("healthy")
    elif set(r.problems) <= set(r.unreachable_roots):  # each line says what to do; recovering would not help
        typer.echo(f"{len(r.problems)} problem(s); the catalog file is whole")
    else:
        typer.echo(f"{len(r.problems)} problem(s); {recovery_hint(r.path)}")
