"""`dlindex query`: filter and sample the catalog; rows on stdout."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated

import typer

from dlindex.catalog.connection import Catalog
from dlindex.cli._output import FormatOption, NullFlag, OutputFormat, at_terminal, emit_rows, resolve_format
from dlindex.cli._selection import ClassesOption, ClassList, PerLabelOption, Selection, selection_options
from dlindex.cli._shared import AtOption, DbOption, NoLogFlag, handle_errors
from dlindex.query.rows import explain, query_rows

DEFAULT_MAX_ROWS = 100


class Order(StrEnum):
    id = "id"
    random = "random"


@handle_errors
@selection_options
def query(
    select: Selection,
    split: Annotated[
        list[str] | None,
        typer.Option(
            "--split",
            help="Only this split folder of a pre-split tree: train, val (validation), test... (repeatable).",
            show_default=False,
        ),
    ] = None,
    classes: ClassesOption = ClassList.selected,
    per_label: PerLabelOption = None,
    limit: Annotated[int | None, typer.Option("--limit", min=0, help="At most N rows.", show_default=False)] = None,
    offset: Annotated[
        int, typer.Option("--offset", min=0, help="Skip the first N rows (with --limit: pages of a stable --order).")
    ] = 0,
    order: Annotated[
        Order, typer.Option("--order", help="Row order: id, or random (deterministic for a --seed).")
    ] = Order.id,
    seed: Annotated[int, typer.Option("--seed", help="Seed of --per-label and --order random.")] = 0,
    columns: Annotated[
        str | None,
        typer.Option(
            "--columns",
            "-c",
            help="Comma-separated columns to print; a name it does not know lists those it does.",
            show_default="id,path,label,width,height,status,processed,processing_status,created_at",
        ),
    ] = None,
    fmt: FormatOption = None,
    null: NullFlag = False,
    max_rows: Annotated[
        int | None,
        typer.Option(
            "--max-rows",
            min=1,
            help="With --format table: print at most N rows, then say how many more.",
            show_default="100 at a terminal, unless --limit",
        ),
    ] = None,
    show_all: Annotated[
        bool, typer.Option("--all", help="With --format table: print every row (no --max-rows cap).")
    ] = False,
    show_plan: Annotated[
        bool, typer.Option("--explain", help="Print the SQL, its parameters and EXPLAIN QUERY PLAN instead of rows.")
    ] = False,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Run the query even if an unchanged catalog has its result cached.")
    ] = False,
    no_log: NoLogFlag = False,
    at: AtOption = None,
    db: DbOption = None,
) -> None:
    """Select samples by label, status, flags, time and size; sample per label; rows on stdout.

    dlindex query --per-label 32 --processed --seed 7 --format paths | head
    """
    if null and fmt not in (None, OutputFormat.paths):
        raise typer.BadParameter("-0 applies to --format paths only", param_hint="'-0'")
    out = OutputFormat.paths if null else resolve_format(fmt)
    spec = select.spec(
        per_label=per_label,
        limit=limit,
        offset=offset,
        order=order.value,
        seed=seed,
        split=tuple(split or ()),
        classes=classes.value,
        columns=("path",) if out is OutputFormat.paths else columns,
        cache=not no_cache,
    )
    with Catalog(db, log=not no_log and at is None, at=at) as catalog:
        if show_plan:
            explained = explain(catalog, spec)
            typer.echo(explained.sql + ";")
            typer.echo("-- params: " + json.dumps(explained.params, ensure_ascii=False))
            for line in explained.plan:
                typer.echo("-- " + line)
            return
        emit_rows(
            query_rows(catalog, spec),
            out,
            tuple(spec.columns or ()),
            null=null,
            max_rows=_cap(max_rows, show_all, limit),
        )


def _cap(max_rows: int | None, show_all: bool, limit: int | None) -> int | None:
    """Rows a table prints: a person at a terminal sees the first screens at once, not 1M rows."""
    if show_all:
        return None
    if max_rows is not None:
        return max_rows
    return DEFAULT_MAX_ROWS if limit is None and at_terminal() else None
