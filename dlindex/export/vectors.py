"""Feature vectors for ``--features TYPE``, read from the feature cache.

The cache is ``feature_types`` (one row per type: its name, and where present its
dimension and dtype) and ``image_features(image_id, feature_type, vector BLOB)``, where
``feature_type`` is the type's id (or, in a text column, its name). A catalog without the
tables has no feature cache yet.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from dlindex.catalog.dialect import postgres_form
from dlindex.export.plan import ExportError
from dlindex.export.shards import Features

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

# the catalog's own tables and columns: SQLite's schema table and pragmas, PostgreSQL's information_schema
_TABLES = postgres_form(
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('feature_types', 'image_features')",
    "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
    "AND table_name IN ('feature_types', 'image_features')",
)
_TYPE_COLUMNS = postgres_form(
    "SELECT name, type FROM pragma_table_info('feature_types')",
    "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = current_schema() "
    "AND table_name = 'feature_types'",
)
_FEATURE_COLUMNS = postgres_form(
    "SELECT name, type FROM pragma_table_info('image_features')",
    "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = current_schema() "
    "AND table_name = 'image_features'",
)
_TYPE = "SELECT * FROM feature_types WHERE name = :name"
_TYPE_NAMES = "SELECT name FROM feature_types ORDER BY name"
_VECTORS = (
    "SELECT image_id, vector FROM image_features WHERE feature_type = :type "
    "AND image_id IN (SELECT value FROM json_each(:ids))"
)
_ONE_VECTOR = "SELECT vector FROM image_features WHERE feature_type = :type LIMIT 1"
_DTYPES = {"float32": "<f4", "f4": "<f4", "<f4": "<f4", "float64": "<f8", "f8": "<f8", "<f8": "<f8",
           "float16": "<f2", "f2": "<f2", "<f2": "<f2"}  # fmt: skip


def feature_source(catalog: Catalog, name: str) -> Features:
    """The vectors of feature type ``name``; ExportError if the catalog has none."""
    conn = catalog.conn
    tables = {row[0] for row in conn.execute(_TABLES)}
    if tables != {"feature_types", "image_features"}:
        raise ExportError(f"no feature cache in {catalog.path}; compute features first (dlindex features)")
    type_columns = {row[0].lower() for row in conn.execute(_TYPE_COLUMNS)}
    cursor = conn.execute(_TYPE, {"name": name})
    found = cursor.fetchone()
    if found is None:
        known = [row[0] for row in conn.execute(_TYPE_NAMES)]
        raise ExportError(f"no feature type {name!r} in the feature cache (known: {', '.join(known) or 'none'})")
    info = {d[0].lower(): v for d, v in zip(cursor.description, found, strict=True)}
    dtype = _DTYPES.get(str(info.get("dtype") or "float32").lower())
    if dtype is None:
        raise ExportError(f"feature type {name!r} has dtype {info.get('dtype')!r}; export supports float16/32/64")
    dim = info.get("dim", info.get("dimensions", info.get("dims")))
    feature_columns = dict(conn.execute(_FEATURE_COLUMNS))
    by_id = "id" in type_columns and "TEXT" not in str(feature_columns.get("feature_type", "")).upper()
    key = info["id"] if by_id else name

    def fetch(ids: list[int]) -> dict[int, bytes]:
        rows = catalog.read(_VECTORS, {"type": key, "ids": json.dumps(ids)})
        return {image_id: bytes(vector) for image_id, vector in rows}

    if not dim:
        sample = conn.execute(_ONE_VECTOR, {"type": key}).fetchone()
        dim = len(sample[0]) // int(dtype[-1]) if sample else 0
    return Features(name, dtype, int(dim or 0), fetch)
