"""``similar --to-text``: the samples whose vectors are nearest to a text's, by a feature type.

The text is embedded by a text type's extractor (``text:...``): the type searched itself, or,
for a model that puts images and texts in one space (CLIP), the text type given as
``text_type`` while the image type's vectors are searched. The query is embedded by the
extractor as it is now; if that is not the version that made the text type's vectors, the
answer would compare two models' vectors, so it is refused until they are computed again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from dlindex.errors import InputError
from dlindex.features import extractor_versions
from dlindex.features.blobs import encode
from dlindex.features.extractors import load_extractor
from dlindex.features.neighbours import Neighbour, nearest_to
from dlindex.features.text_extractors import PREFIX, sample_vectors
from dlindex.features.types import get_type
from dlindex.query.spec import QuerySpec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog


def nearest_to_text(
    catalog: Catalog,
    texts: Sequence[str],
    feature_type: str,
    *,
    text_type: str | None = None,
    k: int = 10,
    metric: str = "cosine",
    spec: QuerySpec | None = None,
) -> list[list[Neighbour]]:
    """The ``k`` nearest samples to each of ``texts`` by ``feature_type``, the texts embedded
    by ``text_type`` (default: ``feature_type``, which must then be a text type)."""
    searched = get_type(catalog, feature_type)
    embedder = get_type(catalog, text_type) if text_type is not None else searched
    if not embedder.extractor.startswith(PREFIX):
        raise InputError(
            f"feature type {embedder.name!r} is made from images ({embedder.extractor}); --to-text embeds the "
            "query with a text type: give --text-type NAME (one made with --extractor text:...)"
        )
    extractor = load_extractor(embedder.extractor)
    assert extractor.embed is not None
    now = extractor_versions.version_of(extractor)
    if embedder.extractor_version is not None and embedder.extractor_version != extractor_versions.version_id(now):
        raise InputError(
            f"the extractor of {embedder.name!r} changed since its vectors were made; run dlindex features "
            f"compute --type {embedder.name} first, so the query and the vectors come from one model"
        )
    vectors, errors = sample_vectors(extractor.embed, [[text] for text in texts])
    failed = next((e for e in errors if e is not None), None)
    if failed is not None:
        raise InputError(failed)
    try:
        queries = np.stack([encode(v, searched.np_dtype) for v in vectors]).astype(np.float32)
    except ValueError as e:
        raise InputError(f"the text extractor's vector for the query: {e}") from None
    return nearest_to(catalog, queries, list(texts), searched.name, k=k, metric=metric, spec=spec)
