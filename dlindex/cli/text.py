"""`dlindex text import|list`: the texts (captions, descriptions) that come with the samples."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from dlindex.catalog.connection import Catalog
from dlindex.cli._output import FormatOption, emit_rows, resolve_format
from dlindex.cli._shared import DbOption, JsonFlag, NoLogFlag, QuietFlag, handle_errors, print_json, stdout_console

app = typer.Typer(
    name="text",
    help="Import and list the texts (captions, alt texts, descriptions) that come with the samples.",
    no_args_is_help=True,
)


@app.command("import")
@handle_errors
def import_(
    file: Annotated[
        Path,
        typer.Argument(
            metavar="FILE",
            help="CSV/TSV (a header row), JSONL, JSON (a list, or COCO captions) or Parquet; a record's key is a "
            "sample id or a path, its text a string or a list of strings.",
            show_default=False,
        ),
    ],
    source: Annotated[
        str | None,
        typer.Option(
            "--source",
            help="Name these texts' source: an import replaces the named samples' texts of the same source.",
            show_default="the file's name without its suffix",
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option("--key", help="The key field (default: id, path, file_path, file_name...).", show_default=False),
    ] = None,
    field: Annotated[
        str | None,
        typer.Option("--field", help="The text field (default: text, caption, description...).", show_default=False),
    ] = None,
    file_format: Annotated[
        str | None,
        typer.Option("--format", help="csv, tsv, jsonl, json or parquet.", show_default="from the suffix"),
    ] = None,
    skip_unknown: Annotated[
        bool,
        typer.Option("--skip-unknown", help="Write the texts of known samples when some keys name none."),
    ] = False,
    as_json: JsonFlag = False,
    quiet: QuietFlag = False,
    no_log: NoLogFlag = False,
    db: DbOption = None,
) -> None:
    """Attach texts from a file to the samples it names, all or nothing.

    dlindex text import captions_train2017.json --source coco
    """
    from dlindex.text.importer import import_texts

    with Catalog(db, log=not no_log) as catalog:
        done = import_texts(
            catalog, file, source=source, key_field=key, text_field=field, fmt=file_format, skip_unknown=skip_unknown
        )
    if as_json:
        print_json(asdict(done))
    elif not quiet:
        skipped = f"; {done.unknown:,} naming no sample skipped" if done.unknown else ""
        stdout_console.print(
            f"{done.texts:,} texts for {done.samples:,} samples from {done.file} (source {done.source!r}): "
            f"{done.added:,} added, {done.removed:,} removed{skipped}",
            markup=False,
            highlight=False,
        )


@app.command("list")
@handle_errors
def list_(
    ids: Annotated[list[int], typer.Argument(metavar="ID...", help="Sample ids.", show_default=False)],
    fmt: FormatOption = None,
    db: DbOption = None,
) -> None:
    """Print the texts of these samples: id, source, seq, text.

    dlindex text list 12 57
    """
    from dlindex.catalog.texts import texts_of

    with Catalog(db, log=False) as catalog:
        found = texts_of(catalog, ids)
    rows = ({"id": i, **t} for i in dict.fromkeys(ids) for t in found.get(i, []))
    emit_rows(rows, resolve_format(fmt), ("id", "source", "seq", "text"))


@app.command("reindex")
@handle_errors
def reindex(db: DbOption = None) -> None:
    """Rebuild the full-text index of the texts from the texts (after check reports it damaged).

    dlindex text reindex --db train.db
    """
    from dlindex.catalog.texts import reindex as rebuild

    with Catalog(db, log=False) as catalog:
        rebuild(catalog)
    stdout_console.print("rebuilt the full-text index of the texts", markup=False, highlight=False)
