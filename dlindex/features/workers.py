"""The worker processes of ``features compute``: decode each image and run the extractor.

Built on ``dlindex.engines.local.ForkPool``: no helper threads, so stopping is immediate;
and the parent knows which batches each worker holds, so when an extractor crashes its
process (a segfault in a C extension) the batches are rerun one image at a time in fresh
processes and only the culprit fails.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

import numpy as np
from PIL import Image

from dlindex.catalog.texts import TEXT_BODIES_OF, grouped_texts
from dlindex.engines.local import ForkPool, WorkerDied, init_child
from dlindex.errors import DlindexError
from dlindex.features.blobs import encode
from dlindex.features.extractors import Extractor
from dlindex.features.text_extractors import sample_vectors

_ERROR_CHARS = 500
_state: dict[str, Any] = {}  # set in the parent before forking: the workers inherit it

Batch = list[tuple[int, bytes]]
Results = list[tuple[int, bytes | None, str | None]]


class Pool:
    """``submit`` batches of (id, path), ``wait_any`` for the results of finished ones."""

    def __init__(self, workers: int, extractor: Extractor, dtype: np.dtype[Any], catalog: str | None = None) -> None:
        _state["extractor"] = extractor  # forked workers inherit it, whatever module it came from
        _state["dtype"] = dtype
        _state["catalog"] = catalog  # a text extractor's workers read each batch's texts from it
        self.pool = ForkPool(workers, _init, _extract_batch)

    @property
    def inflight(self) -> int:
        return self.pool.inflight

    def submit(self, batch: Batch) -> None:
        # Tasks are a few KiB: writing one never blocks on a worker busy writing its result.
        self.pool.send(self.pool.least_busy(), batch, batch)

    def wait_any(self) -> list[Results]:
        answers, orphans = self.pool.wait_any()
        if orphans and self._alone([]) is None:
            raise DlindexError("extractor worker processes die as they start; try the extractor on one image by hand")
        return [answer for _, answer in answers] + [[self._one(item) for item in batch] for batch in orphans]

    def _one(self, item: tuple[int, bytes]) -> tuple[int, bytes | None, str | None]:
        results = self._alone([item])
        if results is None:
            return item[0], None, "the extractor crashed the worker process on this image"
        return results[0]

    def _alone(self, batch: Batch) -> Results | None:
        """A batch in a fresh worker of its own; None if the worker dies doing it."""
        try:
            results: Results = self.pool.run_alone(batch)
        except WorkerDied:
            return None
        return results

    def close(self, abort: bool = False) -> None:
        self.pool.close(abort)


def _init() -> None:
    _state["capture"] = init_child()
    _state["reader"] = None  # opened on first use, in this process (never the parent's connection)


def _extract_batch(batch: Batch) -> Results:
    """In a worker: (id, vector bytes, None) or (id, None, error) for each image."""
    extractor = _state["extractor"]
    if extractor.embed is not None:
        if _state["reader"] is None:
            from dlindex.catalog.connection import connect_reader

            _state["reader"] = connect_reader(_state["catalog"], timeout=30)
        return embed_batch(extractor.embed, _state["dtype"], batch, _state["reader"])
    return extract_batch(extractor, _state["dtype"], batch, _state.get("capture"))


def extract_batch(extractor: Extractor, dtype: np.dtype[Any], batch: Batch, capture: Any = None) -> Results:
    """(id, vector bytes, None) or (id, None, error) for each image: the one decode path of
    every engine, so that they store the same bytes."""
    results: Results = []
    for image_id, path in batch:
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # opening a FIFO would hang the worker
                raise OSError("not a regular file")
            if extractor.from_file is not None:
                value = extractor.from_file(path)
            else:
                with Image.open(path) as image:
                    value = extractor.fn(image)
            vector = encode(value, dtype)
            results.append((image_id, vector.tobytes(), None))
        except Exception as e:  # any failure of the image or the user's code fails this sample only
            text = f"{type(e).__name__}: {e}"
            if capture is not None:
                printed = capture.take()
                if printed:
                    text += f" ({printed})"
            results.append((image_id, None, text[:_ERROR_CHARS]))
    return results


def embed_batch(embed: Any, dtype: np.dtype[Any], batch: Batch, reader: Any) -> Results:
    """A text extractor's batch: the samples' texts read through ``reader`` in one statement (the
    worker reads them: a task stays a list of ids, which a pipe takes without blocking), then
    one call of the extractor for all of them (dlindex.features.text_extractors)."""
    texts = grouped_texts(reader.execute(TEXT_BODIES_OF, {"ids": json.dumps([i for i, _ in batch])}))
    having = [(i, texts[i]) for i, _ in batch if i in texts]  # a sample's texts may be gone since it was queued
    vectors, errors = sample_vectors(embed, [mine for _, mine in having]) if having else ([], [])
    made = {i: (value, error) for (i, _), value, error in zip(having, vectors, errors, strict=True)}
    results: Results = []
    for image_id, _ in batch:
        value, error = made.get(image_id, (None, "the sample has no text now"))
        if error is None:
            try:
                results.append((image_id, encode(value, dtype).tobytes(), None))
                continue
            except ValueError as e:
                error = f"ValueError: {e}"
        results.append((image_id, None, error[:_ERROR_CHARS]))
    return results
