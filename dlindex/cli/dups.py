"""`dlindex dups`: groups of exact or near-duplicate samples, one per line, or the ids to drop."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dlindex.catalog.connection import Catalog
from dlindex.cli._output import OutputFormat, emit_rows, resolve_format
from dlindex.cli._selection import Selection, selection_options
from dlindex.cli._shared import DbOption, NoLogFlag, handle_errors

if TYPE_CHECKING:
    from dlindex.quality.report import PageGroups

COLUMNS = ("group", "kind", "size", "kept", "ids", "paths")


class KeepPolicy(StrEnum):  # dlindex.quality.duplicate_groups.Keep, without importing numpy for --help
    largest = "largest"
    oldest = "oldest"
    first = "first"


class GroupFormat(StrEnum):
    table = "table"
    jsonl = "jsonl"
    csv = "csv"


@handle_errors
@selection_options
def dups(
    feature_type: Annotated[
        str | None,
        typer.Option(
            "--type",
            "-t",
            metavar="NAME",
            help="Near duplicates by this feature type (dhash: a 64-bit hash; others: an embedding). "
            "Without it: exact copies, by content hash.",
            show_default=False,
        ),
    ] = None,
    max_distance: Annotated[
        int | None,
        typer.Option(
            "--max-distance",
            metavar="BITS",
            help="Hash types: at most this many of 64 bits apart.",
            show_default="8",
        ),
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option(
            "--threshold",
            metavar="X",
            help="Embedding types: cosine distance (0 to 2) at most X.",
            show_default="0.03",
        ),
    ] = None,
    keep: Annotated[
        KeepPolicy,
        typer.Option(
            "--keep",
            help="Which member each group keeps: largest (pixels, then bytes), oldest (mtime) or first (smallest id).",
        ),
    ] = KeepPolicy.largest,
    connected: Annotated[
        bool,
        typer.Option(
            "--connected",
            help="Near groups as chains of near pairs (a~b~c, what a split needs), not only copies of the kept one.",
        ),
    ] = False,
    rest: Annotated[
        bool,
        typer.Option("--rest", help="Print only the ids of the members not kept, one per line (for dlindex mark)."),
    ] = False,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            metavar="FILE",
            help="Also write the groups as one self-contained web page of thumbnails (largest groups first).",
            show_default=False,
        ),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="With --html: replace FILE if it is an earlier dlindex report."),
    ] = False,
    fmt: Annotated[
        GroupFormat | None,
        typer.Option(
            "--format",
            "-f",
            help="Output format: table, jsonl or csv; one group per line.",
            show_default="table at a terminal, jsonl otherwise",
        ),
    ] = None,
    *,
    select: Selection,
    no_log: NoLogFlag = False,
    db: DbOption = None,
) -> None:
    """Groups of duplicate samples: exact copies, or near ones by a hash or embedding type.

    dlindex dups --type dhash --rest | dlindex mark --exclude -
    """  # fmt: skip
    if rest and fmt is not None:
        raise typer.BadParameter("--rest prints ids only; leave out --format", param_hint="'--rest'")
    if overwrite and html is None:
        raise typer.BadParameter(
            "--overwrite replaces an earlier --html report; give --html FILE", param_hint="'--overwrite'"
        )
    from dlindex.quality.duplicate_groups import group_rows, iter_duplicate_groups
    from dlindex.quality.report import PageGroups, check_target

    with Catalog(db, log=not no_log) as catalog:
        groups: Iterable[Any] = iter_duplicate_groups(
            catalog, feature_type=feature_type, max_distance=max_distance, threshold=threshold, keep=keep.value,
            grouping="connected" if connected else "around-kept", spec=select.spec(),
        )  # fmt: skip  # exact groups stream from a sort on disk: memory does not grow with the catalog
        page = None
        if html is not None:  # the page is written after the output, from the groups it kept on the way
            check_target(html, overwrite=overwrite)  # refused before any output
            page = PageGroups()
            groups = page.tee(groups)
        if rest:
            _print_ids(i for g in groups for i in g.rest)
        else:
            out = resolve_format(None if fmt is None else OutputFormat(fmt.value))
            emit_rows(_flat(group_rows(catalog, groups), out), out, COLUMNS)
        if html is not None and page is not None:
            _write_html(catalog, page, html, overwrite=overwrite, title=_title(feature_type))


def _write_html(catalog: Catalog, page: PageGroups, path: Path, *, overwrite: bool, title: str) -> None:
    from dlindex.quality.report import report_groups, write_report

    summary = write_report(
        path, report_groups(catalog, page.first), title=title, overwrite=overwrite,
        left_out=(page.left_groups, page.left_images),
    )  # fmt: skip
    failed = f", {summary.thumbnails_failed} could not be shown" if summary.thumbnails_failed else ""
    print(f"wrote {summary.path}: {summary.groups} groups, {summary.images} images{failed}", file=sys.stderr)


def _title(feature_type: str | None) -> str:
    return "Exact duplicates" if feature_type is None else f"Near duplicates by {feature_type}"


def _print_ids(ids: Iterable[int]) -> None:
    write = sys.stdout.write
    for image_id in ids:
        write(f"{image_id}\n")
    sys.stdout.flush()


def _flat(rows: Iterable[dict[str, Any]], out: OutputFormat) -> Iterator[dict[str, Any]]:
    """csv and table cells hold one value: ids space-separated, paths as a JSON list (csv) or lines."""
    if out is OutputFormat.jsonl:
        yield from rows
        return
    for row in rows:
        paths = json.dumps(row["paths"], ensure_ascii=False) if out is OutputFormat.csv else "\n".join(row["paths"])
        yield {**row, "ids": " ".join(map(str, row["ids"])), "paths": paths}
