"""`dlindex stats`: what is in the catalog."""

from __future__ import annotations

from typing import Annotated

import typer

from dlindex.catalog.connection import Catalog
from dlindex.cli._shared import (
    AtOption,
    DbOption,
    JsonFlag,
    NoLogFlag,
    handle_errors,
    human_bytes,
    print_json,
    stdout_console,
)
from dlindex.stats import CatalogStats, SlowReport, catalog_stats, slow_queries


@handle_errors
def stats(
    db: DbOption = None,
    top: Annotated[
        int,
        typer.Option("--top", min=1, help="How many largest and smallest labels (with --slow: statements) to list."),
    ] = 5,
    slow: Annotated[
        bool,
        typer.Option("--slow", help="Show the slowest logged statements with their current plans, and lock waits."),
    ] = False,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact",
            help="Count every row (one pass) even in a big catalog, whose row figures are otherwise estimated.",
        ),
    ] = False,
    as_json: JsonFlag = False,
    no_log: NoLogFlag = False,
    at: AtOption = None,
) -> None:
    """Show totals by status, label balance, sizes, indexes and recent scans.

    dlindex stats --json | jq .by_status
    """
    if slow:
        if at is not None:
            raise typer.BadParameter("--slow reads the query log, which has no versions", param_hint="'--at'")
        with Catalog(db, log=False) as catalog:
            report = slow_queries(catalog, top=top)
        if as_json:
            print_json(report.as_dict())
        else:
            _print_slow(report)
        return
    with Catalog(db, log=not no_log and at is None, at=at) as catalog:
        result = catalog_stats(catalog, top=top, exact=True if exact else None)
    for problem in result.root_problems:  # the totals describe files that are not there
        typer.echo(f"warning: {problem}", err=True)
    if as_json:
        print_json(result.as_dict())
    else:
        print_stats(result, catalog.backend.storage)


def print_stats(s: CatalogStats, storage: str = "file") -> None:
    out = stdout_console
    n = _approximate if s.estimated else _count
    status = ", ".join(f"{k} {n(v)}" for k, v in s.by_status.items())
    out.print(f"[bold]images[/] {n(s.images)} ({status})")
    out.print(f"[bold]processed[/] {n(s.processed)}, unprocessed {n(s.unprocessed)}")
    if s.processing_status:
        out.print("[bold]processing status[/] " + ", ".join(f"{k} {n(v)}" for k, v in s.processing_status.items()))
    if s.excluded:
        out.print(f"[bold]excluded[/] {n(s.excluded)} (mark --exclude: left out of query, export and the loader)")
    labels = f">= {s.labels:,} (met in the sample)" if s.estimated else f"{s.labels:,}"
    out.print(f"[bold]labels[/] {labels}; classes {s.classes:,} (label_id 0..{max(s.classes - 1, 0):,})")
    if s.without_class:
        out.print(f"  without a class (directly under ROOT): {n(s.without_class)}")
    if s.splits:
        out.print("[bold]splits[/] " + ", ".join(f"{k} {n(v)}" for k, v in s.splits.items()))
    if s.largest_labels:
        out.print(
            "  largest:  " + ", ".join(f"{_label(c.label)} {n(c.images)}" for c in s.largest_labels), markup=False
        )
        smallest = ", ".join(f"{_label(c.label)} {n(c.images)}" for c in s.smallest_labels)
        out.print("  smallest: " + (smallest or "(--exact counts every label)"), markup=False)
    out.print(
        f"[bold]image bytes[/] {'~' if s.estimated else ''}{human_bytes(s.total_bytes)}; catalog {storage} {human_bytes(s.catalog_bytes)}"
    )
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
    if s.estimated:
        out.print(f"~ estimated from {s.sampled_rows:,} sampled rows; --exact counts every row (one pass over the "
                  "catalog)", markup=False, highlight=False)  # fmt: skip


def _count(value: int) -> str:
    return f"{value:,}"


def _approximate(value: int) -> str:
    """An estimate, to three significant figures: ~9,950,000."""
    return f"~{int(float(f'{value:.3g}')):,}"


def _label(name: str) -> str:
    return name if name else "(root)"


def _print_slow(r: SlowReport) -> None:
    out = stdout_console
    if not r.queries:
        out.print("no timed reads in the query log", markup=False)
    for i, q in enumerate(r.queries, 1):
        out.print(f"{i}. {q.fingerprint}  {q.mean_ms:,.2f} ms x {q.calls:,} calls = {q.total_ms:,.1f} ms  "
                  f"(last {q.last_logged})", markup=False, highlight=False)  # fmt: skip
        out.print("   " + " ".join(q.sql.split()), markup=False, highlight=False, soft_wrap=True)
        for line in q.plan or ("(no plan: not a read-only SELECT)",):
            out.print("     " + line, markup=False, highlight=False)
    out.print(f"lock waits: {r.lock_wait_transactions:,} write transaction(s) waited {r.lock_wait_ms:,.1f} ms "
              "for the write lock", markup=False)  # fmt: skip
