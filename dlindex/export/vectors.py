"""Feature vectors for ``--features TYPE``, read from the feature cache.

The cache is ``feature_types`` (one row per type: its name, dimension and dtype) and
``image_features(image_id, feature_type, vector BLOB)``, keyed by the type's name. Both tables
are in every catalog dlindex opens (opening refuses one without them as damaged), so nothing
here asks the schema what it holds.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from dlindex.export.plan import ExportError
from dlindex.export.shards import Features
from dlindex.features.extractor_versions import stale_count, version_text

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

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
    cursor = conn.execute(_TYPE, {"name": name})
    found = cursor.fetchone()
    if found is None:
        known = [row[0] for row in conn.execute(_TYPE_NAMES)]
        raise ExportError(f"no feature type {name!r} in the feature cache (known: {', '.join(known) or 'none'})")
    info = {d[0].lower(): v for d, v in zip(cursor.description, found, strict=True)}
    dtype = _DTYPES.get(str(info.get("dtype") or "float32").lower())
    if dtype is None:
        raise ExportError(f"feature type {name!r} has dtype {info.get('dtype')!r}; export supports float16/32/64")
    dim = info["dim"]

    def fetch(ids: list[int]) -> dict[int, bytes]:
        rows = catalog.read(_VECTORS, {"type": name, "ids": json.dumps(ids)})
        return {image_id: bytes(vector) for image_id, vector in rows}

    if not dim:
        sample = conn.execute(_ONE_VECTOR, {"type": name}).fetchone()
        dim = len(sample[0]) // int(dtype[-1]) if sample else 0
    current = info.get("extractor_version")
    version = version_text(catalog, name, current)
    return Features(name, dtype, int(dim or 0), fetch, version, stale_count(catalog, name, current))
