"""`dlindex features compute` and `features auto`: making vectors, now or as samples land."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from dlindex.catalog.connection import Catalog
from dlindex.cli._feature_options import DtypeOption, TypeOption
from dlindex.cli._selection import PerLabelOption, Selection, selection_options
from dlindex.cli._shared import (  # fmt: skip
    AddressOption,
    DbOption,
    Engine,
    EngineOption,
    JsonFlag,
    NoLogFlag,
    OldShardOption,
    PartOption,
    QuietFlag,
    WaitOption,
    handle_errors,
    part_option,
    print_json,
    progress_bar,
    stderr_console,
    stdout_console,
)
from dlindex.errors import ExitCode

if TYPE_CHECKING:
    from dlindex.features import ComputeSummary


@handle_errors
@selection_options
def compute(
    feature_type: Annotated[
        str | None,
        typer.Option(
            "--type",
            "-t",
            metavar="NAME",
            help="Feature type name (letters, digits, _); with --queued, leave it out for every automatic type.",
            show_default=False,
        ),
    ] = None,
    extractor: Annotated[
        str | None,
        typer.Option(
            "--extractor",
            "-e",
            metavar="SPEC",
            help="colorhist, thumb, colorthumb, dhash, module:function, file.py:function, torch:MODEL_FILE, "
            "torchvision:MODEL:WEIGHTS_FILE, or text:ngrams / text:module:function for a text type (needed for a new type).",
            show_default=False,
        ),
    ] = None,
    dtype: DtypeOption = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers", "-w", min=0, help="Extractor processes (Ray actors with --engine ray); 0 means one per CPU."
        ),
    ] = 0,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="Also retry samples whose extraction failed before.")
    ] = False,
    queued: Annotated[
        bool,
        typer.Option(
            "--queued",
            help="Only the samples queued for the type (see features auto), read from the queue; no filters.",
        ),
    ] = False,
    engine: EngineOption = Engine.local,
    address: AddressOption = None,
    part: PartOption = None,
    shard: OldShardOption = None,
    *,
    select: Selection,
    per_label: PerLabelOption = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=0, help="At most N samples selected.", show_default=False)
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of --per-label.")] = 0,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 3 if any sample failed.")] = False,
    as_json: JsonFlag = False,
    quiet: QuietFlag = False,
    no_log: NoLogFlag = False,
    db: DbOption = None,
    wait: WaitOption = None,  # applied by the option itself to every catalog opened
) -> None:
    """Compute vectors for the selected samples that have none yet, or a stale one (made by
    another version of the extractor); resumable, parallel.

    dlindex features compute --type colorhist --label cat --workers 4
    """
    from dlindex.features import ComputeOptions, compute_features, compute_queued
    from dlindex.query.spec import QuerySpec

    spec = select.spec(per_label=per_label, limit=limit, seed=seed)
    if queued and spec != QuerySpec():  # the defaults are the queue's own (ok, not set aside)
        raise typer.BadParameter(
            "--queued computes the queue as it is; give no filters with it", param_hint="'--queued'"
        )
    if feature_type is None and not queued:
        raise typer.BadParameter("give --type NAME (or --queued, for every automatic type)", param_hint="'--type'")
    options = ComputeOptions(
        extractor=extractor, dtype=dtype.value if dtype else None, workers=workers, retry_failed=retry_failed,
        part=part_option(part, shard), engine=engine.value, address=address, queued=queued,
    )  # fmt: skip
    with (
        Catalog(db, log=not no_log) as catalog,
        progress_bar(quiet, unit="img", desc=feature_type or "queued", smoothing=0.1) as update,
    ):
        if feature_type is None:
            summaries = compute_queued(catalog, options, progress=update)
        else:
            summaries = [compute_features(catalog, feature_type, None if queued else spec, options, progress=update)]
    if as_json:
        print_json(summaries[0].as_dict() if feature_type is not None else [s.as_dict() for s in summaries])
    elif not quiet:
        if not summaries:
            stdout_console.print("no automatic feature types (dlindex features auto --type NAME)", markup=False)
        for s in summaries:
            _print_summary(s)
    if strict and any(s.failed for s in summaries):
        raise typer.Exit(ExitCode.PARTIAL)


def _print_summary(s: ComputeSummary) -> None:
    stdout_console.print(
        f"[bold]{s.feature_type}[/] ({s.extractor}, dim {s.dim or '-'}, {s.dtype})\n"
        f"  selected {s.selected:,}  computed {s.computed:,}  failed {s.failed:,}\n"
        f"  already done {s.already_done:,}  failed before {s.skipped_failed:,}\n"
        + (f"  stale {s.stale:,} (made by another version of the extractor: made again)\n" if s.stale else "")
        + (f"  no text {s.no_text:,} (samples without a text have no vector of a text type)\n" if s.no_text else "")
        + f"  {s.seconds:.2f} s, {s.images_per_s:,.0f} images/s", highlight=False,
    )  # fmt: skip
    for image_id, error in s.error_samples[:10]:
        stderr_console.print(f"failed: id {image_id}: {error}", markup=False, highlight=False)
    if s.failed > 10:
        stderr_console.print(
            f"... and {s.failed - 10} more (dlindex features failures --type {s.feature_type})", markup=False
        )


@handle_errors
def auto(
    feature_type: TypeOption,
    off: Annotated[bool, typer.Option("--off", help="Stop queueing new samples for the type.")] = False,
    db: DbOption = None,
    wait: WaitOption = None,  # applied by the option itself to every catalog opened
) -> None:
    """Make a feature type automatic: every new or changed ok sample is queued for it, whoever
    writes the catalog (scan, merge); features compute --queued computes the queue.

    dlindex features auto --type dhash && dlindex scan ROOT && dlindex features compute --queued
    """
    from dlindex.features import set_auto

    with Catalog(db) as catalog:
        ftype = set_auto(catalog, feature_type, not off)
    what = "automatic: new and changed samples are queued" if ftype.auto else "not automatic"
    stdout_console.print(f"{ftype.name}: {what}", markup=False, highlight=False)
