"""``features compute`` of a text type: which selected samples have texts.

Each worker reads its batch's texts in one statement and embeds them
(dlindex.features.workers.embed_batch). A selected sample without
a text is left out (``no_text`` in the summary), not failed: the text may come with the next
import, and compute then makes its vector. When a sample's texts change, its vectors of text
types go (dlindex.catalog.texts.apply_texts), so the next compute makes them again.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

_HAVE_TEXTS = "SELECT DISTINCT image_id FROM image_texts WHERE image_id IN (SELECT value FROM json_each(?))"


def have_texts(catalog: Catalog, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Which of ``ids`` have at least one text."""
    found = {int(r[0]) for r in catalog.read(_HAVE_TEXTS, (json.dumps(ids.tolist()),))}
    return np.fromiter((int(i) in found for i in ids.tolist()), dtype=bool, count=ids.size)
