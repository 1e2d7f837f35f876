"""`dlindex similar`: exact nearest neighbours of samples by a feature type; rows on stdout."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from dlindex.catalog.connection import Catalog
from dlindex.cli._feature_options import TypeOption
from dlindex.cli._output import FormatOption, NullFlag, OutputFormat, emit_rows, resolve_format
from dlindex.cli._selection import Selection, selection_options
from dlindex.cli._shared import DbOption, NoLogFlag, handle_errors
from dlindex.errors import InputError

COLUMNS = ("query", "rank", "id", "distance", "label", "path")


class Metric(StrEnum):
    cosine = "cosine"
    l2 = "l2"


@handle_errors
@selection_options
def similar(
    feature_type: TypeOption,
    target: Annotated[
        str | None,
        typer.Argument(
            metavar="[ID|PATH]", help="The sample to find neighbours of (or give --ids).", show_default=False
        ),
    ] = None,
    k: Annotated[int, typer.Option("-k", "--top", min=1, help="Neighbours per query.")] = 10,
    metric: Annotated[
        Metric, typer.Option("--metric", help="cosine (1 - cosine similarity) or l2 (Euclidean).")
    ] = Metric.cosine,
    other_labels: Annotated[
        bool, typer.Option("--other-labels", help="Only neighbours with a different label (hard negatives).")
    ] = False,
    ids: Annotated[
        Path | None,
        typer.Option(
            "--ids", metavar="FILE", help="Batch mode: query ids, one per line; - reads stdin.", show_default=False
        ),
    ] = None,
    to_text: Annotated[
        str | None,
        typer.Option(
            "--to-text",
            metavar="TEXT",
            show_default=False,
            help="Rank samples by how near they are to this text (embedded by a text type).",
        ),
    ] = None,
    text_type: Annotated[
        str | None,
        typer.Option(
            "--text-type",
            metavar="NAME",
            show_default=False,
            help="The text type that embeds --to-text, where --type is an image type of the same model (CLIP).",
        ),
    ] = None,
    *,
    select: Selection,
    fmt: FormatOption = None,
    null: NullFlag = False,
    no_log: NoLogFlag = False,
    db: DbOption = None,
) -> None:
    """Exact k nearest neighbours of a sample (or of many, with --ids, or of a text) by a feature type.

    dlindex similar cat/001.jpg --type colorhist -k 5 --other-labels --format paths
    dlindex similar --to-text 'a red car' --type captions
    """
    if sum(x is not None for x in (target, ids, to_text)) != 1:
        raise typer.BadParameter("give one sample (ID or PATH), --ids FILE or --to-text TEXT", param_hint="'ID|PATH'")
    if text_type is not None and to_text is None:
        raise typer.BadParameter("--text-type embeds --to-text: give both", param_hint="'--text-type'")
    if to_text is not None and other_labels:
        raise typer.BadParameter(
            "a text has no label: --other-labels goes with a sample", param_hint="'--other-labels'"
        )
    if null and fmt not in (None, OutputFormat.paths):
        raise typer.BadParameter("-0 applies to --format paths only", param_hint="'-0'")
    from dlindex.features import nearest
    from dlindex.features.samples import neighbour_rows, resolve_sample

    spec = select.spec()
    with Catalog(db, log=not no_log) as catalog:
        if to_text is not None:
            from dlindex.features.text_query import nearest_to_text

            found = nearest_to_text(catalog, [to_text], feature_type, text_type=text_type, k=k, metric=metric.value,
                                    spec=spec)  # fmt: skip
        else:
            queries = _read_ids(ids) if ids is not None else [resolve_sample(catalog, target or "")]
            found = nearest(
                catalog, queries, feature_type, k=k, metric=metric.value, other_labels=other_labels, spec=spec
            )
        out = OutputFormat.paths if null else resolve_format(fmt)
        emit_rows(neighbour_rows(catalog, found), out, COLUMNS, null=null)


def _read_ids(path: Path) -> list[int]:
    from dlindex.features.samples import read_sample_ids

    if str(path) == "-":
        return read_sample_ids(sys.stdin.buffer, "stdin")
    try:
        with open(path, "rb") as stream:
            return read_sample_ids(stream, str(path))
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None
