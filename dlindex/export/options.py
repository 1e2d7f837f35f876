"""What ``dlindex export`` takes besides OUT_DIR and what it reports, with the bounds it checks."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dlindex.engines.parts import Part as Shard  # export/ says Shard for a part until its restructuring settles
from dlindex.export.plan import ExportError
from dlindex.export.spill import ENV_BUDGET
from dlindex.exported.formats import DEFAULT
from dlindex.exported.validate import MAX_COUNT, MAX_WORLD_SIZE
from dlindex.query.spec import QuerySpec

DEFAULT_WORKERS = 8  # wds: DataLoader(num_workers=N) up to this many never finds a worker without a shard
MAX_SHARD_SAMPLES = 1 << 31
MAX_SHARD_BYTES = 1 << 40
MAX_READ_THREADS = 256
MAX_WORKERS = 1024  # shards per rank: a DataLoader has far fewer workers
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)\s*$", re.I)


class NothingSelected(ExportError):
    """No sample is left to export (none matched, or every one was skipped)."""


@dataclass(frozen=True)
class ExportOptions:
    """What ``dlindex export`` takes besides OUT_DIR; ``query`` holds the filters of ``dlindex query``.

    Args:
        shard_bytes: an int or text such as ``"256MiB"``, ``"1GB"``.
        split: ``"train=0.9,val=0.1"`` or a mapping: assigned by content hash; ``"tree"``: the
            tree's split folders; ``"val"``, ``"train,val"``: only these split folders. None:
            the tree's split folders when the selection is in split folders, else one split.
        drop_last: with ``world_size`` > 1, drop the remainder instead of padding with repeats.
        read_threads: read source files ahead with this many threads (cold caches, packed formats).
        workers: wds: every rank gets at least this many shards (a multiple of it), so a
            ``DataLoader(num_workers=N)`` with N up to this never has a worker without a shard.
        group: ``"near-dups"``: every near-duplicate group (``group_type``, default dhash
            within ``group_max_distance`` bits, default 8; an embedding type within
            ``group_threshold``) goes to one split. Needs fractions in ``split``.
        group_by: an attribute from the ``scan --labels`` CSV (a video, a patient id): the
            samples sharing a value go to one split.
        shard: ``Shard(I, N)`` or ``"I/N"``: write only part I of N (its plan groups and
            ``dlindex-part.json``); ``dlindex.export.merge_exports`` joins the N parts.
        memory_budget: bytes (or ``"512MiB"``) of rows an export with splits, ranks or a
            DALI list holds in memory before it spills them to its temporary folder; None:
            ``$DLINDEX_MEMORY_BUDGET``, else 256 MiB (dlindex.export.spill).
    """

    format: str = DEFAULT
    query: QuerySpec = field(default_factory=QuerySpec)
    shard_size: int | None = None
    shard_bytes: int | str | None = None
    shuffle: bool = False
    seed: int = 0
    split: Mapping[str, float] | str | None = None
    world_size: int = 1
    drop_last: bool = False
    features: str | None = None
    texts: bool = False  # each sample's texts in a manifest's rows (dlindex.export.texts)
    absolute_paths: bool = False
    overwrite: bool = False
    read_threads: int = 0
    workers: int = DEFAULT_WORKERS
    group: str | None = None
    group_by: str | None = None
    group_type: str | None = None
    group_max_distance: int | None = None
    group_threshold: float | None = None
    shard: Shard | str | None = None
    memory_budget: int | str | None = None
    appending: tuple[str, ...] | None = None  # export --append's rows: its export's class list (not recorded)


@dataclass(frozen=True)
class ExportSummary:
    out_dir: str
    format: str
    samples: int  # written, repeats included
    selected: int
    dropped: int
    padded: int
    splits: dict[str, int]
    shards: int
    bytes: int
    seconds: float
    skipped: dict[str, int] = field(default_factory=dict)  # sources not packed, by reason

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def parse_size(value: int | str | None) -> int | None:
    """Bytes from ``123``, ``"64MiB"``, ``"1.5GB"``, ``"500k"`` (K/M/G alone and KiB.. are powers of 1024)."""
    if value is None or isinstance(value, int):
        return value
    match = _SIZE.match(value)
    if not match:
        raise ExportError(f"size {value!r}: write a number of bytes with an optional unit, e.g. 256MiB or 1GB")
    number, unit, binary, b = match.groups()
    power = "kmgt".index(unit.lower()) + 1 if unit else 0
    base = 1000 if (unit and b and not binary) else 1024
    if len(number) > 20:  # float() of 400 digits is inf; no shard is that large anyway
        raise ExportError(f"size {value!r} is larger than {MAX_SHARD_BYTES} bytes")
    return int(float(number) * base**power)


def memory_budget(value: int | str | None) -> int | None:
    """The budget in bytes from the option, else ``$DLINDEX_MEMORY_BUDGET``; None: the default."""
    if value is None:
        value = os.environ.get(ENV_BUDGET) or None
    if value is None:
        return None
    size = parse_size(value)
    if size is None or isinstance(size, bool) or size < 1:
        raise ExportError(f"memory budget {value!r} must be a size of at least 1 byte, e.g. 512MiB")
    return size


def check_bounds(options: ExportOptions, shard_bytes: int | None) -> None:
    """ExportError for an option outside what an export can honour, before anything is allocated."""
    spec = options.query
    bounds: list[tuple[str, Any, int, int]] = [
        ("--shard-size", options.shard_size, 1, MAX_SHARD_SAMPLES),
        ("--shard-bytes", shard_bytes, 1, MAX_SHARD_BYTES),
        ("--world-size", options.world_size, 1, MAX_WORLD_SIZE),
        ("--read-threads", options.read_threads, 0, MAX_READ_THREADS),
        ("--workers", options.workers, 1, MAX_WORKERS),
        ("--seed", options.seed, -MAX_COUNT - 1, MAX_COUNT),
        ("--limit", spec.limit, 0, MAX_COUNT),
        ("--per-label", spec.per_label, 0, MAX_COUNT),
        ("--min-width", spec.min_width, 0, MAX_COUNT),
        ("--min-height", spec.min_height, 0, MAX_COUNT),
    ]  # fmt: skip
    for name, value, low, high in bounds:
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ExportError(f"{name} must be a whole number, not {value!r}")
        if not low <= value <= high:
            unit = " byte" if name == "--shard-bytes" else ""
            raise ExportError(f"{name} must be at least {low}{unit} and at most {high}, not {value}")


def check_selected(selected: int, skipped: Mapping[str, int]) -> None:
    """NothingSelected when an export would have no sample (none matched, or all were skipped)."""
    if not selected:
        if skipped:
            raise NothingSelected(f"no samples left to export: {sum(skipped.values())} skipped (see the warnings)")
        raise NothingSelected("no samples match the filters; nothing exported")
