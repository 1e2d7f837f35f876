"""`dlindex roots list|move`: the scanned roots, and moving one without a rescan."""

from __future__ import annotations

from typing import Annotated

import typer

from dlindex.catalog.connection import Catalog
from dlindex.catalog.roots import DEFAULT_CHECK, list_roots, move_root
from dlindex.cli._output import FormatOption, emit_rows, resolve_format
from dlindex.cli._shared import DbOption, JsonFlag, handle_errors, print_json, stdout_console

app = typer.Typer(
    name="roots", help="List scanned roots; tell the catalog a root moved (no rescan).", no_args_is_help=True
)
COLUMNS = ("id", "path", "images", "ok", "exists")


@app.command("list")
@handle_errors
def list_(fmt: FormatOption = None, db: DbOption = None) -> None:
    """Every scanned root: id, path, images, ok, and whether its folder exists now.

    dlindex roots list --format jsonl | jq -r 'select(.exists | not) | .path'
    """
    with Catalog(db, log=False) as catalog:
        emit_rows((r.as_dict() for r in list_roots(catalog)), resolve_format(fmt), COLUMNS)


@app.command("move")
@handle_errors
def move(
    old: Annotated[str, typer.Argument(metavar="OLD", help="The root as `dlindex roots list` shows it, or its id.")],
    new: Annotated[str, typer.Argument(metavar="NEW", help="The folder that holds the same tree now.")],
    check: Annotated[
        int,
        typer.Option(
            "--check", min=0, help="Look for this many of the root's files under NEW (size must match) first; 0 skips."
        ),
    ] = DEFAULT_CHECK,
    as_json: JsonFlag = False,
    db: DbOption = None,
) -> None:
    """Record that a root's files now live under NEW (after mv or rsync); nothing is rescanned.

    rsync -a /mnt/old/images/ /data/images/ && dlindex roots move /mnt/old/images /data/images
    """
    with Catalog(db) as catalog:
        moved = move_root(catalog, old, new, check=check)
    if as_json:
        print_json(moved.as_dict())
    else:
        stdout_console.print(
            f"root {moved.id}: {moved.old} -> {moved.new} ({moved.checked} files checked)",
            highlight=False,
            markup=False,
        )
