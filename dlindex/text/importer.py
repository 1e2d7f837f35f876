"""``dlindex text import FILE``: attach texts from a file to the samples it names.

All or nothing: every record is read, checked and its key resolved first (staged in temporary
tables, nothing written to the catalog); a bad record, or a key that names no sample, stops
the import with one line and the catalog as it was (``skip_unknown`` writes the rest). Then
one write transaction makes each named sample's texts of this *source* exactly the file's,
in file order (``seq`` 0, 1, ...): importing the same file again changes nothing, an edited
file changes what it edits (dlindex.catalog.texts).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

from dlindex.catalog.paths import AMBIGUOUS, NO_ROOT, UNKNOWN, path_key, resolve_paths, root_prefixes
from dlindex.catalog.sqlite.connect import INT64_MAX, INT64_MIN, rollback
from dlindex.catalog.texts import apply_texts, end_staging, start_staging
from dlindex.errors import InputError
from dlindex.text.records import Record, file_format, read_file

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

_CHUNK = 10_000
_EXAMPLES = 5
# A source names where texts came from: a word, so it is safe in messages, columns and members.
_SOURCE = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")
_CREATE = (
    "CREATE TEMP TABLE IF NOT EXISTS text_import (n INTEGER PRIMARY KEY, image_id INTEGER NOT NULL, text TEXT NOT NULL)"
)
_CLEAR = "DELETE FROM temp.text_import"
_STAGE = "INSERT INTO temp.text_import (n, image_id, text) VALUES (?, ?, ?)"
_UNKNOWN = (
    "FROM temp.text_import AS s WHERE NOT EXISTS (SELECT 1 FROM image_metadata WHERE image_metadata.id = s.image_id)"
)
_UNKNOWN_COUNT = "SELECT count(*) " + _UNKNOWN
_UNKNOWN_IDS = "SELECT DISTINCT image_id " + _UNKNOWN + " ORDER BY image_id LIMIT :limit"
_DROP_UNKNOWN = """DELETE FROM temp.text_import
    WHERE NOT EXISTS (SELECT 1 FROM image_metadata WHERE image_metadata.id = text_import.image_id)"""
# Each sample's texts numbered in file order.
_RANK = """INSERT INTO temp.text_rows (image_id, source, seq, text, encoding, file_bytes, file_mtime_ns)
    SELECT image_id, :source, row_number() OVER (PARTITION BY image_id ORDER BY n) - 1, text, 'utf-8', NULL, NULL
    FROM temp.text_import"""
_COUNTS = "SELECT count(*), count(DISTINCT image_id) FROM temp.text_import"
_ANALYZE = "ANALYZE image_texts"
_ANALYZE_AFTER = 10_000


@dataclass(frozen=True)
class TextImport:
    """What one ``text import`` did."""

    file: str
    source: str
    texts: int  # texts in the file (for known samples)
    samples: int  # samples they belong to
    added: int  # texts written (new or changed)
    removed: int  # texts of this source the file no longer has, or changed
    unknown: int  # records skipped for a key naming no sample (skip_unknown)


def default_source(path: Path) -> str:
    """The file's name without its suffix, made a valid source name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem)[:64].lstrip(".-") or "import"


def check_source(source: str) -> str:
    if not _SOURCE.match(source):
        raise InputError(
            f"--source {source[:40]!r}: a source is 1-64 letters, digits, '_', '.' or '-', not starting with '.' or '-' "
            "(a name starting with '.' is a sidecar's suffix, which scan sets)"
        )
    return source


def import_texts(
    catalog: Catalog,
    file: Path | str,
    *,
    source: str | None = None,
    key_field: str | None = None,
    text_field: str | None = None,
    fmt: str | None = None,
    skip_unknown: bool = False,
) -> TextImport:
    """Attach the texts of ``file`` to the samples it names (see the module's docstring)."""
    path = Path(file)
    source = check_source(source if source is not None else default_source(path))
    records = read_file(path, file_format(path, fmt), key_field, text_field)
    catalog.ensure_writable()
    conn = catalog.conn
    conn.execute("BEGIN")  # temporary tables only: no lock on the catalog is taken yet
    try:
        conn.execute(_CREATE)
        conn.execute(_CLEAR)
        start_staging(conn)
        unknown, examples = _stage(catalog, records)
        unknown += _unknown_ids(catalog, examples, skip_unknown)
        if unknown and not skip_unknown:
            raise InputError(
                f"{path}: {unknown:,} record(s) name no sample in the catalog ({', '.join(examples)}); "
                "nothing was written (--skip-unknown writes the rest)"
            )
        texts, samples = conn.execute(_COUNTS).fetchone()
        conn.execute(_RANK, {"source": source})
        conn.execute("COMMIT")
    except BaseException:
        rollback(conn)
        raise
    try:
        with catalog.write_transaction() as tx:
            changes = apply_texts(tx)
            tx.execute(_CLEAR)
    finally:
        end_staging(catalog, conn)
        catalog.backend.end_temp_table(conn, "text_import")
    if catalog.backend.is_server and changes.added + changes.removed >= _ANALYZE_AFTER:
        # The server's planner has no statistics of new texts until autovacuum comes by: a
        # search right after a big import was planned blind (10^6 texts: 8 ms -> 760 ms).
        conn.execute(_ANALYZE)
    return TextImport(str(path), source, int(texts), int(samples), changes.added, changes.removed, unknown)


def _stage(catalog: Catalog, records: Iterator[Record]) -> tuple[int, list[str]]:
    """Stage every record's texts with the sample its key names; (paths naming none, examples)."""
    conn = catalog.conn
    prefixes = root_prefixes(conn)
    number = unknown = 0
    examples: list[str] = []
    while chunk := list(islice(records, _CHUNK)):
        paths = [(at, os.fsencode(key)) for at, (_, key, _) in enumerate(chunk) if isinstance(key, str)]
        ids = dict(zip((at for at, _ in paths), resolve_paths(catalog, [raw for _, raw in paths]), strict=True))
        rows = []
        for at, (where, key, texts) in enumerate(chunk):
            if isinstance(key, int):
                if not INT64_MIN <= key <= INT64_MAX:
                    raise InputError(f"{where}: id {key} is outside the 64-bit range of sample ids")
                image_id = key
            else:
                image_id = ids[at]
                if image_id == AMBIGUOUS:
                    raise InputError(f"{where}: {key!r} names files under several roots; give the absolute path")
                if image_id == UNKNOWN:
                    unknown += 1
                    if len(examples) < _EXAMPLES:
                        under = path_key(os.fsencode(key), prefixes)[0] == NO_ROOT
                        examples.append(repr(key) + (" (under no scanned root)" if under else ""))
                    continue
            for text in texts:
                number += 1
                rows.append((number, image_id, text))
        catalog.backend.bulk_insert(conn, "text_import", ("n", "image_id", "text"), rows, statement=_STAGE)
    return unknown, examples


def _unknown_ids(catalog: Catalog, examples: list[str], skip: bool) -> int:
    """Count the staged texts whose id names no sample, add a few ids to ``examples``; drop them if ``skip``."""
    conn = catalog.conn
    ((count,),) = conn.execute(_UNKNOWN_COUNT).fetchall()
    if count:
        wanted = max(0, _EXAMPLES - len(examples))
        examples.extend(f"id {row[0]}" for row in conn.execute(_UNKNOWN_IDS, {"limit": wanted}))
        if skip:
            conn.execute(_DROP_UNKNOWN)
    return int(count)
