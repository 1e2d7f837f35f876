"""dlindex.torch.DataLoader: a torch DataLoader over a catalog, with set_epoch, exact resume and stats.

    from dlindex.torch import DataLoader
    loader = DataLoader(database_path="training.db", feature_type="vit_large_patch14",
                        batch_size=32, num_workers=4, per_label=500, seed=0)
    for epoch in range(10):
        loader.set_epoch(epoch)
        for batch in loader: ...

Importing this module imports torch (the ``torch`` extra).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch.utils.data

from dlindex.errors import InputError
from dlindex.exported.formats import WDS
from dlindex.loader.catalog_dataset import CatalogDataset
from dlindex.loader.epoch import Generation
from dlindex.loader.worker import NothingReadError, nothing_read

__all__ = ["CatalogDataset", "DataLoader", "NothingReadError"]
_STATE_VERSION = 1
_SUMMED = ("samples", "skipped", "replaced", "failed", "l1_hits", "l1_misses", "l2_hits", "l2_misses", "export_fallbacks",
           "read_s", "decode_s")  # fmt: skip


class DataLoader(torch.utils.data.DataLoader):  # type: ignore[misc]  # torch is Any to mypy
    """A torch DataLoader whose dataset is a :class:`CatalogDataset` (made from ``database_path``
    and the dataset's keyword options, or given).

    Batches are dicts of tensors: ``id``, ``label``, ``image`` (uint8, B x C x H x W when
    ``image_size`` is set) and ``features`` (with ``feature_type``). Workers batch, so torch's
    own ``batch_size`` is None; workers are made anew each epoch (``persistent_workers`` off),
    each with its part of the epoch's plan.
    """

    def __init__(
        self, dataset: CatalogDataset | None = None, *, database_path: str | os.PathLike[str] | None = None,
        batch_size: int = 32, num_workers: int = 0, pin_memory: bool | None = None, drop_last: bool = False,
        prefetch_factor: int | None = None, timeout: float = 0, multiprocessing_context: Any = None,
        **options: Any,
    ) -> None:  # fmt: skip
        if dataset is None:
            if database_path is None:
                raise InputError("DataLoader needs database_path= (or a CatalogDataset)")
            dataset = CatalogDataset(database_path, batch_size=batch_size, drop_last=drop_last, **options)
        elif options or database_path is not None:
            raise InputError("give either a CatalogDataset or database_path= with options, not both")
        if dataset.batch_size is None:
            raise InputError("dlindex.torch.DataLoader batches in its workers: the dataset needs a batch_size")
        dataset.track = True
        if pin_memory is None:
            pin_memory = torch.cuda.is_available()
        super().__init__(dataset, batch_size=None, num_workers=num_workers, pin_memory=pin_memory,  # an IterableDataset once made
                         prefetch_factor=prefetch_factor, persistent_workers=False, timeout=timeout,
                         multiprocessing_context=multiprocessing_context)  # fmt: skip
        self._offsets: list[int] = []
        self._stats: dict[int, dict[str, Any]] = {}
        self._batches = 0

    @property
    def catalog_dataset(self) -> CatalogDataset:
        dataset: CatalogDataset = self.dataset
        return dataset

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next: a new per-label draw and order (keeps a loaded state of that epoch)."""
        if int(epoch) != self.catalog_dataset.epoch:
            self._offsets = []
        self.catalog_dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:  # a generator over torch's iterator
        dataset = self.catalog_dataset
        workers = max(1, self.num_workers)
        dataset.plan(workers)  # resolved once here; forked workers inherit it
        self._offsets = [0] * workers
        self._stats = {}
        self._batches = 0
        for batch in super().__iter__():
            info = batch.pop("_dlindex")
            worker = int(info["worker"])
            self._offsets[worker] = int(info["offset"])
            self._stats[worker] = info["stats"]
            if not batch:  # only a worker's last counts: its stream ended in failed batches
                continue
            self._batches += 1
            yield batch
        failed = sum(int(s.get("failed", 0)) for s in self._stats.values())
        if failed and not self._batches:
            errors = [e for s in self._stats.values() for e in s.get("errors", [])]
            raise NothingReadError(nothing_read(dataset.epoch, failed, errors))

    def state_dict(self) -> dict[str, Any]:
        """Where this epoch stands: load it into a new loader (any world size) to read exactly
        the samples not yet handed out."""
        dataset = self.catalog_dataset
        plan = dataset.plan(max(1, self.num_workers))
        layout = plan.layout
        offsets = self._offsets or [0] * layout.workers
        now = Generation(layout.world, layout.workers, layout.batch_size, tuple(offsets))
        return {
            "version": _STATE_VERSION, "epoch": dataset.epoch, "seed": dataset.options.seed, "digest": plan.digest,
            "source": plan.export.out_dir if plan.export is not None else "files",
            "generations": [g.as_dict() for g in (*dataset.history, now)],
            "catalog_state": plan.selection.changes,  # a resume reads the catalog as it stood then
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the epoch ``state`` was taken in; the next iteration reads what is left of it."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise InputError("not a dlindex loader state (or one of another version)")
        dataset = self.catalog_dataset
        if int(state.get("seed", -1)) != dataset.options.seed:
            raise InputError(
                f"the state was saved with seed {state.get('seed')}, this loader has {dataset.options.seed}"
            )
        generations = tuple(Generation.from_dict(g) for g in state.get("generations", ()))
        if not generations:
            raise InputError("a loader state lists no generations")
        dataset.set_epoch(int(state["epoch"]))
        source = state.get("source")
        if dataset.source == "auto" and isinstance(source, str):
            dataset.source = source  # the same bytes source as before: the same order
            dataset.options = _with_source(dataset.options, source)
        dataset.history, dataset.digest = generations, str(state.get("digest") or "") or None
        read = state.get("catalog_state")
        if dataset.at is None and isinstance(read, int) and not isinstance(read, bool) and read >= 0:
            dataset.resume_at = f"state:{read}"  # the rest of this epoch as planned; the next one reads what is new
        self._offsets = []

    def stats(self) -> dict[str, Any]:
        """This epoch so far: samples, batches, skips, caches, where the bytes came from."""
        dataset = self.catalog_dataset
        plan = dataset.plan(max(1, self.num_workers))
        total = {k: sum(s.get(k, 0) for s in self._stats.values()) for k in _SUMMED}
        asked = total["l1_hits"] + total["l1_misses"]
        return {
            **total, "batches": self._batches, "selected": plan.selected,
            "dropped": plan.selected - plan.layout.share() * plan.layout.world
            if plan.layout.share() * plan.layout.world < plan.selected else 0,
            "missing_features": plan.missing_features, "l1_hit_rate": round(total["l1_hits"] / asked, 4) if asked else 0.0,
            "l2_hit": plan.selection.l2_hit, "l2": plan.l2_identity is not None,
            "l3_hit": plan.selection.cache_hit, "source": WDS.name if plan.export is not None else "files",
            "export": plan.export.out_dir if plan.export is not None else None,
            "errors": [e for s in self._stats.values() for e in s.get("errors", [])][:5],
        }  # fmt: skip


def _with_source(options: Any, source: str) -> Any:
    from dataclasses import replace

    return replace(options, source=source, export_split=None)  # the export "auto" chose, as it chose it
