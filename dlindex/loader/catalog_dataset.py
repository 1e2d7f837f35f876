"""CatalogDataset: an iterable torch dataset whose samples are a catalog query, read epoch by epoch."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import fields
from typing import Any

from dlindex.catalog.backend import is_server_url
from dlindex.errors import InputError
from dlindex.loader.decode import ImageSpec
from dlindex.loader.epoch import MISSING_FEATURES, EpochOptions, EpochPlan, Generation, make_plan
from dlindex.loader.export_datasets import rank_and_world
from dlindex.loader.l2 import wanted
from dlindex.loader.row_cache import DEFAULT_SIZE
from dlindex.loader.texts import Tokenizer
from dlindex.loader.torch_optional import TorchOptionalIterable
from dlindex.loader.worker import ON_ERROR, WorkerJob, run_worker
from dlindex.query.spec import QuerySpec

_FILTERS = frozenset(f.name for f in fields(QuerySpec)) - {
    "columns", "order", "seed", "limit", "offset", "cache", "exif_orient",
}  # fmt: skip


class CatalogDataset(TorchOptionalIterable):
    """The samples a catalog query selects, as an iterable dataset (a torch ``IterableDataset``
    when torch is installed); see docs/training.md.

    Each epoch (``set_epoch``) resolves the query once — ``per_label=N`` draws a new
    class-balanced set per (seed, epoch) — splits it into equal rank shares and, within a
    rank, into whole batches per DataLoader worker. It yields batches of ``batch_size``
    (dicts of ``id``, ``label``, ``image`` and/or ``features`` arrays), or single samples
    when ``batch_size`` is None (for torch's own DataLoader to batch). ``texts=True`` adds
    each sample's ``text`` (its first, "" without one) and ``texts`` (all); ``tokenizer=``
    (an HF tokenizer or any function of a list of texts) adds their token ids
    (dlindex.loader.texts).

    Query filters are the keyword arguments of ``dlindex.QuerySpec`` (``labels``, ``split``,
    ``status``, ``since``, ``min_width``, ``per_label``, ...). Images are the stored pixels
    (as torchvision's ImageFolder); ``exif_orient=True`` turns them as their EXIF orientation
    says, and the size filters then compare the turned sides (docs/concepts.md#orientation).
    Samples set aside by ``mark
    --exclude`` are left out unless ``excluded`` says otherwise. With ``source=`` an export
    folder, ``split`` names the export's splits (``export --split train=0.9,val=0.1``): only
    those are read; an export of several splits needs one named.
    """

    def __init__(
        self, database_path: str | os.PathLike[str], *, feature_type: str | None = None, images: bool | None = None,
        image_size: tuple[int, int] | int | None = None, mode: str = "RGB",
        transform: Callable[[Any], Any] | None = None, source: str | os.PathLike[str] = "auto",
        batch_size: int | None = None, drop_last: bool = False, shuffle: bool = True, shuffle_buffer: int = 512,
        seed: int = 0, rank: int | None = None, world_size: int | None = None, missing_features: str = "skip",
        on_error: str = "skip", row_cache_size: int = DEFAULT_SIZE, l2: str = "auto", l2_url: str | None = None,
        exif_orient: bool = False, at: str | None = None, texts: bool = False, tokenizer: Tokenizer | None = None,
        **filters: Any,
    ) -> None:  # fmt: skip
        unknown = sorted(set(filters) - _FILTERS)
        if unknown:
            raise InputError(
                f"unknown option(s) {', '.join(unknown)}; query filters are: {', '.join(sorted(_FILTERS))}"
            )
        if missing_features not in MISSING_FEATURES:
            raise InputError(f"missing_features must be one of {', '.join(MISSING_FEATURES)}, not {missing_features!r}")
        if on_error not in ON_ERROR:
            raise InputError(f"on_error must be one of {', '.join(ON_ERROR)}, not {on_error!r}")
        if batch_size is not None and batch_size < 1:
            raise InputError(f"batch_size must be 1 or more, not {batch_size}")
        self.database_path = os.fspath(database_path)
        if not is_server_url(self.database_path) and not os.path.isfile(self.database_path):
            raise InputError(f"no catalog at {self.database_path}; run dlindex scan first")
        if tokenizer is not None and not callable(tokenizer):
            raise InputError(f"tokenizer must be callable (an HF tokenizer or a function of a list of texts), "
                             f"not {type(tokenizer).__name__}")  # fmt: skip
        self.texts = bool(texts) or tokenizer is not None
        if self.texts and at is not None:
            raise InputError("texts are read as they are now (they keep no history yet): not with at=")
        self.tokenizer = tokenizer
        self.feature_type = feature_type
        self.images = feature_type is None if images is None else bool(images)
        if not self.images and feature_type is None and not self.texts:
            raise InputError("images=False needs a feature_type or texts=True: a batch would carry nothing")
        size = (image_size, image_size) if isinstance(image_size, int) else image_size
        self.spec = ImageSpec(size=None if size is None else (int(size[0]), int(size[1])), mode=mode,
                              exif_orient=bool(exif_orient))  # fmt: skip
        self.transform = transform
        self.source = source if source in ("auto", "files") else os.fspath(source)
        export_split: tuple[str, ...] = ()
        if self.source not in ("auto", "files"):  # split names the export's splits, not the tree's
            chosen = filters.pop("split", None) or ()
            export_split = (chosen,) if isinstance(chosen, str) else tuple(str(s) for s in chosen)
        self.batch_size = batch_size
        self.options = EpochOptions(
            filters=QuerySpec(**filters, exif_orient=bool(exif_orient)), seed=int(seed), shuffle=bool(shuffle), window=max(1, int(shuffle_buffer)),
            drop_last=bool(drop_last), feature_type=feature_type, missing_features=missing_features, source=self.source,
            export_split=export_split, l2_url=wanted(l2, l2_url, self.database_path),
        )  # fmt: skip
        self.rank, self.world_size = rank, world_size
        self.at = None if at is None else str(at)  # a version, tag or export: the catalog as it stood then
        self.resume_at: str | None = None  # a resumed epoch's state (DataLoader.load_state_dict), this epoch only
        self.on_error = on_error
        self.row_cache_size = int(row_cache_size)
        self.epoch = 0
        self.track = False  # set by dlindex.torch.DataLoader, which follows each worker's progress
        self.history: tuple[Generation, ...] = ()  # generations read before a resume, this epoch
        self.digest: str | None = None  # the resumed epoch's selection (checked when re-resolved)
        self._plan: tuple[tuple[Any, ...], EpochPlan] | None = None
        rank_now, world_now = rank_and_world(rank, world_size)
        if not 0 <= rank_now < world_now:
            raise InputError(f"rank {rank_now} is not in a world of size {world_now}")

    def reading_at(self) -> str | None:
        """The catalog state this epoch reads: ``at``, a resumed epoch's saved state, or None (now)."""
        return self.at if self.at is not None else self.resume_at

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (a new per-label draw, a new order)."""
        if int(epoch) != self.epoch:
            self.history, self.digest, self.resume_at = (), None, None
        self.epoch = int(epoch)

    def plan(self, workers: int = 1) -> EpochPlan:
        """This epoch's plan for ``workers`` DataLoader workers per rank (made once, then kept)."""
        rank, world = rank_and_world(self.rank, self.world_size)
        now = Generation(world, max(1, workers), self.batch_size or 1)
        key = (self.epoch, now, self.history, self.digest, rank)
        if self._plan is None or self._plan[0] != key:
            from dlindex.catalog.connection import Catalog

            # logged (the query log sees training's queries), unless it reads a past version
            at = self.reading_at()
            with Catalog(self.database_path, log=None if at is None else False, at=at) as catalog:
                plan = make_plan(catalog, self.options, self.epoch, self.history, now, self.digest,
                                 private=_in_worker(), rank=rank)  # fmt: skip
            self._plan = (key, plan)
        return self._plan[1]

    def __len__(self) -> int:
        """Batches (samples, without batch_size) this rank yields this epoch."""
        return self.plan(_workers()[1]).layout.batches()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        worker, workers = _workers()
        plan = self.plan(workers)
        rank, _ = rank_and_world(self.rank, self.world_size)
        job = WorkerJob(plan=plan, rank=rank, worker=worker, database_path=self.database_path, images=self.images,
                        spec=self.spec, transform=self.transform, feature_type=self.feature_type,
                        on_error=self.on_error, batch_size=self.batch_size, row_cache_size=self.row_cache_size,
                        l2_url=self.options.l2_url, track=self.track, at=self.reading_at(), texts=self.texts,
                        tokenizer=self.tokenizer)  # fmt: skip
        return run_worker(job)

    def __reduce__(self) -> tuple[Any, ...]:
        # the plan travels with it: spawned workers need not query again
        return (_rebuild, (dict(self.__dict__),))


def _rebuild(state: dict[str, Any]) -> CatalogDataset:
    dataset = CatalogDataset.__new__(CatalogDataset)
    dataset.__dict__.update(state)
    return dataset


def _workers() -> tuple[int, int]:
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return (info.id, info.num_workers) if info is not None else (0, 1)


def _in_worker() -> bool:
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None
