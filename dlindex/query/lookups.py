"""Small tables a query reads beside its rows (labels, classes, roots), reloaded on catalog change."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar, cast

from dlindex.catalog.classes import class_index, class_list
from dlindex.catalog.paths import root_path
from dlindex.errors import InputError

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.query.spec import QuerySpec

_LABEL_IDS = "SELECT id, name FROM labels WHERE name IN (SELECT value FROM json_each(:names))"
_LABEL_NAMES = "SELECT id, name FROM labels"
_ROOTS = "SELECT id, path, path_bytes FROM roots"
T = TypeVar("T")


def label_ids(catalog: Catalog, names: Sequence[str]) -> list[int]:
    """The labels rows of ``names``, sorted; InputError (with close matches) for an unknown one."""
    found = {name: id_ for id_, name in catalog.read(_LABEL_IDS, {"names": json.dumps(list(names))})}
    for name in names:
        if name not in found:
            import difflib  # only for this message

            known = [n for _, n in catalog.conn.execute(_LABEL_NAMES)]
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else f" ({len(known)} labels known)"
            raise InputError(f"unknown label {name!r}{hint}")
    return sorted({found[name] for name in names})


def label_names(catalog: Catalog) -> dict[int, str]:
    """Label name of each labels row."""
    return _per_change(catalog, "labels", lambda: {int(id_): str(name) for id_, name in catalog.read(_LABEL_NAMES)})


def classes_of(catalog: Catalog, spec: QuerySpec) -> tuple[tuple[str, ...], str]:
    """The class list ``label_id`` indexes for ``spec``, and which list it is."""
    if spec.labels and spec.classes == "selected":
        return class_list(catalog, spec.labels, spec.classes)
    return _per_change(catalog, "classes", lambda: class_list(catalog, (), "catalog"))


def class_numbers(catalog: Catalog, names: tuple[str, ...]) -> dict[int, int]:
    """labels row -> class index in ``names``."""
    held = _per_change(catalog, "class_index", lambda: (names, class_index(catalog, names)))
    if held[0] != names:  # another class list: load it, and keep it for the next call
        held = (names, class_index(catalog, names))
        catalog.lookup_cache["class_index"] = (catalog.changes(), held)
    return held[1]


def roots_by_id(catalog: Catalog) -> dict[int, tuple[str, bytes]]:
    """(shown path, exact path ending in '/') of each root."""

    def load() -> dict[int, tuple[str, bytes]]:
        return {int(id_): (text, root_path(text, raw).rstrip(b"/") + b"/") for id_, text, raw in catalog.read(_ROOTS)}

    return _per_change(catalog, "roots", load)


def _per_change(catalog: Catalog, name: str, load: Callable[[], T]) -> T:
    """Small lookup tables, reloaded only when the catalog's change counter moved: a training
    loop asking for a few rows at a time should not re-read 1,000 label names per call."""
    cache = catalog.lookup_cache
    changes = catalog.changes()
    found = cache.get(name)
    if found is None or found[0] != changes:
        found = cache[name] = (changes, load())
    return cast(T, found[1])
