"""Naming samples on the command line (an id or a path) and describing them in output rows."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from dlindex.catalog.paths import AMBIGUOUS, UNKNOWN, resolve_paths, root_prefixes
from dlindex.catalog.sqlite.connect import INT64_MAX
from dlindex.errors import InputError
from dlindex.query.mark import read_records

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.features.neighbours import Neighbour

_BY_ID = "SELECT id FROM image_metadata WHERE id = ?"
_DESCRIBE = (
    "SELECT image_metadata.id, labels.name, image_metadata.root_id, image_metadata.file_path, "
    "image_metadata.file_path_bytes FROM image_metadata LEFT JOIN labels ON labels.id = image_metadata.label_id "
    "WHERE image_metadata.id IN (SELECT value FROM json_each(?))"
)
_CHUNK = 10_000


def resolve_sample(catalog: Catalog, target: str) -> int:
    """The id of a sample named by its id, its absolute path, or its path under its root."""
    text = target.strip()
    if text.isdigit():
        if _rowid(text) is None:
            raise InputError(f"no sample with id {text[:30]}: ids go up to {INT64_MAX}")
        if catalog.conn.execute(_BY_ID, (int(text),)).fetchone() is None:
            raise InputError(f"no sample with id {text} in the catalog (a file named {text}? write ./{text})")
        return int(text)
    raw = os.fsencode(text)
    (found,) = resolve_paths(catalog, [raw])
    if found == AMBIGUOUS:
        raise InputError(f"{text} is under several roots; give its absolute path or its id")
    if found == UNKNOWN:
        if raw.startswith(b"/"):
            raise InputError(f"{text} is not in the catalog")
        raise InputError(f"{text} is not in the catalog (give an id, or a path as dlindex query prints it)")
    return found


def describe(catalog: Catalog, ids: Iterable[int]) -> dict[int, tuple[str, str]]:
    """(label, absolute path) of each id."""
    roots = {root_id: prefix for prefix, root_id in root_prefixes(catalog.conn)}
    wanted = sorted(set(ids))
    out: dict[int, tuple[str, str]] = {}
    for start in range(0, len(wanted), _CHUNK):
        chunk = json.dumps(wanted[start : start + _CHUNK])
        for image_id, label, root_id, file_path, raw in catalog.read(_DESCRIBE, (chunk,)):
            name = bytes(raw) if raw is not None else os.fsencode(file_path)
            out[int(image_id)] = (label, os.fsdecode(roots.get(root_id, b"") + name))
    return out


def neighbour_rows(catalog: Catalog, results: Sequence[Sequence[Neighbour]]) -> Iterator[dict[str, Any]]:
    """Output rows: query, rank, id, distance, label, path."""
    info = describe(catalog, (n.id for answer in results for n in answer))
    for answer in results:
        for n in answer:
            label, path = info.get(n.id, (None, None))
            yield {"query": n.query, "rank": n.rank, "id": n.id, "distance": n.distance, "label": label, "path": path}


def read_sample_ids(stream: BinaryIO, source: str) -> list[int]:
    """The sample ids of ``similar --ids FILE``: one per line, blank lines skipped, each line
    bounded (``read_records``) so a file without newlines is never read whole.

    Raises:
        InputError: a line that is not an id, or no id at all.
    """
    ids = []
    for number, record in enumerate(read_records(stream), start=1):
        text = record.strip()
        if not text:
            continue
        sample_id = _rowid(text)
        if sample_id is None:
            shown = text[:40].decode("utf-8", "backslashreplace")
            raise InputError(f"{source}, line {number}: {shown!r} is not a sample id")
        ids.append(sample_id)
    if not ids:
        raise InputError(f"{source} holds no ids")
    return ids


def _rowid(text: str | bytes) -> int | None:
    """The id ``text`` spells in decimal digits, or None: not digits, or beyond any SQLite rowid."""
    if not (text.isascii() and text.isdigit()) or len(text) > 19:  # 19 digits bound int() before the range
        return None
    value = int(text)
    return value if value <= INT64_MAX else None
