"""One worker's part of an epoch: read a window ahead in a thread, decode, batch, record failures."""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from dlindex.errors import DlindexError, DlindexWarning
from dlindex.loader.decode import DecodeError, ImageSpec, decode_image
from dlindex.loader.l2 import L2Cache
from dlindex.loader.row_cache import RowCache
from dlindex.loader.sources import FileReader, Read, WdsReader
from dlindex.loader.texts import Tokenizer, batch_texts, tokenized
from dlindex.query.spec import LOADER_FAILURE

if TYPE_CHECKING:
    from dlindex.loader.epoch import EpochPlan

Ints = npt.NDArray[np.int64]
ON_ERROR = ("skip", "replace")


@dataclass
class WorkerStats:
    """Counters of one worker in one epoch (the loader sums them over workers)."""

    samples: int = 0  # handed out (replacements included)
    skipped: int = 0
    replaced: int = 0
    failed: int = 0  # could not be read or decoded
    l1_hits: int = 0
    l1_misses: int = 0
    l2_hits: int = 0  # rows the L2 cache answered (of the L1 misses)
    l2_misses: int = 0
    export_fallbacks: int = 0  # export members that no longer matched the catalog: read from the file
    read_s: float = 0.0
    decode_s: float = 0.0
    errors: list[str] = field(default_factory=list)  # the first few failures, for the stats

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class WorkerJob:
    plan: EpochPlan
    rank: int
    worker: int
    database_path: str
    images: bool
    spec: ImageSpec
    transform: Callable[[Any], Any] | None
    feature_type: str | None
    on_error: str
    batch_size: int | None  # None: one sample at a time
    row_cache_size: int
    l2_url: str | None  # the L2 cache, when on
    track: bool  # add the "_dlindex" entry the dlindex DataLoader follows for resume
    at: str | None = None  # the catalog version the plan read (``at=``): rows are read as of it too
    texts: bool = False  # each batch carries its texts (dlindex.loader.texts)
    tokenizer: Tokenizer | None = None  # ... and their token ids


def run_worker(job: WorkerJob) -> Iterator[dict[str, Any]]:
    """The worker's batches (or samples), in its stream's order."""
    from dlindex.catalog.connection import Catalog

    layout = job.plan.layout
    stream = layout.stream(job.rank, job.worker)
    step = layout.batch_size
    stats = WorkerStats()
    catalog = Catalog(job.database_path, log=False, at=job.at)
    try:
        windows = _read_ahead(job, stream, stats) if job.images else _no_reads(stream, layout.window)
        done = 0
        unsent = False  # a batch failed whole since the last one handed over: its counts are not sent yet
        for positions, reads in windows:
            order = positions.tolist()
            for at in range(0, len(order), step):
                # decode a batch, hand it over, then the next: torch asks for at most prefetch_factor
                # batches ahead, so decoding the whole window first would idle while the step runs
                samples = [
                    _decoded(job, stats, p, r)
                    for p, r in zip(order[at : at + step], reads[at : at + step], strict=True)
                ]
                _record_failures(catalog, job, samples)
                done += len(samples)
                piece = _fill(job, stats, samples)
                if not piece:
                    unsent = True
                    continue
                stats.samples += len(piece)
                unsent = False
                yield from _emit(catalog, job, stats, piece, done)
        if job.track and unsent:
            # The counts travel with the batches: a stream ending in failed batches sends them in
            # an item of their own (never more items than planned batches: it stands for one).
            yield {"_dlindex": _progress(job, stats, done)}
        elif not job.track and layout.workers == 1 and not stats.samples and stats.failed:
            raise NothingReadError(nothing_read(job.plan.epoch, stats.failed, stats.errors))
    finally:
        catalog.close()


class NothingReadError(DlindexError):
    """No sample of an epoch could be read or decoded (the image tree is gone, unmounted...)."""


def nothing_read(epoch: int, failed: int, errors: list[str]) -> str:
    """The one-line message of an epoch in which every read failed."""
    first = f"; first: {errors[0]}" if errors else ""
    return (f"epoch {epoch}: none of its {failed} samples could be read{first}; "
            "is the image tree there (mounted, readable)?")  # fmt: skip


def _progress(job: WorkerJob, stats: WorkerStats, done: int) -> dict[str, Any]:
    """What the dlindex DataLoader follows: the worker, samples it went through, its counters."""
    return {"worker": job.worker, "offset": done, "stats": stats.as_dict()}


def _no_reads(stream: Ints, window: int) -> Iterator[tuple[Ints, list[Read]]]:
    for at in range(0, stream.size, window):
        positions = stream[at : at + window]
        yield positions, [b""] * positions.size


def _read_ahead(job: WorkerJob, stream: Ints, stats: WorkerStats) -> Iterator[tuple[Ints, list[Read]]]:
    """Windows of the stream with their bytes, read one window ahead in a thread (file reads
    release the GIL, so the next window's I/O overlaps this window's decode)."""
    handoff: queue.Queue[tuple[Ints, list[Read]] | BaseException | None] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def read_all() -> None:
        from dlindex.catalog.connection import Catalog

        try:
            with Catalog(job.database_path, log=False) as catalog:  # sqlite3 connections stay in their thread
                l2 = None
                if job.l2_url is not None and job.plan.l2_identity is not None:
                    l2 = L2Cache(job.l2_url, job.plan.l2_identity)
                rows = RowCache(catalog, job.row_cache_size, l2, job.plan.selection.state)
                files = FileReader(job.plan.selection, rows)
                reader: FileReader | WdsReader = files
                if job.plan.export is not None and job.plan.where is not None:
                    reader = WdsReader(job.plan.selection, job.plan.export, job.plan.where, files)
                try:
                    for at in range(0, stream.size, job.plan.layout.window):
                        if stop.is_set():
                            return
                        positions = stream[at : at + job.plan.layout.window]
                        started = time.perf_counter()
                        reading = np.sort(positions)  # storage order: file neighbours, shard members
                        got = dict(zip(reading.tolist(), reader.read(reading), strict=True))
                        stats.read_s += time.perf_counter() - started
                        stats.l1_hits, stats.l1_misses = rows.hits, rows.misses
                        if l2 is not None:
                            stats.l2_hits, stats.l2_misses = l2.hits, l2.misses
                        stats.export_fallbacks = getattr(reader, "fallbacks", 0)
                        handoff.put((positions, [got[p] for p in positions.tolist()]))
                finally:
                    if isinstance(reader, WdsReader):
                        reader.close()
            handoff.put(None)
        except BaseException as e:  # re-raised in the worker's main thread
            handoff.put(e)

    thread = threading.Thread(target=read_all, name="dlindex-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item = handoff.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a put() so the thread can see stop
            with contextlib.suppress(queue.Empty):
                handoff.get(timeout=0.05)


@dataclass
class _Sample:
    position: int
    image: Any = None
    error: str | None = None


def _decoded(job: WorkerJob, stats: WorkerStats, position: int, read: Read) -> _Sample:
    if not job.images:
        return _Sample(position)
    if isinstance(read, str):
        return _failed(stats, position, read, job)
    started = time.perf_counter()
    try:
        if job.transform is None:
            image = decode_image(read, job.spec, channels_first=True)  # as the batch holds it: no transposes
        else:
            image = job.transform(decode_image(read, job.spec))  # a user's transform gets H x W x C
    except DecodeError as e:
        return _failed(stats, position, str(e), job)
    finally:
        stats.decode_s += time.perf_counter() - started
    return _Sample(position, image)


def _failed(stats: WorkerStats, position: int, error: str, job: WorkerJob) -> _Sample:
    stats.failed += 1
    if len(stats.errors) < 5:
        stats.errors.append(f"sample {int(job.plan.selection.ids[position])}: {error}")
    return _Sample(position, error=error)


def _fill(job: WorkerJob, stats: WorkerStats, samples: list[_Sample]) -> list[_Sample]:
    """A batch without its failures: dropped, or replaced by a good sample of the same batch."""
    good = [s for s in samples if s.error is None]
    bad = len(samples) - len(good)
    if not bad:
        return samples
    if job.on_error == "skip" or not good:
        stats.skipped += bad
        return good
    stats.replaced += bad
    out, k = [], 0
    for s in samples:  # the k-th failure takes the k-th good sample's place (deterministic)
        if s.error is None:
            out.append(s)
        else:
            out.append(good[k % len(good)])
            k += 1
    return out


def _emit(
    catalog: Any, job: WorkerJob, stats: WorkerStats, piece: list[_Sample], done: int
) -> Iterator[dict[str, Any]]:
    selection = job.plan.selection
    at = np.fromiter((s.position for s in piece), dtype=np.int64, count=len(piece))
    ids, labels = selection.ids[at], selection.labels[at].astype(np.int64)  # the plan keeps int32 classes
    vectors = None
    if job.feature_type is not None:
        from dlindex.features.storage import feature_vectors

        vectors = feature_vectors(catalog, ids, job.feature_type)  # one query a batch
    firsts: list[str] = []
    if job.texts:
        firsts, every = batch_texts(catalog, ids.tolist())  # one query a batch too
    if job.batch_size is None:
        for k, s in enumerate(piece):
            out = _sample_dict(int(ids[k]), int(labels[k]), s.image, None if vectors is None else vectors[k], job)
            if job.texts:
                out.update(text=firsts[k], texts=every[k])
                if job.tokenizer is not None:
                    out.update((key, value[0]) for key, value in tokenized(job.tokenizer, firsts[k : k + 1]).items())
            yield out
        return
    batch: dict[str, Any] = {"id": ids, "label": labels}
    if job.images:
        batch["image"] = _stack([s.image for s in piece], job.transform is None)
    if vectors is not None:
        batch["features"] = vectors
    if job.texts:
        batch.update(text=firsts, texts=every)
        if job.tokenizer is not None:
            batch.update(tokenized(job.tokenizer, firsts))
    if job.track:
        batch["_dlindex"] = _progress(job, stats, done)
    yield batch


def _sample_dict(sample_id: int, label: int, image: Any, vector: Any, job: WorkerJob) -> dict[str, Any]:
    out: dict[str, Any] = {"id": sample_id, "label": label}
    if job.images:
        out["image"] = np.ascontiguousarray(image) if job.transform is None else image
    if vector is not None:
        out["features"] = vector
    return out


def _stack(images: list[Any], decoded: bool) -> Any:
    """B x C x H x W uint8 when every image has one size; else the list (decoded images
    arrive C x H x W)."""
    if not decoded:
        first = images[0]
        if all(isinstance(i, np.ndarray) and i.shape == first.shape for i in images):
            return np.stack(images)
        if type(first).__module__.startswith("torch") and all(getattr(i, "shape", None) == first.shape for i in images):
            import torch

            return torch.stack(images)
        return images
    if all(i.shape == images[0].shape for i in images):
        out, handed = _batch_buffer((len(images), *images[0].shape))
        for k, image in enumerate(images):
            out[k] = image  # already C x H x W: one copy into the batch
        return handed
    return [np.ascontiguousarray(i) for i in images]


def _batch_buffer(shape: tuple[int, ...]) -> tuple[npt.NDArray[np.uint8], Any]:
    """(numpy view, what to hand over) of a uint8 batch: in a DataLoader worker, a tensor in
    shared memory (as torch's own collate makes), so the batch crosses to the main process
    without another copy."""
    torch = sys.modules.get("torch")
    data = sys.modules.get("torch.utils.data")
    if torch is not None and data is not None and data.get_worker_info() is not None:
        try:
            storage = torch.UntypedStorage._new_shared(int(np.prod(shape)))
            tensor = torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)
            return tensor.numpy(), tensor
        except (AttributeError, RuntimeError):  # another torch: a plain array, copied as usual
            pass
    array = np.empty(shape, dtype=np.uint8)
    return array, array


_warned_read_only = False


def _record_failures(catalog: Any, job: WorkerJob, samples: list[_Sample]) -> None:
    """Failed samples are marked in the catalog (processing_status 'failed', the error after
    LOADER_FAILURE), best effort."""
    global _warned_read_only
    failures = {int(job.plan.selection.ids[s.position]): s.error for s in samples if s.error is not None}
    if not failures:
        return
    from dlindex.catalog.connection import Catalog
    from dlindex.query.mark import mark_samples

    try:
        # A loader reading a past version (at=) records today's failures in today's catalog.
        writer = catalog if catalog.pinned is None else Catalog(job.database_path, log=False)
        try:
            for sample_id, error in failures.items():
                text = LOADER_FAILURE + (error or "")  # the prefix a rescan knows: it re-checks the file
                mark_samples(writer, [str(sample_id)], processing_status="failed", error=text[:500])
        finally:
            if writer is not catalog:
                writer.close()
    except DlindexError as e:
        if not _warned_read_only:
            _warned_read_only = True
            warnings.warn(f"decode failures were not recorded in the catalog: {e}", DlindexWarning, stacklevel=2)
