"""`dlindex leaks`: duplicate pairs that cross the splits of an export or of a split rule."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dlindex.catalog.connection import Catalog
from dlindex.cli._output import OutputFormat, emit_rows, resolve_format
from dlindex.cli._selection import Selection, selection_options
from dlindex.cli._shared import DbOption, NoLogFlag, handle_errors
from dlindex.cli.dups import GroupFormat
from dlindex.errors import ExitCode

if TYPE_CHECKING:
    from dlindex.export.leaks import Leak, LeakSearch

COLUMNS = ("a", "b", "split_a", "split_b", "distance", "kind", "path_a", "path_b")
_PAIRS_PER_LOOKUP = 1000


@handle_errors
@selection_options
def leaks(
    export_dir: Annotated[
        Path | None,
        typer.Argument(
            metavar="[EXPORT_DIR]", help="An export written by dlindex export; or give --split.", show_default=False
        ),
    ] = None,
    split: Annotated[
        str | None,
        typer.Option(
            "--split",
            metavar="RULE",
            show_default=False,
            help="Instead of EXPORT_DIR: the splits dlindex export --split RULE would make, e.g. train=0.8,val=0.2.",
        ),
    ] = None,
    feature_type: Annotated[
        str | None,
        typer.Option(
            "--type",
            "-t",
            metavar="NAME",
            show_default=False,
            help="Also near copies by this feature type (dhash: a 64-bit hash; others: an embedding). "
            "Without it: exact copies, by content hash.",
        ),
    ] = None,
    max_distance: Annotated[
        int | None,
        typer.Option(
            "--max-distance", metavar="BITS", help="Hash types: at most this many of 64 bits apart.", show_default="8"
        ),
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option(
            "--threshold", metavar="X", help="Embedding types: cosine distance (0 to 2) at most X.", show_default="0.03"
        ),
    ] = None,
    fmt: Annotated[
        GroupFormat | None,
        typer.Option(
            "--format",
            "-f",
            help="Output format: table, jsonl or csv; one pair per line.",
            show_default="table at a terminal, jsonl otherwise",
        ),
    ] = None,
    fail_on_leak: Annotated[
        bool, typer.Option("--fail-on-leak", help="Exit 1 if any pair crosses two splits (for CI).")
    ] = False,
    *,
    select: Selection,
    no_log: NoLogFlag = False,
    db: DbOption = None,
) -> None:
    """Exact and near-duplicate pairs whose two samples are in different splits.

    dlindex leaks out/ --type dhash --fail-on-leak --format jsonl > leaks.jsonl
    """  # fmt: skip
    if (export_dir is None) == (split is None):
        raise typer.BadParameter("give EXPORT_DIR or --split RULE, not both or neither", param_hint="'--split'")
    if export_dir is not None and _selects(select):
        raise typer.BadParameter("the selection options go with --split; an export holds its own samples",
                                 param_hint="'--split'")  # fmt: skip
    from dlindex.export.assignment import export_assignment, rule_assignment
    from dlindex.export.leaks import leak_pairs

    with Catalog(db, log=not no_log) as catalog:
        if export_dir is not None:
            assignment = export_assignment(catalog, export_dir)
        else:
            assert split is not None
            # exact copies only: the samples of shared content are all it needs (#34)
            assignment = rule_assignment(catalog, split, select.spec(), shared_only=feature_type is None)
        search = leak_pairs(catalog, assignment, feature_type=feature_type, max_distance=max_distance,
                            threshold=threshold)  # fmt: skip
        out = resolve_format(None if fmt is None else OutputFormat(fmt.value))
        found = emit_rows(_rows(catalog, search), out, COLUMNS)
        _summarise(search)
    if fail_on_leak and found:
        print(f"{found} leaking pair(s) (--fail-on-leak)", file=sys.stderr)
        raise typer.Exit(ExitCode.ERROR)


def _selects(select: Selection) -> bool:
    from dlindex.query.spec import QuerySpec

    return select.spec() != QuerySpec()


def _rows(catalog: Catalog, search: LeakSearch) -> Iterator[dict[str, Any]]:
    from dlindex.features.samples import describe

    for batch in _batches(search):
        paths = describe(catalog, (i for leak in batch for i in (leak.a, leak.b)))  # one lookup per batch
        for leak in batch:
            yield {**leak.as_dict(), "path_a": paths.get(leak.a, (None, None))[1],
                   "path_b": paths.get(leak.b, (None, None))[1]}  # fmt: skip


def _batches(leaks: Iterable[Leak]) -> Iterator[list[Leak]]:
    batch: list[Leak] = []
    for leak in leaks:
        batch.append(leak)
        if len(batch) == _PAIRS_PER_LOOKUP:
            yield batch
            batch = []
    if batch:
        yield batch


def _summarise(search: LeakSearch) -> None:
    """People's summary on stderr: stdout holds only the pairs, whatever the format."""
    a = search.assignment
    counts = ", ".join(f"{n} {name}" for name, n in a.counts().items())
    print(f"{a.source}: {counts}", file=sys.stderr)
    if a.missing:
        print(f"{a.missing} sample(s) of the export are no longer in the catalog (not searched)", file=sys.stderr)
    if search.without_vector:
        print(f"{search.without_vector} sample(s) have no {search.feature_type!r} vector (exact copies only); "
              f"compute them: dlindex features compute --type {search.feature_type}", file=sys.stderr)  # fmt: skip
    for s in search.summaries:
        print(f"{s.split_a}/{s.split_b}: {s.pairs} pair(s) ({s.exact} exact, {s.near} near), "
              f"{s.samples_a} {s.split_a} and {s.samples_b} {s.split_b} sample(s)", file=sys.stderr)  # fmt: skip
