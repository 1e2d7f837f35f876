"""The feature cache: per-image vectors by feature type, computed, imported and searched.

    from dlindex import Catalog, feature_vectors
    from dlindex.features import compute_features, nearest
    with Catalog("train.db") as catalog:
        compute_features(catalog, "colorhist")
        x = feature_vectors(catalog, [1, 2, 3], "colorhist")      # (3, 96) float32
        neighbours = nearest(catalog, [1], "colorhist", k=10, other_labels=True)

This package imports numpy (``import dlindex`` does not); names are imported from their
modules on first use, so `dlindex similar` does not load the extraction pipeline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlindex._lazy import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "BUILTINS": "extractors",
    "Extractor": "extractors",
    "load_extractor": "extractors",
    "ImportSummary": "vector_import",
    "import_features": "vector_import",
    "load_matrix": "matrix",
    "METRICS": "neighbours",
    "Neighbour": "neighbours",
    "nearest": "neighbours",
    "nearest_to": "neighbours",
    "nearest_to_text": "text_query",
    "ComputeOptions": "pipeline",
    "ComputeSummary": "pipeline",
    "compute_features": "pipeline",
    "compute_queued": "pipeline",
    "DropResult": "storage",
    "ExportResult": "storage",
    "FeatureTypeInfo": "storage",
    "ImageFeatures": "storage",
    "drop_feature_type": "storage",
    "export_features": "storage",
    "feature_vectors": "storage",
    "list_feature_types": "storage",
    "show_features": "storage",
    "FeatureType": "types",
    "check_name": "types",
    "get_type": "types",
    "set_auto": "types",
}

__all__ = [
    "BUILTINS",
    "METRICS",
    "ComputeOptions",
    "ComputeSummary",
    "DropResult",
    "ExportResult",
    "Extractor",
    "FeatureType",
    "FeatureTypeInfo",
    "ImageFeatures",
    "ImportSummary",
    "Neighbour",
    "check_name",
    "compute_features",
    "compute_queued",
    "drop_feature_type",
    "export_features",
    "feature_vectors",
    "get_type",
    "import_features",
    "list_feature_types",
    "load_extractor",
    "load_matrix",
    "nearest",
    "nearest_to",
    "nearest_to_text",
    "set_auto",
    "show_features",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


if TYPE_CHECKING:
    from dlindex.features.extractors import BUILTINS, Extractor, load_extractor
    from dlindex.features.matrix import load_matrix
    from dlindex.features.neighbours import METRICS, Neighbour, nearest, nearest_to
    from dlindex.features.pipeline import ComputeOptions, ComputeSummary, compute_features, compute_queued
    from dlindex.features.storage import (
        DropResult,
        ExportResult,
        FeatureTypeInfo,
        ImageFeatures,
        drop_feature_type,
        export_features,
        feature_vectors,
        list_feature_types,
        show_features,
    )
    from dlindex.features.text_query import nearest_to_text
    from dlindex.features.types import FeatureType, check_name, get_type, set_auto
    from dlindex.features.vector_import import ImportSummary, import_features
