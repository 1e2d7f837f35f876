"""`dlindex export`: manifests or packed shards of the selected samples, plus index.json."""

from __future__ import annotations

from enum import StrEnum
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dlindex.catalog.connection import Catalog
from dlindex.cli._selection import ClassesOption, ClassList, PerLabelOption, Selection, selection_options
from dlindex.cli._shared import (
    AddressOption,
    AtOption,
    DbOption,
    Engine,
    EngineOption,
    JsonFlag,
    NoLogFlag,
    OldShardOption,
    QuietFlag,
    RayTasksOption,
    handle_errors,
    human_bytes,
    part_option,
    print_json,
    progress_bar,
    stdout_console,
)
from dlindex.exported.formats import DEFAULT, FORMATS, NAMES

MAX_WARNINGS = 20
if TYPE_CHECKING:
    ExportFormat = str
else:  # the registry's formats, as typer offers an Enum's values
    ExportFormat = StrEnum("ExportFormat", {name: name for name in NAMES})


def _moved_on(out_dir: Path, db: str | None) -> str | None:
    """--verify's note on the catalog the export came from (--db, else index.json's), where it can be opened."""
    from dlindex.catalog.backend import is_server_url
    from dlindex.errors import DlindexError
    from dlindex.export.registry import moved_on
    from dlindex.exported.reader import load_index

    index = load_index(out_dir)
    source = db or str(index["catalog"]["path"])
    if not is_server_url(source) and not Path(source).is_file():
        return None  # a catalog moved away, or an export read elsewhere: nothing to compare
    try:
        with Catalog(source, log=False) as catalog:
            return moved_on(catalog, index)
    except DlindexError:
        return None


def _append(out_dir: Path, db: str | None, *, read_threads: int, as_json: bool, quiet: bool, no_log: bool) -> None:
    """``export OUT_DIR --append``: the catalog named by --db, else the one index.json names."""
    from dlindex.export.append import append_export
    from dlindex.exported.reader import load_index

    source = db if db is not None else str(load_index(out_dir)["catalog"]["path"])
    with Catalog(source, log=not no_log) as catalog, progress_bar(quiet, unit="img") as update:
        summary = append_export(
            catalog, out_dir, read_threads=read_threads, progress=update,
            warn=lambda line: typer.echo(f"warning: {line}", err=True), note=lambda line: typer.echo(line, err=True),
        )  # fmt: skip
    if as_json:
        print_json(summary.as_dict())
    elif not quiet:
        stdout_console.print(summary.describe(), markup=False, highlight=False)


def _format_help() -> str:
    """``jsonl, csv, parquet (manifests); dali (file lists); ...``: the registry's formats by kind."""
    kinds = groupby(FORMATS.values(), key=lambda f: f.kind)
    return "; ".join(f"{', '.join(f.name for f in group)} ({kind})" for kind, group in kinds) + "."


def _default_shards() -> str:
    """``256MiB for wds, 64MiB for mds, one shard otherwise``: the registry's default shard sizes."""
    sizes = [f"{_size(f.shard_bytes)} for {f.name}" for f in FORMATS.values() if f.shard_bytes is not None]
    sizes += [f"{f.shard_size} samples for {f.name}" for f in FORMATS.values() if f.shard_size is not None]
    return ", ".join([*sizes, "one shard otherwise"])


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{n}B"


@handle_errors
@selection_options
def export(
    out_dir: Annotated[
        Path, typer.Argument(metavar="OUT_DIR", help="Folder to write (made atomically), or to check with --verify.")
    ],
    fmt: Annotated[ExportFormat, typer.Option("--format", "-f", help=_format_help())] = DEFAULT,
    *,
    select: Selection,
    classes: ClassesOption = ClassList.selected,
    per_label: PerLabelOption = None,
    limit: Annotated[int | None, typer.Option("--limit", min=0, help="At most N samples.", show_default=False)] = None,
    shard_size: Annotated[
        int | None, typer.Option("--shard-size", min=1, help="At most N samples per shard.", show_default=False)
    ] = None,
    shard_bytes: Annotated[
        str | None,
        typer.Option(
            "--shard-bytes",
            metavar="SIZE",
            help="Shards of at most SIZE (256MiB, 1GB).",
            show_default=_default_shards(),
        ),
    ] = None,
    shuffle: Annotated[bool, typer.Option("--shuffle", help="Seeded random sample order (else by id).")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of --shuffle and --per-label.")] = 0,
    split: Annotated[
        str | None,
        typer.Option(
            "--split",
            metavar="NAME=FRACTION,...|tree|NAME,...",
            help="Stable splits by content hash, e.g. train=0.9,val=0.1; tree: the tree's split folders; val or train,val: only these split folders.",
            show_default="the split folders of a pre-split tree, else one split",
        ),
    ] = None,
    world_size: Annotated[
        int, typer.Option("--world-size", min=1, help="Split each split into W equal rank shares (at most 65536).")
    ] = 1,
    drop_last: Annotated[
        bool,
        typer.Option("--drop-last/--pad", help="Equal rank shares by dropping the remainder, or by repeating samples."),
    ] = False,
    features: Annotated[
        str | None,
        typer.Option(
            "--features", metavar="TYPE", help="Add this type's vectors from the feature cache.", show_default=False
        ),
    ] = None,
    texts: Annotated[
        bool,
        typer.Option(
            "--texts",
            help="Add each sample's texts: text (the first) and texts (all); wds a .txt member, mds a text column.",
        ),
    ] = False,
    absolute_paths: Annotated[
        bool,
        typer.Option("--absolute-paths", help="Absolute paths in manifests and metadata (else relative to file_root)."),
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="Replace OUT_DIR if it holds a dlindex export and nothing else (atomically)."),
    ] = False,
    read_threads: Annotated[
        int,
        typer.Option(
            "--read-threads", min=0, help="Read source images ahead with N threads (cold page cache; wds, mds)."
        ),
    ] = 0,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            help="wds: at least N shards per rank (a multiple of N), so DataLoader(num_workers<=N) never starves a worker.",
        ),
    ] = 8,
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            metavar="near-dups",
            help="Keep each near-duplicate group (dhash within 8 bits, as dups --type dhash) in one split; dhash is computed first if missing.",
            show_default=False,
        ),
    ] = None,
    group_by: Annotated[
        str | None,
        typer.Option(
            "--group-by",
            metavar="COLUMN",
            help="Keep the samples sharing a value of this scan --labels column (a video, a patient) in one split.",
            show_default=False,
        ),
    ] = None,
    group_type: Annotated[
        str | None,
        typer.Option(
            "--group-type", metavar="TYPE", help="--group near-dups by this feature type.", show_default="dhash"
        ),
    ] = None,
    group_max_distance: Annotated[
        int | None,
        typer.Option(
            "--group-max-distance",
            metavar="BITS",
            help="Hash types: near duplicates at most BITS of 64 apart.",
            show_default="8",
        ),
    ] = None,
    group_threshold: Annotated[
        float | None,
        typer.Option(
            "--group-threshold",
            metavar="X",
            help="Embedding types: near duplicates within cosine distance X.",
            show_default="0.03",
        ),
    ] = None,
    part: Annotated[
        str | None,
        typer.Option(
            "--part",
            metavar="I/N",
            help="Write only part I (from 0) of N: its share of the (split, rank) groups, for dlindex merge.",
            show_default=False,
        ),
    ] = None,
    shard: OldShardOption = None,
    memory_budget: Annotated[
        str | None,
        typer.Option(
            "--memory-budget",
            metavar="SIZE",
            envvar="DLINDEX_MEMORY_BUDGET",
            help="Rows held in memory with --split, --world-size or dali; beyond it they wait in OUT_DIR's "
            "temporary folder.",
            show_default="256MiB",
        ),
    ] = None,
    engine: EngineOption = Engine.local,
    address: AddressOption = None,
    ray_tasks: RayTasksOption = 0,
    verify: Annotated[
        bool, typer.Option("--verify", help="Check OUT_DIR against its index.json and the source files; write nothing.")
    ] = False,
    append: Annotated[
        bool,
        typer.Option(
            "--append",
            help="Add to the export in OUT_DIR what changed in the catalog since it was written (its own "
            "format, filters and options; its files untouched); --db defaults to its catalog.",
        ),
    ] = False,
    as_json: JsonFlag = False,
    quiet: QuietFlag = False,
    no_log: NoLogFlag = False,
    at: AtOption = None,
    db: DbOption = None,
) -> None:
    """Write manifests or packed shards (WebDataset, MDS, DALI lists) for training, with index.json.

    dlindex export shards/ --format wds --split train=0.9,val=0.1 --shuffle --seed 1 --world-size 8
    """
    from dlindex.export import ExportOptions, export_catalog, verify_export

    if verify:
        with progress_bar(quiet, unit="img", desc="verify") as update:
            result = verify_export(out_dir, progress=update)
        if as_json:
            print_json(result.as_dict())
        elif not quiet:
            stdout_console.print(f"[bold]checked[/] {out_dir}: {result.summary}")
        for line in result.problems:
            typer.echo(line, err=True)
        note = _moved_on(out_dir, db)
        if note is not None and not quiet:
            typer.echo(f"note: {note}", err=True)
        if not result.ok:
            typer.echo(f"Error: {result.problem_count} problem(s) in {out_dir}", err=True)
            raise typer.Exit(1)
        return
    if append:
        if at is not None or engine is Engine.ray or overwrite or part is not None or shard is not None:
            raise typer.BadParameter("--append extends OUT_DIR on this machine, up to now: give it alone",
                                     param_hint="'--append'")  # fmt: skip
        _append(out_dir, db, read_threads=read_threads, as_json=as_json, quiet=quiet, no_log=no_log)
        return
    if (group is not None or group_by is not None) and (split is None or "=" not in split):
        option = "--group" if group is not None else "--group-by"
        raise typer.BadParameter(
            f"{option} needs --split NAME=FRACTION,... (e.g. train=0.8,val=0.2)", param_hint=f"'{option}'"
        )
    if shard_size is not None and shard_bytes is not None:
        raise typer.BadParameter("give --shard-size or --shard-bytes, not both", param_hint="'--shard-bytes'")
    spec = select.spec(
        per_label=per_label,
        limit=limit,
        seed=seed,
        cache=False,
        classes=classes.value,
    )
    options = ExportOptions(
        format=str(fmt), query=spec, shard_size=shard_size, shard_bytes=shard_bytes, shuffle=shuffle, seed=seed,
        split=split, world_size=world_size, drop_last=drop_last, features=features, texts=texts,
        absolute_paths=absolute_paths, overwrite=overwrite, read_threads=read_threads, workers=workers,
        group=group, group_by=group_by, group_type=group_type, group_max_distance=group_max_distance,
        group_threshold=group_threshold, shard=part_option(part, shard),
        memory_budget=memory_budget,
    )  # fmt: skip
    shown: list[str] = []

    def warn(line: str) -> None:  # the first few by name; the rest are counted below
        if len(shown) < MAX_WARNINGS:
            shown.append(line)
            typer.echo(f"warning: {line}", err=True)

    if at is not None and (engine is Engine.ray or features is not None):
        what = "--engine ray" if engine is Engine.ray else "--features (vectors are kept only as they are now)"
        raise typer.BadParameter(f"--at exports the rows of a past version on this machine, not with {what}",
                                 param_hint="'--at'")  # fmt: skip
    if engine is Engine.ray:
        if texts:
            raise typer.BadParameter(
                "--texts is written on this machine, not with --engine ray yet", param_hint="'--texts'"
            )
        from dlindex.export.onray import export_on_ray

        merged = export_on_ray(db, out_dir, options, address=address, tasks=ray_tasks)
        if as_json:
            print_json(merged.as_dict())
        elif not quiet:
            stdout_console.print(merged.describe(), markup=False, highlight=False)
        return
    if address is not None:
        raise typer.BadParameter("--address names a Ray cluster: give --engine ray with it", param_hint="'--address'")
    with Catalog(db, log=not no_log and at is None, at=at) as catalog, progress_bar(quiet, unit="img") as update:
        summary = export_catalog(
            catalog, out_dir, options, progress=update, warn=warn, note=lambda line: typer.echo(line, err=True)
        )
    if summary.skipped:
        reasons = ", ".join(f"{n} {why.replace('_', ' ')}" for why, n in summary.skipped.items())
        typer.echo(f"skipped {sum(summary.skipped.values())} source file(s), not packed: {reasons}", err=True)
    if as_json:
        print_json(summary.as_dict())
    elif not quiet:
        splits = "  ".join(f"{k} {v}" for k, v in summary.splits.items())
        what = "exported" if options.shard is None else f"exported part {options.shard} of"
        stdout_console.print(
            f"[bold]{what}[/] {summary.samples} samples ({summary.format}) to {summary.out_dir}\n"
            f"  {splits}  shards {summary.shards}  {human_bytes(summary.bytes)}  "
            f"padded {summary.padded}  dropped {summary.dropped}\n  {summary.seconds:.2f} s",
            highlight=False,
            markup=True,
        )
