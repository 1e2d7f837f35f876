"""`dlindex stats`: what is in the catalog."""

from __future__ import annotations

from typing import Annotated

import typer

from ..catalog import Catalog
from ..stats import CatalogStats, catalog_stats
from ._shared import DbOption, JsonFlag, NoLogFlag, handle_errors, human_bytes, print_json, stdout_console


@handle_errors
def stats(
    db: DbOption = None,
    top: Annotated[int, typer.Option("--top", min=1, help="How many largest and smallest labels to list.")] = 5,
    as_json: JsonFlag = False,
    no_log: NoLogFlag = False,
) -> None:
    """Show totals by status, label balance, sizes, indexes and recent scans.

        dlindex stats --json | jq .by_status
    """
    with Catalog(db, log=not no_log) as catalog:
        result = catalog_stats(catalog, top=top)
    if as_json:
        print_json(result.as_dict())
    else:
        _print(result)


def _print(s: CatalogStats) -> None:
    out = stdout_console
    status = ", ".join(f"{k} {v:,}" for k, v in s.by_status.items())
    out.print(f"[bold]images[/] {s.images:,} ({status})")
    out.print(f"[bold]processed[/] {s.processed:,}, unprocessed {s.unprocessed:,}")
    if s.processing_status:
        out.print("[bold]processing status[/] " + ", ".join(f"{k} {v:,}" for k, v in s.processing_status.items()))
    out.print(f"[bold]labels[/] {s.labels:,}")
    if s.largest_labels:
        out.print("  largest:  " + ", ".join(f"{_label(c.label)} {c.images:,}" for c in s.largest_labels), markup=False)
        out.print("  smallest: " + ", ".join(f"{_label(c.label)} {c.images:,}" for c in s.smallest_labels), markup=False)
    out.print(f"[bold]image bytes[/] {human_bytes(s.total_bytes)}; catalog file {human_bytes(s.catalog_bytes)}")
    out.print(f"[bold]indexes[/] {', '.join(i['name'] for i in s.indexes) or 'none (see dlindex index --suggest)'}")
    if s.roots:
        out.print("[bold]roots[/] " + ", ".join(str(r["path"]) for r in s.roots), markup=True, highlight=False)
    if s.last_scans:
        out.print("[bold]last scans[/]")
        for scan in s.last_scans:
            out.print(
                f"  #{scan['id']} {scan['started_at']} {scan['state']} in {scan['seconds'] or 0:.2f} s: "
                f"seen {scan['seen']:,} new {scan['new']:,} changed {scan['changed']:,} "
                f"missing {scan['missing']:,} corrupt {scan['corrupt']:,} errors {scan['errors']:,}",
                markup=False,
                soft_wrap=True,
            )


def _label(name: str) -> str:
    return name if name else "(root)"
