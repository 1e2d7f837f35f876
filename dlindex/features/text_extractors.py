"""Text extractors: a function from a list of texts to one vector per text, named by a ``text:`` spec.

A text feature type holds one vector per *sample*, made from its texts (every source, in the
order ``text list`` shows them): the mean of its texts' vectors, so a sample with one caption
has exactly its caption's vector. Samples without a text get none. Storing per sample keeps
every consumer of feature types as it is: ``similar``, ``dups``, ``leaks``, ``export
--features`` and the loader's ``feature_type`` read text types like image types.

Specs:

- ``text:ngrams``: built in, lexical, nothing to download: the set of each text's words (Unicode
  word characters, case-folded) and their character trigrams (``<pe``, ``pen``, ..., ``in>``),
  each counted once, hashed (xxh3-64) into 1024 signed buckets and scaled to unit length. Texts
  that share words or word parts are near; synonyms are not (no model).
- ``text:module:function`` / ``text:path/to/file.py:function``: your model. The function takes a
  list of texts and returns one vector per text (anything ``numpy.asarray`` makes an
  ``(len(texts), dim)`` real array of): a sentence-transformers model's ``encode``, a CLIP text
  tower. Its version is what it declares, as an image extractor's (``dlindex_version``), or
  ``model_version`` and ``tokenizer_version`` (recorded as both), else its source file's digest;
  a change makes the stored vectors stale, and ``features compute`` makes them again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from dlindex.errors import InputError

PREFIX = "text:"
NGRAMS_DIM = 1024
_WORD = re.compile(r"\w+")
_hash = xxhash.xxh3_64_intdigest
_MAX_ERROR = 300

Embed = Callable[[list[str]], Any]


def ngrams(texts: list[str]) -> npt.NDArray[np.float32]:
    """``text:ngrams``: (len(texts), 1024) unit vectors of hashed words and their character trigrams."""
    out = np.zeros((len(texts), NGRAMS_DIM), dtype=np.float32)
    for row, text in enumerate(texts):
        words = _WORD.findall(text.casefold())
        # Each gram once (a set, as near-duplicate detection takes texts): a word a text repeats
        # (boilerplate, a list of "xx.utf8=" translations) would otherwise outweigh the rest.
        # Character trigrams make "penguin" near "penguins" and "pinguin" (docs/text.md).
        grams = set(words)
        for word in grams.copy():
            marked = f"<{word}>"
            grams.update(marked[i : i + 3] for i in range(len(marked) - 2))
        if not grams:
            continue
        hashes = np.fromiter(map(_hash, grams), dtype=np.uint64, count=len(grams))
        signs = np.where(hashes >> np.uint64(63), -1.0, 1.0)
        counts = np.bincount((hashes % np.uint64(NGRAMS_DIM)).astype(np.intp), weights=signs, minlength=NGRAMS_DIM)
        norm = float(np.sqrt(counts @ counts))
        if norm > 0:
            out[row] = counts / norm
    return out


ngrams.dlindex_version = "ngrams/1"  # type: ignore[attr-defined]  # raise it whenever the vectors change
BUILTIN_TEXT = {"ngrams": ngrams}
BUILTIN_DIMS = {"ngrams": NGRAMS_DIM}


def declared_version(fn: Any) -> str | None:
    """``model=...;tokenizer=...`` from a plug-in's ``model_version``/``tokenizer_version``, else None."""
    parts = []
    for name in ("model", "tokenizer"):
        value = getattr(fn, f"{name}_version", None)
        if value is not None:
            try:
                parts.append(f"{name}={str(value)[:200]}")
            except Exception as e:  # the user's object: its __str__ may raise anything
                raise InputError(
                    f"the text extractor's {name}_version cannot be read as text: {type(e).__name__}"
                ) from None
    return ";".join(parts) or None


def sample_vectors(embed: Embed, per_sample: Sequence[list[str]]) -> tuple[list[Any], list[str | None]]:
    """Each sample's vector (the mean of its texts') or its error: the function is called once
    for all the texts of the batch; if that fails, once per sample, so one bad text fails its
    sample only."""
    try:
        matrix = _checked(embed, [text for texts in per_sample for text in texts])
    except InputError as e:
        if len(per_sample) == 1:
            return [None], [str(e)]
        alone = [sample_vectors(embed, [texts]) for texts in per_sample]
        return [vectors[0] for vectors, _ in alone], [errors[0] for _, errors in alone]
    out: list[Any] = []
    at = 0
    for texts in per_sample:
        rows = matrix[at : at + len(texts)]
        at += len(texts)
        out.append(rows[0] if len(rows) == 1 else rows.mean(axis=0))
    return out, [None] * len(per_sample)


def _checked(embed: Embed, texts: list[str]) -> npt.NDArray[Any]:
    """``embed(texts)`` as a (len(texts), dim) real array; InputError (one line) otherwise."""
    try:
        value = embed(texts)
        array = np.asarray(value)
    except Exception as e:  # the user's model: anything it raises fails these samples only
        raise InputError(f"the text extractor raised {type(e).__name__}: {str(e)[:_MAX_ERROR]}") from None
    if array.ndim != 2 or array.shape[0] != len(texts) or array.shape[1] == 0:
        raise InputError(
            f"the text extractor returned shape {array.shape} for {len(texts)} texts; "
            f"expected ({len(texts)}, dim): one vector per text"
        )
    if array.dtype.kind not in "fiu":
        raise InputError(f"the text extractor returned {array.dtype} values, not real numbers")
    return array
