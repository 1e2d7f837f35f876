"""One epoch's plan, made the same way by the main process, every worker and a resumed job."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from dlindex.errors import DlindexError, InputError
from dlindex.loader.l2 import L2Cache, catalog_identity
from dlindex.loader.layout import Layout, chunk_order
from dlindex.loader.rank_plan import resolve_rank
from dlindex.loader.selection import Selection, epoch_spec, resolve, with_hashes
from dlindex.loader.shared_plan import PlanFile, release, write_plan
from dlindex.loader.sources import FILE_RUN, WdsExport, arrange_files, arrange_wds, find_export, named_export
from dlindex.query.spec import QuerySpec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

Ints = npt.NDArray[np.int64]
MISSING_FEATURES = ("skip", "compute", "raise")


@dataclass(frozen=True)
class Generation:
    """One stretch of an epoch read with one world: resume starts a new one."""

    world: int
    workers: int
    batch_size: int
    offsets: tuple[int, ...] = ()  # samples each worker had emitted (same on every rank)

    def as_dict(self) -> dict[str, Any]:
        return {"world": self.world, "workers": self.workers, "batch_size": self.batch_size,
                "offsets": list(self.offsets)}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Any) -> Generation:
        try:
            offsets = tuple(int(o) for o in data["offsets"])
            made = cls(int(data["world"]), int(data["workers"]), int(data["batch_size"]), offsets)
        except (KeyError, TypeError, ValueError):
            raise InputError("a loader state's generation needs world, workers, batch_size and offsets") from None
        if (
            min(made.world, made.workers, made.batch_size) < 1
            or len(offsets) != made.workers
            or min(offsets, default=0) < 0
        ):
            raise InputError("a loader state's generation has impossible sizes or offsets")
        return made


@dataclass(frozen=True)
class EpochPlan:
    """What to read this epoch and where every sample goes."""

    epoch: int
    selection: Selection  # in reading order
    layout: Layout
    export: WdsExport | None  # read from this export (else from the files)
    where: Ints | None  # each sample's export position
    missing_features: int  # samples left out (or computed) for lack of a vector
    digest: str = field(default="")
    l2_identity: str | None = None  # the catalog's name in the L2 cache, when L2 is on
    shared: PlanFile | None = None  # the file holding the arrays (share_plan): what a pickle carries

    @property
    def selected(self) -> int:
        """Samples the epoch's query selected, over all ranks (a rank's own plan holds its share)."""
        return self.layout.total if self.layout.only_rank >= 0 else len(self.selection)

    def __reduce__(self) -> tuple[Any, ...]:
        if self.shared is None:
            return (_plain, (dict(self.__dict__),))
        # a worker maps the plan's file instead of receiving its arrays
        bare = replace(self, selection=replace(self.selection, ids=_NONE, labels=_NONE, sizes=_NONE,
                                               hashes=_NO_HASHES), layout=replace(self.layout, order=_NONE),
                       where=None, shared=None)  # fmt: skip
        return (_attach, (bare, self.shared))


@dataclass(frozen=True)
class EpochOptions:
    filters: QuerySpec
    seed: int
    shuffle: bool
    window: int
    drop_last: bool
    feature_type: str | None
    missing_features: str
    source: str | os.PathLike[str]  # "auto", "files" or an export folder
    # With an export folder: read only these of its splits (() its only one; None all, as
    # source="auto" chose it before a resume)
    export_split: tuple[str, ...] | None = ()
    l2_url: str | None = None  # the L2 cache (Redis), when it is on for this catalog


def make_plan(catalog: Catalog, options: EpochOptions, epoch: int, history: tuple[Generation, ...],
              now: Generation, digest: str | None = None, *, private: bool = False,
              rank: int | None = None) -> EpochPlan:  # fmt: skip
    """Resolve the epoch's selection, choose its source and lay it out over the ranks.

    ``history``: the generations already read this epoch (a resumed job), oldest first.
    ``private``: the plan of one DataLoader worker, which shares it with no one.
    ``rank``: the rank that reads the plan; where it can, the plan then holds that rank's share
    only (rank_plan), in the same order. Resume, feature vectors, the L2 cache and a wds export
    need the whole selection and plan it all.
    """
    spec = epoch_spec(options.filters, options.seed, epoch)
    if rank is not None and _rank_only(catalog, options, history):
        return _rank_plan(catalog, options, spec, epoch, now, digest, rank, private)
    l2 = identity = None
    if options.l2_url is not None:
        identity = catalog_identity(catalog)
        l2 = L2Cache(options.l2_url, identity)
    selection = resolve(catalog, spec, l2, full=False)  # hashes only if an export is read
    export = None
    if options.source not in ("auto", "files"):
        export, selection = named_export(options.source, selection, options.export_split)
    missing = 0
    if options.feature_type is not None:
        selection, missing = _with_vectors(catalog, selection, spec, options)
    if digest and selection.digest != digest:  # the digest the plan records: after every cut
        raise DlindexError("the catalog's selection for this epoch differs from the saved loader state's "
                           "(the catalog changed since); resume is exact only over the same samples")  # fmt: skip
    if options.source == "auto":
        export = find_export(catalog, selection)
    where = None
    if export is not None:
        selection, starts, where = arrange_wds(with_hashes(catalog, selection), export)
    else:
        selection, starts = arrange_files(selection)
    order = chunk_order(starts, len(selection), options.seed, epoch, options.shuffle)
    first = history[0] if history else now
    layout = Layout(order=order, world=first.world, workers=first.workers, batch_size=first.batch_size,
                    window=_window(options, first.batch_size), drop_last=options.drop_last, seed=options.seed,
                    epoch=epoch)  # fmt: skip
    for k, done in enumerate(history):
        following = history[k + 1] if k + 1 < len(history) else now
        layout = layout.resumed(list(done.offsets), following.world, following.workers, following.batch_size)
    plan = EpochPlan(epoch, selection, layout, export, where, missing, digest=selection.digest, l2_identity=identity)
    return share_plan(plan, private=private)


def _rank_only(catalog: Catalog, options: EpochOptions, history: tuple[Generation, ...]) -> bool:
    """Whether the plan can hold one rank's share: loose files, no resume, no vectors, no L2."""
    if history or options.feature_type is not None or options.l2_url is not None:
        return False
    if options.source == "files":
        return True
    if options.source != "auto":
        return False
    from dlindex.export.registry import recorded_exports
    from dlindex.exported.formats import WDS

    # an export that may hold the selection is checked against all of it (find_export)
    return not recorded_exports(catalog, WDS.name)


def _rank_plan(catalog: Catalog, options: EpochOptions, spec: QuerySpec, epoch: int, now: Generation,
               digest: str | None, rank: int, private: bool) -> EpochPlan:  # fmt: skip
    selection, total = resolve_rank(catalog, spec, rank=rank, world=now.world, drop_last=options.drop_last,
                                    seed=options.seed, epoch=epoch, shuffle=options.shuffle, run=FILE_RUN)  # fmt: skip
    if digest and selection.digest != digest:
        raise DlindexError("the catalog's selection for this epoch differs from the saved loader state's "
                           "(the catalog changed since); resume is exact only over the same samples")  # fmt: skip
    layout = Layout(order=_NONE, world=now.world, workers=now.workers, batch_size=now.batch_size,
                    window=_window(options, now.batch_size), drop_last=options.drop_last, seed=options.seed,
                    epoch=epoch, only_rank=rank, total=total)  # fmt: skip
    plan = EpochPlan(epoch, selection, layout, None, None, 0, digest=selection.digest)
    return share_plan(plan, private=private)


def share_plan(plan: EpochPlan, *, private: bool = False) -> EpochPlan:
    """The plan with its arrays in a shared read-only file (shared_plan): ids, classes and the
    reading order, ~20 bytes a sample; with an export, also each sample's hash and member."""
    selection, n = plan.selection, len(plan.selection)
    labels = selection.labels
    if n and int(labels.min()) >= -(2**31) and int(labels.max()) < 2**31:
        labels = labels.astype(np.int32, copy=False)
    arrays: dict[str, npt.NDArray[Any]] = {"ids": selection.ids, "labels": labels, "order": plan.layout.order}
    if plan.where is not None:
        arrays |= {"hashes": selection.hashes, "where": plan.where}
    shared = EpochPlan(plan.epoch, selection, plan.layout, plan.export, plan.where, plan.missing_features,
                       plan.digest, plan.l2_identity)  # fmt: skip
    written = write_plan(arrays, shared)
    _fill(shared, written.arrays(), n)
    if private:  # mapped, then gone from the folder: a worker's exit skips clean-up at exit
        release(written)
    else:
        object.__setattr__(shared, "shared", written)
    return shared


def _plain(state: dict[str, Any]) -> EpochPlan:
    plan = EpochPlan.__new__(EpochPlan)
    plan.__dict__.update(state)
    return plan


def _attach(bare: EpochPlan, shared: PlanFile) -> EpochPlan:
    object.__setattr__(bare, "shared", shared)
    _fill(bare, shared.arrays(), int(shared.sections[0][1].count))
    return bare


def _fill(plan: EpochPlan, arrays: dict[str, npt.NDArray[Any]], n: int) -> None:
    """Point the plan's arrays at the file's (sizes are not kept: only the L2 cache, filled
    when the selection was resolved, needs them)."""
    hashes = arrays.get("hashes")
    selection = replace(plan.selection, ids=arrays["ids"], labels=arrays["labels"],
                        sizes=np.broadcast_to(np.int64(-1), (n,)),
                        hashes=hashes if hashes is not None else np.broadcast_to(_ZERO_HASH, (n,)))  # fmt: skip
    object.__setattr__(plan, "selection", selection)
    object.__setattr__(plan, "layout", replace(plan.layout, order=arrays["order"]))
    object.__setattr__(plan, "where", arrays.get("where"))


_NONE = np.zeros(0, dtype=np.int64)
_ZERO_HASH = np.zeros(1, dtype="V16")
_NO_HASHES = _ZERO_HASH[:0]


def _window(options: EpochOptions, batch_size: int) -> int:
    """Shuffle windows hold whole batches (a batch never waits on the next window's reads)."""
    if not options.shuffle:
        return batch_size
    return max(batch_size, round(options.window / batch_size) * batch_size)


def _with_vectors(catalog: Catalog, selection: Selection, spec: QuerySpec,
                  options: EpochOptions) -> tuple[Selection, int]:  # fmt: skip
    from dlindex.features.storage import vector_ids

    assert options.feature_type is not None
    have = np.isin(selection.ids, vector_ids(catalog, options.feature_type))
    missing = int((~have).sum())
    if not missing:
        return selection, 0
    if options.missing_features == "raise":
        raise InputError(f"{missing} of the {len(selection)} selected samples have no {options.feature_type!r} "
                         f"vector; run dlindex features compute --type {options.feature_type}, "
                         "or pass missing_features='skip' or 'compute'")  # fmt: skip
    if options.missing_features == "compute":
        from dlindex.features.pipeline import compute_features

        compute_features(catalog, options.feature_type, spec)
        have = np.isin(selection.ids, vector_ids(catalog, options.feature_type))
    return selection.keep(have), missing
