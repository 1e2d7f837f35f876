"""`dlindex versions`, `dlindex tag`, `dlindex diff`: the catalog's numbered versions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

import typer

from dlindex.catalog.as_of import resolve
from dlindex.catalog.connection import Catalog
from dlindex.catalog.diff import ORDER, DiffCounts, diff_states
from dlindex.catalog.versions import list_versions, untag
from dlindex.catalog.versions import prune_before as prune
from dlindex.catalog.versions import tag as tag_version
from dlindex.cli._output import FormatOption, OutputFormat, emit_rows, resolve_format
from dlindex.cli._shared import DbOption, JsonFlag, handle_errors, print_json, stdout_console

VERSION_COLUMNS = ("version", "finished_at", "command", "tags", "summary")
DIFF_COLUMNS = ("id", "path", "changes")


@handle_errors
def versions(
    after: Annotated[int, typer.Option("--after", min=0, help="Only versions numbered above N.")] = 0,
    prune_before: Annotated[
        str | None,
        typer.Option(
            "--prune-before",
            metavar="VERSION",
            help="Forget the versions before VERSION (a number or tag) and the history only they need.",
        ),
    ] = None,
    fmt: FormatOption = None,
    as_json: JsonFlag = False,
    db: DbOption = None,
) -> None:
    """The catalog's numbered versions: one per command that changed it, with its tags.

    dlindex versions --format jsonl | jq -r 'select(.tags | index("release")) | .version'
    """
    if prune_before is not None:
        with Catalog(db, log=False) as catalog:
            number = resolve(catalog.conn, prune_before).version
            if number is None:
                raise typer.BadParameter("give a version or a tag", param_hint="'--prune-before'")
            pruned = prune(catalog, number)
        if as_json:
            print_json(pruned.as_dict())
        else:
            stdout_console.print(
                f"pruned {pruned.versions} version(s) and {pruned.history_rows:,} history row(s); "
                f"the oldest version is {pruned.version} (state {pruned.state})",
                highlight=False, markup=False,
            )  # fmt: skip
        return
    if as_json:
        raise typer.BadParameter("goes with --prune-before; the list is --format jsonl", param_hint="'--json'")
    out = resolve_format(fmt)
    with Catalog(db, log=False) as catalog:
        rows = (_shown(v.as_dict(), out) for v in list_versions(catalog, after=after))
        emit_rows(rows, out, VERSION_COLUMNS)


def _shown(row: dict[str, Any], out: OutputFormat) -> dict[str, Any]:
    if out is OutputFormat.jsonl:
        return row
    summary = row["summary"] or {}
    return {
        "version": row["version"],
        "finished_at": row["finished_at"] or "(unfinished)",
        "command": row["command"],
        "tags": ",".join(row["tags"]),
        "summary": " ".join(f"{k} {v}" for k, v in summary.items()),
    }


@handle_errors
def tag(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The tag: a letter, then letters, digits, . _ + -.")],
    version: Annotated[
        str | None, typer.Argument(metavar="[VERSION]", help="The version to name (default: the latest finished).")
    ] = None,
    delete: Annotated[bool, typer.Option("--delete", help="Remove the tag (the version stays).")] = False,
    db: DbOption = None,
) -> None:
    """Name a version, so that --at NAME and diff NAME find it; naming again moves the tag.

    dlindex tag release-2026-12 && dlindex export /data/release --at release-2026-12
    """
    with Catalog(db, log=False) as catalog:
        if delete:
            if version is not None:
                raise typer.BadParameter("--delete takes the tag only", param_hint="'VERSION'")
            was = untag(catalog, name)
            stdout_console.print(f"tag {name} removed (it named version {was})", highlight=False, markup=False)
            return
        number = None if version is None else resolve(catalog.conn, version).version
        tagged = tag_version(catalog, name, number)
    stdout_console.print(f"tag {name} -> version {tagged}", highlight=False, markup=False)


@handle_errors
def diff(
    a: Annotated[str, typer.Argument(metavar="A", help="A version, tag or export folder.")],
    b: Annotated[
        str | None, typer.Argument(metavar="[B]", help="Another one (default: the catalog as it is now).")
    ] = None,
    fmt: FormatOption = None,
    as_json: JsonFlag = False,
    db: DbOption = None,
) -> None:
    """What changed from A to B: added, removed, content, relabelled, split, status, flags, moved.

    Counts at a terminal; the changed samples as rows with --format jsonl (or when piped):

    dlindex diff v3 v4 --format jsonl | jq -c 'select(.changes | index("relabelled"))'
    """
    with Catalog(db, log=False) as catalog:
        before = resolve(catalog.conn, a).state
        after = resolve(catalog.conn, b).state if b is not None else catalog.changes()
        counts = DiffCounts(before, after)
        out = None if as_json else resolve_format(fmt)
        if out is None or out is OutputFormat.table:
            for change in diff_states(catalog, before, after):
                counts.add(change)
        else:
            emit_rows(_rows(catalog, before, after, out), out, DIFF_COLUMNS)
            return
    if as_json:
        print_json(counts.as_dict())
        return
    shown = ", ".join(f"{kind} {counts.by_kind[kind]:,}" for kind in ORDER if counts.by_kind[kind])
    stdout_console.print(
        f"state {before} -> {after}: {counts.samples:,} samples differ" + (f" ({shown})" if shown else ""),
        highlight=False,
        markup=False,
    )


def _rows(catalog: Catalog, before: int, after: int, out: OutputFormat) -> Iterator[dict[str, Any]]:
    for change in diff_states(catalog, before, after):
        row = change.as_dict()
        if out is not OutputFormat.jsonl:
            row["changes"] = ",".join(change.kinds)  # one cell
        yield row
