"""`dlindex merge`: the parts of a sharded scan, features compute or export, joined into one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dlindex.cli._shared import JsonFlag, QuietFlag, handle_errors, print_json, stdout_console
from dlindex.errors import InputError


@handle_errors
def merge(
    parts: Annotated[
        list[Path],
        typer.Argument(
            metavar="PART...",
            help="Part catalogs (scan or features compute --part I/N), or part export folders (export --part I/N).",
            show_default=False,
        ),
    ],
    into: Annotated[
        str,
        typer.Option(
            "--into",
            metavar="TARGET",
            help="The catalog to merge into (made if absent), or the export folder to write.",
        ),
    ],
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Exports: replace TARGET if it is an export dlindex wrote.")
    ] = False,
    as_json: JsonFlag = False,
    quiet: QuietFlag = False,
) -> None:
    """Join the parts of a sharded job: catalogs into one catalog (one transaction), or
    export folders into the export one machine would have written.

    dlindex merge part0.db part1.db part2.db --into catalog.db
    """
    for part in parts:
        if not part.exists():
            raise InputError(f"part {part} does not exist")
    folders = [p.is_dir() for p in parts]
    if any(folders) and not all(folders):
        raise InputError("merge: give part catalogs (files) or part exports (folders), not both")
    if all(folders):
        from dlindex.export.merge import merge_exports

        exported = merge_exports(parts, Path(into), overwrite=overwrite)
        if as_json:
            print_json(exported.as_dict())
        elif not quiet:
            stdout_console.print(exported.describe(), highlight=False, markup=False)
        return
    if overwrite:
        raise InputError("merge: --overwrite is for exports; catalogs are merged into TARGET, never replaced")
    from dlindex.catalog.merge import merge_catalogs

    s = merge_catalogs(parts, into)
    if as_json:
        print_json(s.as_dict())
    elif not quiet:
        lines = [
            f"merged {s.parts} part(s) into {s.into} in {s.seconds:.2f} s: {s.samples_added} samples added, "
            f"{s.samples_updated} updated, {s.vectors_written} vectors written"
            + (f", {s.vectors_stale} stale vectors left out" if s.vectors_stale else "")
            + (f", {s.texts_written} texts written" if s.texts_written else ""),
            *s.jobs,
        ]
        stdout_console.print("\n".join(lines), highlight=False, markup=False)
