"""`dlindex demo`: generate a demo tree and run the main job on it end to end."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from dlindex.catalog.connection import open_catalog
from dlindex.cli import scan as scan_command
from dlindex.cli import stats as stats_command
from dlindex.cli._shared import handle_errors, stderr_console, stdout_console
from dlindex.scan.options import ScanOptions
from dlindex.scan.run import scan_tree
from dlindex.stats import catalog_stats


@handle_errors
def demo(
    folder: Annotated[Path, typer.Argument(help="Where to write the demo tree and catalog.")] = Path("dlindex-demo"),
    images: Annotated[int, typer.Option("--images", min=10, help="How many images to generate.")] = 2000,
) -> None:
    """Generate a synthetic image tree and run scan -> stats on it, showing each step.

    dlindex demo /tmp/demo --images 5000
    """
    from dlindex.demo import make_demo_tree

    root = folder / "images"
    db = folder / "catalog.db"
    say = stderr_console.print
    say(f"[bold]1. generating[/] {images} images (about 1% broken) under {root}")
    tree = make_demo_tree(root, images)
    say("   " + ("written" if tree.created else "reused the existing tree"))
    say(f"[bold]2. $ dlindex scan {shlex.quote(str(root))} --db {shlex.quote(str(db))}[/]")
    with open_catalog(db, create=True) as catalog:
        summary = scan_tree(catalog, root, ScanOptions())
    scan_command.print_summary(summary)
    say("[bold]3. $ dlindex scan ... again[/] (incremental: unchanged files cost one stat)")
    with open_catalog(db) as catalog:
        summary = scan_tree(catalog, root, ScanOptions())
    scan_command.print_summary(summary)
    say(f"[bold]4. $ dlindex stats --db {shlex.quote(str(db))}[/]")
    with open_catalog(db) as catalog:
        stats_command.print_stats(catalog_stats(catalog))
    shards = folder / "shards"
    say(
        f"[bold]5. $ dlindex export {shlex.quote(str(shards))} --format wds --split train=0.9,val=0.1 --shuffle --db {shlex.quote(str(db))}[/]"
    )
    from dlindex.export import ExportOptions, export_catalog
    from dlindex.exported.formats import WDS
    from dlindex.loader import WdsDataset

    with open_catalog(db) as catalog:
        exported = export_catalog(
            catalog, shards, ExportOptions(format=WDS.name, split="train=0.9,val=0.1", shuffle=True, overwrite=True)
        )
    stdout_console.print(f"exported {exported.samples} samples to {exported.shards} shards: {exported.splits}")
    say("[bold]6. one batch back through dlindex.loader.WdsDataset[/] (what a DataLoader would get)")
    dataset = WdsDataset(shards, split="train", decode=True)
    batch = [item for _, item in zip(range(8), dataset, strict=False)]
    stdout_console.print(
        "  " + ", ".join(f"{dataset.classes[label]} {image.size[0]}x{image.size[1]}" for image, label in batch)
    )
    say(f"done. Try: dlindex stats --db {shlex.quote(str(db))} --json")
