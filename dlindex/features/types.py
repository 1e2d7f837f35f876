"""Feature types in the catalog: checked names, storage dtypes, lookup and creation.

A feature type's name is used unquoted in SQL and in file names (its matrix file), so
``check_name`` admits plain identifiers only, and never an SQL keyword.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dlindex.catalog.backend import Connection
from dlindex.errors import InputError
from dlindex.features.text_extractors import PREFIX as TEXT_PREFIX

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

DTYPES: dict[str, np.dtype[np.floating[Any]]] = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2")}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
# SQLite's keywords: a feature-type name must be usable anywhere without quoting.
_SQL_KEYWORDS = """ABORT ACTION ADD AFTER ALL ALTER ALWAYS ANALYZE AND AS ASC ATTACH AUTOINCREMENT BEFORE BEGIN
    BETWEEN BY CASCADE CASE CAST CHECK COLLATE COLUMN COMMIT CONFLICT CONSTRAINT CREATE CROSS CURRENT
    CURRENT_DATE CURRENT_TIME CURRENT_TIMESTAMP DATABASE DEFAULT DEFERRABLE DEFERRED DELETE DESC DETACH
    DISTINCT DO DROP EACH ELSE END ESCAPE EXCEPT EXCLUDE EXCLUSIVE EXISTS EXPLAIN FAIL FILTER FIRST
    FOLLOWING FOR FOREIGN FROM FULL GENERATED GLOB GROUP GROUPS HAVING IF IGNORE IMMEDIATE IN INDEX
    INDEXED INITIALLY INNER INSERT INSTEAD INTERSECT INTO IS ISNULL JOIN KEY LAST LEFT LIKE LIMIT MATCH
    MATERIALIZED NATURAL NO NOT NOTHING NOTNULL NULL NULLS OF OFFSET ON OR ORDER OTHERS OUTER OVER
    PARTITION PLAN PRAGMA PRECEDING PRIMARY QUERY RAISE RANGE RECURSIVE REFERENCES REGEXP REINDEX
    RELEASE RENAME REPLACE RESTRICT RETURNING RIGHT ROLLBACK ROW ROWS SAVEPOINT SELECT SET TABLE TEMP
    TEMPORARY THEN TIES TO TRANSACTION TRIGGER UNBOUNDED UNION UNIQUE UPDATE USING VACUUM VALUES VIEW
    VIRTUAL WHEN WHERE WINDOW WITH WITHOUT"""
_KEYWORDS = frozenset(_SQL_KEYWORDS.split())

_COLUMNS = "name, dim, dtype, extractor, version, created_at, extractor_version, auto"
_TYPE = f"SELECT {_COLUMNS} FROM feature_types WHERE name = ?"
TYPES = f"SELECT {_COLUMNS} FROM feature_types ORDER BY name"
# Two computes of one new type at once (many writers on a server catalog) both create it:
# the second finds it made, and checks it is the same type (features/pipeline.py).
_CREATE_TYPE = (
    "INSERT INTO feature_types (name, dim, dtype, extractor) VALUES (?, ?, ?, ?) ON CONFLICT (name) DO NOTHING"
)
_SET_DIM = "UPDATE feature_types SET dim = ? WHERE name = ? AND dim IS NULL"
_SET_AUTO = "UPDATE feature_types SET auto = ? WHERE name = ?"


@dataclass(frozen=True)
class FeatureType:
    """One row of ``feature_types``; ``dim`` is None until the first vector is stored."""

    name: str
    dim: int | None
    dtype: str
    extractor: str
    version: int  # bumped by every write to the type's vectors (dlindex.features.blobs)
    created_at: str
    # The id of the extractor version the latest compute ran (dlindex.features.extractor_versions);
    # None until a compute records one (an imported type never does).
    extractor_version: int | None = None
    # `features auto`: the catalog queues new and changed ok samples for the type (m018)
    auto: bool = False

    @property
    def np_dtype(self) -> np.dtype[np.floating[Any]]:
        return DTYPES[self.dtype]

    @property
    def vector_bytes(self) -> int | None:
        return None if self.dim is None else self.dim * self.np_dtype.itemsize


def check_name(name: str) -> str:
    """Return ``name`` if it is a plain identifier that no SQL context needs to quote."""
    if not _NAME.match(name) or name.upper() in _KEYWORDS:
        raise InputError(
            f"invalid feature type name {name!r}: use letters, digits and _ (not first), at most 64 "
            "characters, and not an SQL keyword; e.g. colorhist, resnet50_v2"
        )
    return name


def check_dtype(dtype: str) -> str:
    """Return ``dtype`` if feature vectors can be stored as it."""
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}; choose float32 or float16")
    return dtype


def find_type(catalog: Catalog, name: str) -> FeatureType | None:
    row = catalog.conn.execute(_TYPE, (name,)).fetchone()
    return FeatureType(*row) if row else None


def all_types(catalog: Catalog) -> list[FeatureType]:
    """Every feature type, by name."""
    return [FeatureType(*row) for row in catalog.read(TYPES)]


def get_type(catalog: Catalog, name: str) -> FeatureType:
    """The feature type ``name``; InputError listing the known types if there is none."""
    found = find_type(catalog, name)
    if found is None:
        raise InputError(unknown_type_message(catalog, name))
    return found


def unknown_type_message(catalog: Catalog, name: str) -> str:
    from dlindex.features.extractors import BUILTINS  # numpy and Pillow: only on this error path

    known = [row[0] for row in catalog.conn.execute(TYPES)]
    # a type named like a built-in needs no --extractor; any other needs one (colorhist: an example)
    compute = f"dlindex features compute --type {name}" + ("" if name in BUILTINS else " --extractor colorhist")
    if not known:
        return f"unknown feature type {name!r}: the catalog has none yet; run {compute} (or features import)"
    if name in BUILTINS:
        return f"unknown feature type {name!r}; known types: {', '.join(known)}; compute it: {compute}"
    return f"unknown feature type {name!r}; known types: {', '.join(known)}"


def create_type(conn: Connection, name: str, dtype: str, extractor: str, dim: int | None = None) -> None:
    check_dtype(dtype)
    conn.execute(_CREATE_TYPE, (check_name(name), dim, dtype, extractor))


def set_dim(conn: Connection, name: str, dim: int) -> None:
    conn.execute(_SET_DIM, (dim, name))


def set_auto(catalog: Catalog, name: str, on: bool = True) -> FeatureType:
    """Make a type automatic (``on``: from now on the catalog queues every new or changed ok
    sample for it, whoever writes the row) or not; InputError for an unknown or imported type.
    A built-in (dhash, colorhist, ...) needs no compute first: its type is made here, as compute
    would make it, so it can be automatic before the first scan."""
    if on and find_type(catalog, name) is None:
        from dlindex.features.extractors import BUILTINS

        builtin = BUILTINS.get(name)
        if builtin is not None:
            with catalog.write_transaction() as conn:
                create_type(conn, name, "float32", builtin.spec, builtin.dim)
    ftype = get_type(catalog, name)
    if on and ftype.extractor == "import":
        raise InputError(f"feature type {name!r} was imported; it has no extractor to compute new samples with")
    if on and ftype.extractor.startswith(TEXT_PREFIX):  # the queue follows image rows, not texts
        raise InputError(f"feature type {name!r} is made from texts: run features compute --type {name} after "
                         "texts change (a changed text's vectors are dropped); it cannot be automatic yet")  # fmt: skip
    with catalog.write_transaction() as conn:
        conn.execute(_SET_AUTO, (int(on), ftype.name))
    found = find_type(catalog, ftype.name)
    assert found is not None
    return found
