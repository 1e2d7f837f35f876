"""`dlindex features compute|auto|import|export|list|show|failures|drop`: the feature cache
(compute and auto in dlindex.cli.features_compute)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from dlindex.catalog.connection import Catalog
from dlindex.cli._feature_options import DtypeOption, TypeOption
from dlindex.cli._output import FormatOption, emit_rows, resolve_format
from dlindex.cli._shared import (  # fmt: skip
    DbOption,
    JsonFlag,
    NoLogFlag,
    QuietFlag,
    WaitOption,
    handle_errors,
    human_bytes,
    print_json,
    stdout_console,
)
from dlindex.cli.features_compute import auto, compute

app = typer.Typer(
    name="features",
    help="Compute, import, export, list, show and drop per-image feature vectors; list failures.",
    no_args_is_help=True,
)
app.command("compute")(compute)
app.command("auto")(auto)


@app.command("import")
@handle_errors
def import_(
    file: Annotated[
        Path,
        typer.Argument(
            metavar="FILE",
            help=".npy (with --ids), .npz (ids, vectors), .parquet or .jsonl (id or file_path, vector).",
            show_default=False,
        ),
    ],
    feature_type: TypeOption,
    ids: Annotated[
        Path | None,
        typer.Option(
            "--ids", metavar="FILE", help="For .npy: sample ids, one per line, or an integer .npy.", show_default=False
        ),
    ] = None,
    column: Annotated[str, typer.Option("--column", help="Vector column of Parquet and JSONL files.")] = "vector",
    dtype: DtypeOption = None,
    concurrent: Annotated[
        bool,
        typer.Option(
            "--concurrent",
            help="Let other processes open the catalog during a large import (WAL: every page is written twice).",
        ),
    ] = False,
    max_bytes: Annotated[
        str,
        typer.Option(
            "--max-bytes",
            metavar="SIZE",
            help="Refuse files whose arrays take more memory than this to read (e.g. 8GiB, 500MB).",
        ),
    ] = "8GiB",
    as_json: JsonFlag = False,
    quiet: QuietFlag = False,
    no_log: NoLogFlag = False,
    db: DbOption = None,
    wait: WaitOption = None,  # applied by the option itself to every catalog opened
) -> None:
    """Store vectors computed elsewhere; all of them, or none if any is bad.

    dlindex features import --type clip_b32 embeddings.npz
    """
    from dlindex.export import parse_size
    from dlindex.features import import_features

    limit = parse_size(max_bytes)
    with Catalog(db, log=not no_log) as catalog:
        s = import_features(
            catalog, feature_type, file, ids_file=ids, column=column, dtype=dtype.value if dtype else None,
            concurrent=concurrent, max_bytes=limit if limit is not None else 0,
        )  # fmt: skip
    if as_json:
        print_json(s.as_dict())
    elif not quiet:
        stdout_console.print(
            f"imported {s.imported:,} {s.feature_type} vectors (dim {s.dim}, {s.dtype}, {human_bytes(s.bytes)}) "
            f"in {s.seconds:.2f} s, {s.mb_per_s:,.0f} MB/s", markup=False, highlight=False,
        )  # fmt: skip


@app.command("export")
@handle_errors
def export(
    out: Annotated[
        Path, typer.Argument(metavar="OUT.npz", help="File to write (replaced atomically).", show_default=False)
    ],
    feature_type: TypeOption,
    as_json: JsonFlag = False,
    no_log: NoLogFlag = False,
    db: DbOption = None,
) -> None:
    """Write a type's vectors to an .npz file with arrays ids and vectors.

    dlindex features export --type colorhist colorhist.npz && python -c "import numpy; print(numpy.load('colorhist.npz')['vectors'].shape)"
    """
    from dlindex.features import export_features

    with Catalog(db, log=not no_log) as catalog:
        s = export_features(catalog, feature_type, out)
    if as_json:
        print_json(s.as_dict())
    else:
        stdout_console.print(
            f"wrote {s.vectors:,} vectors (dim {s.dim}, {s.dtype}) to {s.path}, {human_bytes(s.bytes)}",
            markup=False,
            highlight=False,
        )


@app.command("list")
@handle_errors
def list_(fmt: FormatOption = None, db: DbOption = None) -> None:
    """Feature types with their dim, dtype, extractor and counts of vectors and failures.

    dlindex features list --format jsonl | jq -r .name
    """
    from dlindex.features import list_feature_types

    with Catalog(db) as catalog:
        infos = [info.as_dict() for info in list_feature_types(catalog)]
    columns = (
        "name",
        "dim",
        "dtype",
        "extractor",
        "auto",
        "vectors",
        "stale",
        "failed",
        "queued",
        "version",
        "created_at",
    )
    emit_rows(infos, resolve_format(fmt), columns)


@app.command("show")
@handle_errors
def show(
    sample: Annotated[str, typer.Argument(metavar="ID|PATH", help="A sample id, or its path.", show_default=False)],
    feature_type: Annotated[
        str | None, typer.Option("--type", "-t", metavar="NAME", help="Only this feature type.", show_default=False)
    ] = None,
    as_json: JsonFlag = False,
    db: DbOption = None,
) -> None:
    """The vectors (and failures) of one sample.

    dlindex features show 42 --type colorhist --json | jq '.vectors.colorhist.vector[:8]'
    """
    from dlindex.features import show_features
    from dlindex.features.samples import resolve_sample

    with Catalog(db) as catalog:
        s = show_features(catalog, resolve_sample(catalog, sample), feature_type)
    if as_json:
        print_json(s.as_dict())
        return
    stdout_console.print(
        f"sample {s.id} ({s.label}, {s.status}, processing {s.processing_status or '-'})", markup=False, highlight=False
    )
    for name, v in s.vectors.items():
        head = ", ".join(f"{x:.4g}" for x in v["vector"][:8]) + (", ..." if len(v["vector"]) > 8 else "")
        stdout_console.print(f"  {name}: dim {v['dim']} {v['dtype']} [{head}]", markup=False, highlight=False)
    for name, f in s.failures.items():
        stdout_console.print(f"  {name}: failed: {f['error']}", markup=False, highlight=False)
    for name in s.queued:
        stdout_console.print(f"  {name}: queued", markup=False, highlight=False)
    if not s.vectors and not s.failures and not s.queued:
        stdout_console.print("  no vectors", markup=False)


class State(StrEnum):
    failed = "failed"
    queued = "queued"


@app.command("failures")
@handle_errors
def failures(
    feature_type: TypeOption,
    state: Annotated[
        list[State] | None,
        typer.Option("--state", help="failed (default), queued, or both when repeated.", show_default=False),
    ] = None,
    fmt: FormatOption = None,
    db: DbOption = None,
) -> None:
    """Samples whose extraction failed (with the error), or that a run left queued.

    dlindex features failures --type colorhist --format jsonl | jq -r .path
    """
    from dlindex.features import get_type
    from dlindex.features.compute_state import state_rows

    with Catalog(db) as catalog:
        name = get_type(catalog, feature_type).name
        states = [s.value for s in state or [State.failed]]
        emit_rows(
            state_rows(catalog, name, states),
            resolve_format(fmt),
            ("id", "state", "error", "updated_at", "label", "path"),
        )


@app.command("drop")
@handle_errors
def drop(
    feature_type: TypeOption,
    as_json: JsonFlag = False,
    db: DbOption = None,
    wait: WaitOption = None,  # applied by the option itself to every catalog opened
) -> None:
    """Delete a feature type with all its vectors.

    dlindex features drop --type colorhist && dlindex features compute --type colorhist
    """
    from dlindex.features import drop_feature_type

    with Catalog(db) as catalog:
        s = drop_feature_type(catalog, feature_type)
    if as_json:
        print_json(s.as_dict())
    else:
        stdout_console.print(
            f"dropped {s.feature_type}: {s.vectors:,} vectors, {s.failed:,} failure records", markup=False
        )
