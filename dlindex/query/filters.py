"""The filters of a query: each option of ``QuerySpec`` as a constant SQL fragment and its bound value.

Values (labels, times, sizes, search words) are always bound parameters; the enum filters are
literals from fixed whitelists (see dlindex.query.rows). ``--text`` selects the samples one of
whose texts matches, through ``image_texts_fts``: the FTS5 table on SQLite, a function of the
same name over PostgreSQL's full-text index on a server (dlindex.catalog.postgres.text_schema).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dlindex.catalog.classes import CLASS_LISTS, canonical_splits, check_split_folders
from dlindex.errors import InputError
from dlindex.query.lookups import label_ids
from dlindex.query.spec import ID_SPAN, PROCESSING_FILTERS, STATUSES, QuerySpec, check_count, parse_when
from dlindex.query.text_search import parse_search

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

_WHERE_LABEL = "image_metadata.label_id = :label_id"
_WHERE_LABELS = "image_metadata.label_id IN (SELECT value FROM json_each(:label_ids))"
_WHERE_SPLIT = "image_metadata.split = :split"
_WHERE_SPLITS = "image_metadata.split IN (SELECT value FROM json_each(:splits))"
_WHERE_HAS_CLASS = {True: "image_metadata.label_id IS NOT NULL", False: "image_metadata.label_id IS NULL"}
_WHERE_SINCE = "image_metadata.created_at >= :since"
_WHERE_UNTIL = "image_metadata.created_at < :until"
_WHERE_MIN_WIDTH = "image_metadata.width >= :min_width"
_WHERE_MIN_HEIGHT = "image_metadata.height >= :min_height"
# The sides of the image turned as its EXIF orientation says (NULL, not known: as stored).
_WHERE_MIN_TURNED_WIDTH = "(CASE WHEN image_metadata.orientation >= 5 THEN image_metadata.height ELSE image_metadata.width END) >= :min_width"  # fmt: skip
_WHERE_MIN_TURNED_HEIGHT = "(CASE WHEN image_metadata.orientation >= 5 THEN image_metadata.width ELSE image_metadata.height END) >= :min_height"
_WHERE_PROCESSED = {True: "image_metadata.processed = 1", False: "image_metadata.processed = 0"}
_WHERE_IDS = "image_metadata.id IN (SELECT value FROM json_each(:only_ids))"
_WHERE_EXCLUDED = {True: "image_metadata.excluded = 1", False: "image_metadata.excluded = 0"}
# The samples with a text the search matches (an IN list, so a sample with two matching
# texts is one row): the index gives its texts' sample ids.
_WHERE_TEXT = "image_metadata.id IN (SELECT image_id FROM image_texts_fts(:text_match))"
# The same filter asked of each sample in turn (its texts by the unique index, each text's
# match by FTS5's own rowid seek): for a LIMIT over a broad search, which stops after LIMIT
# matching samples instead of listing every match first (dlindex.query.filters.text_form).
_WHERE_TEXT_PROBE = """EXISTS (SELECT 1 FROM image_texts WHERE image_texts.image_id = image_metadata.id
    AND EXISTS (SELECT 1 FROM image_texts_fts(:text_match) AS f WHERE f.rowid = image_texts.id))"""
_MATCHES = "SELECT count(*) FROM image_texts_fts(:text_match)"
# Measured at 10^7 rows (docs/benchmarks.md#texts): listing a match costs ~0.6 us, probing a
# sample ~17 us; a LIMIT L at selectivity m/N probes about L*N/m samples.
_PROBE_OVER_LIST = 30


def filters(catalog: Catalog, spec: QuerySpec) -> tuple[list[str], dict[str, Any]]:
    """The WHERE conditions of ``spec`` (ANDed) and their bound values; every error an InputError."""
    where: list[str] = []
    params: dict[str, Any] = {}
    if spec.classes not in CLASS_LISTS:
        raise InputError(f"unknown class list {spec.classes!r}; choose from: {', '.join(CLASS_LISTS)}")
    if spec.labels:
        _one_or_many(
            where, params, label_ids(catalog, spec.labels), (_WHERE_LABEL, "label_id"), (_WHERE_LABELS, "label_ids")
        )
    if spec.split:
        splits = canonical_splits(spec.split)
        check_split_folders(catalog, spec.split)
        _one_or_many(where, params, splits, (_WHERE_SPLIT, "split"), (_WHERE_SPLITS, "splits"))
    if spec.has_class is not None:
        where.append(_WHERE_HAS_CLASS[bool(spec.has_class)])
    if spec.status:
        where.append(_in_literals("image_metadata.status", spec.status, STATUSES, "status"))
    if spec.processed is not None:
        where.append(_WHERE_PROCESSED[bool(spec.processed)])
    if spec.processing_status:
        where.append(_processing_status(spec.processing_status))
    if spec.excluded is not None:
        where.append(_WHERE_EXCLUDED[bool(spec.excluded)])
    if spec.ids is not None:
        where.append(_WHERE_IDS)
        params["only_ids"] = json.dumps([int(i) for i in spec.ids])
    since = parse_when(spec.since, "--since") if spec.since is not None else None
    until = parse_when(spec.until, "--until") if spec.until is not None else None
    if since is not None and until is not None and since >= until:
        raise InputError(f"empty time range: --since {since} is not before --until {until}")
    if since is not None:
        where.append(_WHERE_SINCE)
        params["since"] = since
    if until is not None:
        where.append(_WHERE_UNTIL)
        params["until"] = until
    sides = (
        (("min_width", _WHERE_MIN_TURNED_WIDTH), ("min_height", _WHERE_MIN_TURNED_HEIGHT))
        if spec.exif_orient
        else (("min_width", _WHERE_MIN_WIDTH), ("min_height", _WHERE_MIN_HEIGHT))
    )
    for name, fragment in sides:
        value = getattr(spec, name)
        if value is not None:
            params[name] = check_count("--" + name.replace("_", "-"), value, 0)
            where.append(fragment)
    if spec.text is not None:
        where.append(_WHERE_TEXT)
        params["text_match"] = text_match(catalog, spec.text)
    return where, params


def _one_or_many(
    where: list[str], params: dict[str, Any], values: Sequence[Any], one: tuple[str, str], many: tuple[str, str]
) -> None:
    """Filter by ``column = :one`` for one value, by ``column IN (json_each(:many))`` for several."""
    fragment, name = one if len(values) == 1 else many
    where.append(fragment)
    params[name] = values[0] if len(values) == 1 else json.dumps(list(values))


def _in_literals(column: str, values: Sequence[str], allowed: tuple[str, ...], what: str) -> str:
    """``column = 'a'`` or ``column IN ('a', 'b')`` from whitelisted constants only (QuerySpec
    has refused any other value, saying which option takes it)."""
    assert set(values) <= set(allowed), (what, values)
    chosen = [v for v in allowed if v in values]  # whitelist order: one template per set
    literals = ", ".join("'" + v + "'" for v in chosen)
    return f"{column} = {literals}" if len(chosen) == 1 else f"{column} IN ({literals})"


def _processing_status(values: Sequence[str]) -> str:
    """The processing_status filter; "none" is the rows mark never gave one (NULL)."""
    chosen = [v for v in values if v != "none"]
    if not chosen:
        return "image_metadata.processing_status IS NULL"
    literals = _in_literals("image_metadata.processing_status", chosen, PROCESSING_FILTERS, "processing status")
    return f"({literals} OR image_metadata.processing_status IS NULL)" if "none" in values else literals


def text_form(catalog: Catalog, where: list[str], params: dict[str, Any], rows_wanted: int) -> list[str]:
    """``where`` with the text filter asked per sample where that is cheaper: a file catalog, a
    query wanting ``rows_wanted`` rows in id order, and so many matches (counted by the index,
    a few ms) that listing them all costs more than probing the samples up to the limit."""
    if _WHERE_TEXT not in where or catalog.backend.is_server:
        return where
    ((matches,),) = catalog.read(_MATCHES, {"text_match": params["text_match"]})
    ((low, high),) = catalog.read(ID_SPAN)
    if not matches or low is None or matches * matches <= _PROBE_OVER_LIST * rows_wanted * (high - low + 1):
        return where
    return [_WHERE_TEXT_PROBE if w == _WHERE_TEXT else w for w in where]


def text_match(catalog: Catalog, text: str) -> str:
    """``--text`` as the catalog's full-text index reads it (checked: one line on a bad search)."""
    search = parse_search(text)
    if catalog.pinned is not None:
        raise InputError(
            "--text searches the texts as they are now (texts keep no history yet); it cannot be combined with --at"
        )
    if catalog.backend.is_server:
        return search.server()
    if not catalog.backend.has_text_search(catalog.conn):
        raise InputError(
            f"catalog {catalog.path} has no full-text index: the SQLite that made it was built without FTS5"
        )
    return search.fts5()
