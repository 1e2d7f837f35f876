"""``features compute``: queue the selected samples, extract in worker processes, write in batches.

The main process selects the samples that have no vector of the type yet (and no recorded
failure, unless retried), marks them ``queued`` for the type (``feature_state``) and is the
single writer; forked workers decode images and run the extractor. Each batch of results is
one transaction that stores the vectors and clears their state (or records ``failed``, with
the error), so a kill at any moment leaves whole batches, and the next run computes exactly
the rest. ``image_metadata`` is never written: its flags are the user's (``dlindex mark``).
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import InitVar, asdict, dataclass, field, replace
from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import xxhash

from dlindex.catalog.shard_runs import finish_shard_run, start_shard_run
from dlindex.engines import check_engine
from dlindex.engines.local import sigterm_as_interrupt
from dlindex.engines.parts import Part, id_parts, renamed_shard
from dlindex.engines.ray import connected
from dlindex.errors import InputError, Interrupted
from dlindex.features import compute_state, extractor_versions
from dlindex.features.blobs import Ids
from dlindex.features.extractors import BUILTINS, Extractor, canonical_spec, load_extractor
from dlindex.features.text_compute import have_texts
from dlindex.features.text_extractors import BUILTIN_TEXT, PREFIX
from dlindex.features.types import (
    FeatureType,
    all_types,
    check_dtype,
    check_name,
    create_type,
    find_type,
    get_type,
)
from dlindex.features.vector_writer import VectorWriter
from dlindex.features.workers import Pool, Results
from dlindex.query.rows import query_rows
from dlindex.query.spec import QuerySpec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

_QUEUE_CHUNK = 50_000
_TEXT_BATCHES = 16


@dataclass(frozen=True)
class ComputeOptions:
    """How to compute; ``extractor`` and ``dtype`` are needed only for a new feature type."""

    extractor: str | None = None
    dtype: str | None = None
    workers: int = 0  # 0: one per CPU
    batch_size: int = 64  # images per worker task: fewer wake-ups of the writer
    retry_failed: bool = False
    engine: str = "local"  # or "ray": batches on a Ray cluster (dlindex.features.onray)
    address: str | None = None  # the Ray cluster's; None: $RAY_ADDRESS, else a local one
    part: Part | None = None  # part I of N of the selected samples, by id (docs/scale-out.md)
    queued: bool = False  # the type's queued samples only (an automatic type's new ones), no selection
    shard: InitVar[Part | None] = None  # deprecated: the old name of ``part``

    def __post_init__(self, shard: Part | None) -> None:
        if shard is not None:
            object.__setattr__(self, "part", renamed_shard("ComputeOptions", shard, self.part))


@dataclass(frozen=True)
class ComputeSummary:
    feature_type: str
    extractor: str
    dim: int | None
    dtype: str
    selected: int
    already_done: int
    skipped_failed: int
    computed: int
    failed: int
    seconds: float
    images_per_s: float
    interrupted: bool = False
    error_samples: tuple[tuple[int, str], ...] = field(default=())
    extractor_version: str = ""  # the version that made this run's vectors
    stale: int = 0  # selected samples whose vector another version made: made again
    no_text: int = 0  # a text type's selected samples without a text: no vector, not failed

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["error_samples"] = [{"id": i, "error": e} for i, e in self.error_samples]
        return data


def compute_features(
    catalog: Catalog,
    feature_type: str,
    spec: QuerySpec | None = None,
    options: ComputeOptions = ComputeOptions(),
    progress: Callable[[int], None] | None = None,
) -> ComputeSummary:
    """Compute the vectors of ``feature_type`` for the samples ``spec`` selects (default: status
    ok) that have none yet; see docs/commands/features.md.

    Raises:
        InputError: a bad name, spec or dtype, an unimportable extractor (nothing written).
        Interrupted: Ctrl-C or SIGTERM, after committing what was finished.
    """
    started = time.perf_counter()
    check_engine(options.engine)
    if options.address is not None and options.engine != "ray":
        raise InputError("--address names a Ray cluster: give --engine ray with it")
    if options.queued:
        if spec is not None:
            raise InputError("--queued computes the samples queued for the type; give no filters with it")
        get_type(catalog, check_name(feature_type))  # an unknown type has no queue
    ftype, extractor = _prepare_type(catalog, check_name(feature_type), options)
    if extractor.embed is not None and options.engine == "ray":
        raise InputError("a text type is computed on this machine (--engine local), not with --engine ray yet")
    with connected(options.address) if options.engine == "ray" else nullcontext():
        return _compute(catalog, feature_type, ftype, extractor, spec, options, progress, started)


def compute_queued(
    catalog: Catalog, options: ComputeOptions = ComputeOptions(), progress: Callable[[int], None] | None = None
) -> list[ComputeSummary]:
    """``compute_features`` of every automatic type's queue (``features compute --queued``), by name."""
    automatic = [ftype.name for ftype in all_types(catalog) if ftype.auto and ftype.extractor != "import"]
    return [compute_features(catalog, name, None, replace(options, queued=True), progress) for name in automatic]


def _compute(
    catalog: Catalog,
    feature_type: str,
    ftype: FeatureType | None,
    extractor: Extractor,
    spec: QuerySpec | None,
    options: ComputeOptions,
    progress: Callable[[int], None] | None,
    started: float,
) -> ComputeSummary:
    if options.queued:
        rows = compute_state.queued_samples(catalog, feature_type)
    else:
        rows = query_rows(catalog, replace(spec or QuerySpec(), columns=("id", "path")))
    version = extractor_versions.version_of(extractor)
    vid = extractor_versions.version_id(version)
    # Vectors stored before versions were recorded are taken as this version's (the module's note).
    claim = ftype is not None and ftype.extractor_version is None
    done, stale = _vector_ids(catalog, ftype, vid, claim)
    failed = _ids(catalog, compute_state.FAILED_IDS, ftype if not options.retry_failed else None)
    todo: list[tuple[int, bytes]] = []
    selected = already = outdated = no_text = 0
    for chunk in _chunks(rows, _QUEUE_CHUNK):  # streamed: only what is left to do is kept
        ids = np.fromiter((r["id"] for r in chunk), dtype=np.int64, count=len(chunk))
        if options.part is not None:
            mine = id_parts(ids, options.part.count) == options.part.index
            chunk = [r for r, keep in zip(chunk, mine, strict=True) if keep]
            ids = ids[mine]
        have, skip = _member(ids, done), _member(ids, failed)
        if extractor.embed is not None:  # a text type: samples without a text have nothing to embed
            empty = ~have_texts(catalog, ids)
            no_text += int((empty & ~have).sum())
            skip |= empty
        selected += len(chunk)
        already += int(have.sum())
        outdated += int((_member(ids, stale) & ~skip).sum())
        # A text type's task is its ids alone (its worker reads their texts): a pipe takes a task
        # of 16 image batches' ids at once, and a worker writing its result never blocks a send.
        ids_only = extractor.embed is not None
        todo.extend((r["id"], b"" if ids_only else os.fsencode(r["path"]))
                    for r, leave in zip(chunk, have | skip, strict=True) if not leave)  # fmt: skip
    if ftype is None or todo or ftype.extractor_version != vid:
        with catalog.write_transaction() as conn:
            if ftype is None:
                create_type(conn, feature_type, options.dtype or extractor.dtype, extractor.spec, extractor.dim)
            extractor_versions.record(conn, feature_type, version, claim=claim)
            for start in range(0, len(todo), _QUEUE_CHUNK):
                compute_state.queue(conn, feature_type, [i for i, _ in todo[start : start + _QUEUE_CHUNK]])
    if ftype is None:  # made just now, by this process or by another one running at once
        _prepare_type(catalog, feature_type, replace(options, extractor=extractor.spec))
    ftype = find_type(catalog, feature_type)
    assert ftype is not None
    writer = VectorWriter(catalog, ftype, vid)
    interrupted = False
    shard_run = None
    if options.part is not None:
        part, plan = options.part, _part_plan(ftype, spec, options, version)
        shard_run = start_shard_run(catalog, "features", ftype.name, part.index, part.count, plan)
    restore = sigterm_as_interrupt()
    try:
        if todo:
            _run(catalog, todo, extractor, ftype, options, writer, progress or (lambda n: None))
        writer.flush()
    except KeyboardInterrupt:
        interrupted = True
        writer.flush()
    finally:
        restore()
    if shard_run is not None:
        finish_shard_run(catalog, shard_run, completed=not interrupted)
    seconds = time.perf_counter() - started
    final = find_type(catalog, feature_type) or ftype
    summary = ComputeSummary(
        feature_type=ftype.name, extractor=ftype.extractor, dim=final.dim, dtype=ftype.dtype,
        selected=selected, already_done=already, skipped_failed=selected - already - len(todo) - no_text,
        computed=writer.computed, failed=writer.failed, seconds=round(seconds, 3),
        images_per_s=round((writer.computed + writer.failed) / seconds, 1) if seconds > 0 else 0.0,
        interrupted=interrupted, error_samples=tuple(writer.errors), extractor_version=version, stale=outdated,
        no_text=no_text,
    )  # fmt: skip
    if interrupted:
        raise Interrupted(
            f"features compute interrupted after {writer.computed} vectors were stored; "
            "run the same command again to finish"
        )
    return summary


def _part_plan(ftype: FeatureType, spec: QuerySpec | None, options: ComputeOptions, version: str) -> str:
    """What every part of one compute in parts shares: the type, its extractor's version, the
    selection, N."""
    assert options.part is not None
    described = json.dumps(
        [ftype.name, ftype.extractor, repr(spec or QuerySpec()), options.retry_failed, options.part.count, version]
    )
    return xxhash.xxh3_128_hexdigest(described.encode())


def _vector_ids(catalog: Catalog, ftype: FeatureType | None, vid: int, claim: bool) -> tuple[Ids, Ids]:
    """Sorted ids of the type's vectors that version ``vid`` made (with ``claim``, also those
    without a recorded version), and of those another version made (stale)."""
    if ftype is None:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    # (id, version) pairs flattened in C: 8 bytes a value, no Python int kept; -1 is "none" (ids are >= 0)
    pairs = np.fromiter(chain.from_iterable(catalog.read(extractor_versions.VECTOR_VERSIONS, (ftype.name,))), np.int64)
    ids, made_by = pairs[0::2], pairs[1::2]
    mine = (made_by == vid) | (made_by == -1) if claim else made_by == vid
    return np.sort(ids[mine]), np.sort(ids[~mine])


def _ids(catalog: Catalog, sql: str, ftype: FeatureType | None) -> Ids:
    """Sorted ids from a per-type table (empty without a type)."""
    if ftype is None:
        return np.zeros(0, dtype=np.int64)
    ids: Ids = np.sort(np.fromiter((r[0] for r in catalog.read(sql, (ftype.name,))), dtype=np.int64))
    return ids


def _member(ids: Ids, sorted_ids: Ids) -> npt.NDArray[np.bool_]:
    if not sorted_ids.size:
        return np.zeros(ids.size, dtype=bool)
    at = np.minimum(np.searchsorted(sorted_ids, ids), sorted_ids.size - 1)
    member: npt.NDArray[np.bool_] = sorted_ids[at] == ids
    return member


def _chunks(rows: Iterator[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    chunk: list[dict[str, Any]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _prepare_type(catalog: Catalog, name: str, options: ComputeOptions) -> tuple[FeatureType | None, Extractor]:
    """The existing type (or None) and its extractor, resolved before anything is written."""
    if options.dtype is not None:
        check_dtype(options.dtype)
    ftype = find_type(catalog, name)
    if ftype is None:
        spec = options.extractor or (name if name in BUILTINS else PREFIX + name if name in BUILTIN_TEXT else None)
        if spec is None:
            raise InputError(
                f"feature type {name!r} is new: give --extractor SPEC (colorhist, thumb, colorthumb, dhash, "
                "module:function, torch:MODEL_FILE, torchvision:MODEL:WEIGHTS_FILE, text:ngrams or text:module:function)"
            )
        return None, load_extractor(spec)
    if options.extractor is not None and canonical_spec(options.extractor) != ftype.extractor:
        raise InputError(
            f"feature type {name!r} was made with extractor {ftype.extractor!r}, not {options.extractor!r}; "
            f"use another name, or dlindex features drop --type {name} first"
        )
    if options.dtype is not None and options.dtype != ftype.dtype:
        raise InputError(f"feature type {name!r} stores {ftype.dtype}, not {options.dtype}")
    if ftype.extractor == "import":
        raise InputError(f"feature type {name!r} was imported; it has no extractor to compute with")
    return ftype, load_extractor(ftype.extractor)


def _run(
    catalog: Catalog,
    todo: list[tuple[int, bytes]],
    extractor: Extractor,
    ftype: FeatureType,
    options: ComputeOptions,
    writer: VectorWriter,
    progress: Callable[[int], None],
) -> None:
    if options.engine == "ray":
        from dlindex.features.onray import run_on_ray  # pyarrow and Ray, only when asked for

        def add(results: Results) -> None:
            writer.add(results)
            progress(len(results))
            writer.maybe_flush()

        run_on_ray(todo, extractor, ftype.np_dtype, batch_size=options.batch_size, workers=options.workers, add=add)
        return
    # A text is ~1000x less work than an image: a text task is 16 of an image's, so the workers
    # stay busy while the writer commits, and a model sees batches of texts worth running.
    size = options.batch_size * (_TEXT_BATCHES if extractor.embed is not None else 1)
    batches = deque(todo[i : i + size] for i in range(0, len(todo), size))
    workers = max(1, options.workers or os.cpu_count() or 1)
    pool = Pool(workers, extractor, ftype.np_dtype, catalog.location if extractor.embed is not None else None)
    try:
        while batches or pool.inflight:
            while batches and pool.inflight < 3 * workers:
                pool.submit(batches.popleft())
            for results in pool.wait_any():
                writer.add(results)
                progress(len(results))
            writer.maybe_flush()
    except BaseException:
        pool.close(abort=True)
        raise
    pool.close()
