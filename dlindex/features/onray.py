"""``features compute --engine ray``: (id, path) batches through a Ray Data actor pool, results as Arrow.

The driver cuts the to-do list into Arrow tables of ids and paths (a few thousand rows each,
never one row per task); Ray Data feeds them, ``batch_size`` rows at a time, to a pool of
``ExtractActor``s, each of which loads the extractor once from its spec and decodes with
:func:`dlindex.features.workers.extract_batch`, the local workers' own code, so both engines
store the same bytes. The result tables (id, vector, error) flow back to the driver, where the
pipeline's single writer stores them as it stores the local workers' results.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from dlindex.engines.ray import cluster_resources, map_arrow
from dlindex.features.extractors import Extractor, load_extractor, use_gpu
from dlindex.features.workers import Batch, Results, extract_batch

_BLOCK_BATCHES = 16  # batches per Arrow table sent at most: ~1,000 rows, a few dozen objects per 50k files
_BLOCKS_PER_ACTOR = 4  # at least, where there are that many batches


class ExtractActor:
    """A Ray Data callable class: one per actor, the extractor loaded once."""

    def __init__(self, spec: str, dtype: str, gpu: bool = False) -> None:
        self.extractor = load_extractor(spec)
        self.dtype = np.dtype(dtype)
        if gpu:
            use_gpu(self.extractor)

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        ids = batch.column("id").to_pylist()
        paths = batch.column("path").to_pylist()
        results = extract_batch(self.extractor, self.dtype, list(zip(ids, paths, strict=True)))
        return pa.table(
            {
                "id": pa.array([r[0] for r in results], pa.int64()),
                "vector": pa.array([r[1] for r in results], pa.binary()),
                "error": pa.array([r[2] for r in results], pa.string()),
            }
        )


def run_on_ray(
    todo: list[tuple[int, bytes]],
    extractor: Extractor,
    dtype: np.dtype[Any],
    *,
    batch_size: int,
    workers: int,
    add: Callable[[Results], None],
) -> None:
    """Extract ``todo`` on the connected Ray cluster; ``add`` each batch of results as it comes.

    ``workers`` actors (0: one per CPU of the cluster), each given a GPU when the extractor can
    use one and the cluster has them."""
    import pyarrow as pa

    resources = cluster_resources()
    gpus = int(resources.get("GPU", 0)) if extractor.gpu else 0
    actors = max(1, workers or int(resources.get("CPU", 0)) or os.cpu_count() or 1)
    if gpus:
        actors = min(actors, gpus)
    # blocks of whole batches, a few per actor (balance, and little to redo after a kill), at most 16
    per_actor = -(-len(todo) // (_BLOCKS_PER_ACTOR * actors * batch_size))
    rows = batch_size * max(1, min(_BLOCK_BATCHES, per_actor))
    tables = [_table(pa, todo[start : start + rows]) for start in range(0, len(todo), rows)]
    for table in map_arrow(
        tables,
        ExtractActor,
        {"spec": extractor.spec, "dtype": dtype.str, "gpu": bool(gpus)},
        batch_size=batch_size,
        actors=actors,
        num_gpus=1 if gpus else 0,
    ):
        add(
            list(
                zip(
                    table.column("id").to_pylist(),
                    table.column("vector").to_pylist(),
                    table.column("error").to_pylist(),
                    strict=True,
                )
            )
        )


def _table(pa: Any, batch: Batch) -> Any:
    return pa.table(
        {"id": pa.array([i for i, _ in batch], pa.int64()), "path": pa.array([p for _, p in batch], pa.binary())}
    )
