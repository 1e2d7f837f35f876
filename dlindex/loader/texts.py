"""What a loader's batches carry of the samples' texts (``texts=True``) and their token ids (``tokenizer=``).

A batch's texts are one statement (dlindex.catalog.texts.TEXT_BODIES_OF) beside its feature vectors:
``text``, each sample's first text ("" without one: a tokenizer takes it as it is), and
``texts``, all of them. A tokenizer is called once a batch with the ``text`` list, as HF
tokenizers are (``tokenizer(texts, padding=True, return_tensors="np")``): a mapping it returns
(input_ids, attention_mask, ...) joins the batch as it is; a list of token-id lists (a plain
function's) becomes ``input_ids`` padded with 0 and its ``attention_mask``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from dlindex.catalog.texts import TEXT_BODIES_OF, grouped_texts
from dlindex.errors import DlindexError

Tokenizer = Callable[[list[str]], Any]
# What a batch holds besides the tokenizer's entries: a tokenizer cannot overwrite these.
BATCH_KEYS = frozenset({"id", "label", "image", "features", "text", "texts", "_dlindex"})
_MAX_TOKENS = 1 << 20  # a row longer than this is a tokenizer gone wrong, not a caption


class TokenizerError(DlindexError):
    """The user's tokenizer raised, or returned something that is not one row per text."""


def batch_texts(catalog: Any, ids: Sequence[int]) -> tuple[list[str], list[list[str]]]:
    """(first text of each sample, all its texts), in the order of ``ids``."""
    found = grouped_texts(catalog.read(TEXT_BODIES_OF, {"ids": json.dumps([int(i) for i in ids])}))
    every = [found.get(int(i), []) for i in ids]
    return [texts[0] if texts else "" for texts in every], every


def tokenized(tokenizer: Tokenizer, texts: list[str]) -> dict[str, Any]:
    """The tokenizer's entries for a batch of ``texts``; TokenizerError (one line) if it raises
    or does not give one row per text."""
    try:
        out = tokenizer(texts)
    except Exception as e:  # the user's code: anything it raises is reported as its failure
        raise TokenizerError(f"the tokenizer raised {type(e).__name__}: {str(e)[:200]}") from None
    if isinstance(out, Mapping):
        entries = {str(k): v for k, v in out.items()}
        for key, value in entries.items():
            if key in BATCH_KEYS:
                raise TokenizerError(f"the tokenizer returned {key!r}, which the batch already has")
            shape = getattr(value, "shape", None)  # arrays and tensors; lists by their length
            rows = shape[0] if shape else _length(value)
            if rows != len(texts):
                raise TokenizerError(f"the tokenizer's {key!r} has {rows} rows for a batch of {len(texts)} texts")
        return entries
    return _padded(out, len(texts))


def _length(value: Any) -> int | None:
    try:
        return len(value)
    except TypeError:
        return None


def _padded(out: Any, count: int) -> dict[str, Any]:
    """``input_ids`` (int64, count x longest, 0-padded) and ``attention_mask`` from lists of token ids."""
    if isinstance(out, (str, bytes)) or _length(out) != count:
        raise TokenizerError(
            f"the tokenizer returned {type(out).__name__} for a batch of {count} texts; "
            "return a mapping (input_ids, ...) or one list of token ids per text"
        )
    rows = []
    for k, row in enumerate(out):
        size = None if isinstance(row, (str, bytes)) else _length(row)
        if size is None or size > _MAX_TOKENS:
            raise TokenizerError(f"the tokenizer's row {k} is not a list of token ids")
        try:
            array = np.asarray(row, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise TokenizerError(f"the tokenizer's row {k} is not a list of whole numbers") from None
        if array.ndim != 1:
            raise TokenizerError(f"the tokenizer's row {k} has {array.ndim} dimensions, not 1")
        rows.append(array)
    width = max((r.size for r in rows), default=0)
    ids = np.zeros((count, width), dtype=np.int64)
    mask = np.zeros((count, width), dtype=np.int64)
    for k, row in enumerate(rows):
        ids[k, : row.size] = row
        mask[k, : row.size] = 1
    return {"input_ids": ids, "attention_mask": mask}
