"""The class list an appended export numbers ``label_id`` by: its own, new classes after it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dlindex.catalog.classes import class_index

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.query.rows import PreparedQuery


def kept_classes(
    catalog: Catalog, kept: Sequence[str] | None, prepared: PreparedQuery
) -> tuple[tuple[str, ...], dict[int, int]]:
    """The class list of an export and labels row -> class index: the selection's own
    (``kept`` None), or for an append ``kept`` (the export's classes, whose ids its shards
    already carry) then the selection's classes it lacks, in their order. A class the catalog
    no longer has keeps its number, so no label_id written before ever changes meaning."""
    now = prepared.classes or ()
    if kept is None:
        return now, prepared.class_index or {}
    names = (*kept, *(name for name in now if name not in set(kept)))
    return names, class_index(catalog, names)
