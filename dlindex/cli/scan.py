"""`dlindex scan ROOT`: index an image tree into the catalog."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from dlindex.catalog.connection import Catalog
from dlindex.cli._shared import (
    AddressOption,
    DbOption,
    Engine,
    EngineOption,
    JsonFlag,
    NoLogFlag,
    OldShardOption,
    PartOption,
    QuietFlag,
    RayTasksOption,
    WaitOption,
    handle_errors,
    part_option,
    print_json,
    progress_bar,
    stderr_console,
    stdout_console,
)
from dlindex.errors import ExitCode
from dlindex.scan.listing import DEFAULT_EXTENSIONS
from dlindex.scan.options import ScanOptions, ScanSummary, check_root


@handle_errors
def scan(
    root: Annotated[
        Path,
        typer.Argument(
            help="Folder to index (class-per-folder: ROOT/LABEL/..., or pre-split: ROOT/SPLIT/LABEL/...).",
            show_default=False,
        ),
    ],
    db: DbOption = None,
    wait: WaitOption = None,  # applied by the option itself to every catalog opened
    ext: Annotated[
        list[str] | None,
        typer.Option(
            "--ext", help="Image extension to index (repeatable; replaces the default list).", show_default=False
        ),
    ] = None,
    exclude: Annotated[
        list[str] | None,
        typer.Option("--exclude", help="Glob of paths or names to skip (repeatable).", show_default=False),
    ] = None,
    hidden: Annotated[bool, typer.Option("--hidden", help="Include hidden files and folders.")] = False,
    follow_symlinks: Annotated[
        bool,
        typer.Option(
            "--follow-symlinks/--no-follow-symlinks",
            help="Follow symbolic links, as ImageFolder does (loops are detected; each file is indexed once).",
        ),
    ] = True,
    no_split_folders: Annotated[
        bool,
        typer.Option(
            "--no-split-folders",
            help="ROOT/train, ROOT/val... are classes, not split folders (by default they name each sample's split).",
        ),
    ] = False,
    labels: Annotated[
        Path | None,
        typer.Option("--labels", help="CSV file with columns path,label overriding folder labels.", show_default=False),
    ] = None,
    verify: Annotated[bool, typer.Option("--verify", help="Also fully decode every probed image with Pillow.")] = False,
    max_pixels: Annotated[
        int,
        typer.Option(
            "--max-pixels",
            min=1,
            help="Decode limit; headers above twice this are recorded corrupt (decompression bombs).",
        ),
    ] = ScanOptions().max_pixels,
    workers: Annotated[int, typer.Option("--workers", "-w", min=0, help="Probe processes; 0 means one per CPU.")] = 0,
    io_threads: Annotated[
        int, typer.Option("--io-threads", min=1, help="Reads in flight per worker (helps cold caches).")
    ] = ScanOptions().io_threads,
    prune: Annotated[
        bool, typer.Option("--prune", help="Delete rows of files gone from disk instead of marking them missing.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Re-read every file, even unchanged ones (those found the same count as re-read)."
        ),
    ] = False,
    texts: Annotated[
        bool,
        typer.Option(
            "--texts",
            help="Also catalogue each image's sidecar texts: NAME.txt, NAME.caption, NAME.json (a caption field).",
        ),
    ] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 3 if any file could not be read.")] = False,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            help="Then keep the catalog current: rescan on every change (and every --interval), "
            "computing automatic feature types; one line a batch; Ctrl-C stops.",
        ),
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.001, help="With --watch: rescan at least every this many seconds.")
    ] = 300.0,
    events: Annotated[
        bool,
        typer.Option(
            "--events/--no-events", help="With --watch: file-system events (--no-events: timed rescans only, e.g. NFS)."
        ),
    ] = True,
    part: PartOption = None,
    shard: OldShardOption = None,
    engine: EngineOption = Engine.local,
    address: AddressOption = None,
    ray_tasks: RayTasksOption = 0,
    as_json: JsonFlag = False,
    quiet: QuietFlag = False,
    no_log: NoLogFlag = False,
) -> None:
    """Index an image tree into the catalog (incremental, parallel).

    dlindex scan ~/data/imagenet/train --db train.db
    """
    options = ScanOptions(
        extensions=tuple(e.lower().lstrip(".") for e in ext) if ext else DEFAULT_EXTENSIONS,
        hidden=hidden,
        exclude=tuple(exclude or ()),
        follow_symlinks=follow_symlinks,
        split_folders=not no_split_folders,
        labels_file=labels,
        verify=verify,
        max_pixels=max_pixels,
        workers=workers,
        io_threads=io_threads,
        prune=prune,
        force=force,
        texts=texts,
        part=part_option(part, shard),
    )
    check_root(root)  # a bad ROOT must not leave a new catalog file behind
    if watch:
        if engine is Engine.ray or options.part is not None or texts:
            raise typer.BadParameter(
                "--watch scans here, whole: not with --engine ray or --part (nor, yet, --texts)", param_hint="'--watch'"
            )
        _watch(db, root, options, WatchChoice(interval, events, as_json), no_log)
        return
    if engine is Engine.ray:
        if texts:
            raise typer.BadParameter(
                "--texts cannot go with --engine ray yet: scan on Ray, then run dlindex scan ROOT --texts",
                param_hint="'--texts'",
            )
        from dlindex.scan.onray import scan_on_ray

        on_ray = scan_on_ray(db, root, options, address=address, tasks=ray_tasks)
        summary, data = on_ray.scan, on_ray.as_dict()
    else:
        if address is not None:
            raise typer.BadParameter(
                "--address names a Ray cluster: give --engine ray with it", param_hint="'--address'"
            )
        with Catalog(db, create=True, log=not no_log) as catalog:
            catalog.check_ahead()  # runs while the scan's machinery is imported
            from dlindex.scan.run import scan_tree

            with progress_bar(quiet, unit="img", desc="scan", smoothing=0.1) as update:
                summary = scan_tree(catalog, root, options, progress=update)
        data = summary.as_dict()
    if as_json:
        print_json(data)
    elif not quiet:
        print_summary(summary)
    if not quiet and summary.error_samples:
        for path, message in summary.error_samples[:10]:
            stderr_console.print(f"error: {path!r}: {message}", markup=False)
        if summary.errors > 10:
            stderr_console.print(f"... and {summary.errors - 10} more errors (see --json)", markup=False)
    if summary.unknown_label_paths:  # a typo in the CSV would otherwise label nothing, silently
        shown = ", ".join(summary.unknown_label_examples)
        more = ", ..." if summary.unknown_label_paths > len(summary.unknown_label_examples) else ""
        stderr_console.print(f"{summary.unknown_label_paths} path(s) in {labels} match no image under {summary.root}: {shown}{more}",
                             markup=False, highlight=False, soft_wrap=True)  # fmt: skip
    if strict and summary.errors:
        raise typer.Exit(ExitCode.PARTIAL)


@dataclass(frozen=True)
class WatchChoice:
    interval: float
    events: bool
    as_json: bool


def _watch(db: str | None, root: Path, options: ScanOptions, choice: WatchChoice, no_log: bool) -> None:
    """The watcher in the foreground: a line per batch; Ctrl-C (or SIGTERM) ends it with 130."""
    from dlindex.engines.local import sigterm_as_interrupt
    from dlindex.errors import Interrupted
    from dlindex.scan.watch import WatchOptions, watch_tree

    watching = WatchOptions(interval_s=choice.interval, events=choice.events)
    restore = sigterm_as_interrupt()
    batches = [0]

    def said(batch: Any) -> None:
        batches[0] += 1
        if choice.as_json:  # every batch, as a JSON line
            print(json.dumps(batch.as_dict()), flush=True)
        elif batch.number == 0 or batch.changed:  # a line per batch that changed something
            stdout_console.print(batch.describe(), markup=False, highlight=False)

    try:
        with Catalog(db, create=True, log=not no_log) as catalog:
            watch_tree(catalog, root, options, watching, on_batch=said)
    except (KeyboardInterrupt, Interrupted):
        stderr_console.print(f"watch stopped after {batches[0]} batch(es); the catalog is consistent", markup=False)
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    finally:
        restore()


def print_summary(s: ScanSummary) -> None:
    stdout_console.print(
        f"[bold]scanned[/] {s.root}\n"
        f"  seen {s.seen}  new {s.new}  changed {s.changed}  unchanged {s.unchanged}  "
        + (f"re-read {s.reread}  " if s.reread else "")
        + f"missing {s.missing}\n"
        f"  corrupt {s.corrupt}  skipped {s.skipped}  errors {s.errors}"
        + (f"  relabeled {s.relabeled}" if s.relabeled else "")
        + (f"  pruned {s.pruned}" if s.pruned else "")
        + (f"\n  skipped: {', '.join(f'{r} {n}' for r, n in s.skipped_by_reason.items())}" if s.skipped else "")
        + (_texts_line(s.texts) if s.texts is not None else "")
        + f"\n  {s.seconds:.2f} s, {s.files_per_s:,.0f} files/s",
    )


def _texts_line(texts: dict[str, Any]) -> str:
    skipped = "".join(f", {reason} {n}" for reason, n in texts["skipped"].items())
    return f"\n  texts: sidecars read {texts['read']}  unchanged {texts['unchanged']}  removed {texts['removed']}" + (
        f"  (no text: {skipped[2:]})" if skipped else ""
    )
