"""The single writer of ``features compute``: checks every vector against its type and commits
batches of results, each one transaction (vectors stored, state cleared or failure recorded)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from dlindex.features import compute_state
from dlindex.features.blobs import write_vectors
from dlindex.features.types import FeatureType, set_dim
from dlindex.features.workers import Results

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

_EXISTS = "SELECT id FROM image_metadata WHERE id IN (SELECT value FROM json_each(?))"
# A sample the current extractor version fails on keeps no vector an older version made.
_DROP_STALE = """DELETE FROM image_features WHERE feature_type = ? AND extractor_version IS NOT ?
    AND image_id IN (SELECT value FROM json_each(?))"""
_FLUSH_ROWS = 1000
_FLUSH_SECONDS = 0.5


class VectorWriter:
    """The single writer: checks every vector against the type, commits batches of results."""

    def __init__(self, catalog: Catalog, ftype: FeatureType, extractor_version: int) -> None:
        self.catalog = catalog
        self.ftype = ftype
        self.extractor_version = extractor_version
        self.pending: Results = []
        self.computed = 0
        self.failed = 0
        self.errors: list[tuple[int, str]] = []
        self._last_flush = time.monotonic()

    def add(self, results: Results) -> None:
        self.pending.extend(results)

    def maybe_flush(self) -> None:
        if len(self.pending) >= _FLUSH_ROWS or (self.pending and time.monotonic() - self._last_flush > _FLUSH_SECONDS):
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self.pending:
            return
        name = self.ftype.name
        with self.catalog.write_transaction() as conn:
            dim = self.ftype.dim
            if dim is None:
                first = next((blob for _, blob, _ in self.pending if blob is not None), None)
                if first is not None:
                    dim = len(first) // self.ftype.np_dtype.itemsize
                    set_dim(conn, name, dim)
            expected = None if dim is None else dim * self.ftype.np_dtype.itemsize
            ids = [r[0] for r in self.pending]
            alive = {r[0] for r in conn.execute(_EXISTS, (json.dumps(ids),))}  # pruned meanwhile?
            ok: list[tuple[int, bytes]] = []
            bad: list[tuple[int, str]] = []
            for image_id, blob, error in self.pending:
                if image_id not in alive:
                    continue
                if blob is not None and len(blob) != expected:
                    got = len(blob) // self.ftype.np_dtype.itemsize
                    error = f"extractor returned {got} values; feature type {name!r} has dim {dim}"
                if error is None and blob is not None:
                    ok.append((image_id, blob))
                else:
                    bad.append((image_id, error or "no vector"))
            if ok:
                write_vectors(conn, replace(self.ftype, dim=dim), ok, self.extractor_version)
            if bad:
                conn.execute(_DROP_STALE, (name, self.extractor_version, json.dumps([i for i, _ in bad])))
            compute_state.record(conn, name, [i for i, _ in ok], bad)
        self.ftype = replace(self.ftype, dim=dim)
        self.pending.clear()
        self.computed += len(ok)
        self.failed += len(bad)
        self.errors.extend(bad[: max(0, 20 - len(self.errors))])
