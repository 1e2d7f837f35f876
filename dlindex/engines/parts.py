"""Static parts: ``--part I/N`` names the I-th of N deterministic parts of a job (I from 0).

Every machine that runs part I of N computes the same cut from the same input, with no
coordinator: scan cuts by the walk's units, features by sample id, export by the plan's
(split, rank) groups. See docs/scale-out.md. (A *shard* is something else: a file an export
writes; docs/concepts.md#glossary.)
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlindex.errors import InputError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

MAX_PARTS = 100_000
_PART = re.compile(r"^\s*(\d{1,6})\s*/\s*(\d{1,6})\s*$")
_MIX = 0x9E3779B97F4A7C15  # Fibonacci hashing: consecutive ids spread evenly over parts


@dataclass(frozen=True)
class Part:
    """Part ``index`` (from 0) of ``count`` parts."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_part(text: str | Part | tuple[int, int] | None) -> Part | None:
    """``"I/N"`` (0 <= I < N) as a Part; None stays None; InputError on anything else."""
    if text is None or isinstance(text, Part):
        return text
    if isinstance(text, tuple):
        index, count = (int(v) for v in text)
    else:
        found = _PART.match(text)
        if found is None:
            raise InputError(f"--part {text[:40]!r}: write I/N, the I-th of N parts counted from 0 (e.g. 0/4)")
        index, count = int(found.group(1)), int(found.group(2))
    if not 1 <= count <= MAX_PARTS:
        raise InputError(f"--part {index}/{count}: N must be between 1 and {MAX_PARTS}")
    if not 0 <= index < count:
        raise InputError(
            f"--part {index}/{count}: I counts from 0 and must be below N (0/{count} .. {count - 1}/{count})"
        )
    return Part(index, count)


def id_parts(ids: npt.NDArray[np.int64], count: int) -> npt.NDArray[np.int64]:
    """The part (0..count-1) of each sample id: a multiplicative hash, so that runs of
    consecutive ids and ids of one class spread evenly, and the same id always lands alike."""
    import numpy as np  # here, not at the top: `dlindex scan` starts without numpy

    mixed = ids.astype(np.uint64) * np.uint64(_MIX)  # wraps modulo 2**64 by design
    part: npt.NDArray[np.int64] = ((mixed >> np.uint64(32)) % np.uint64(count)).astype(np.int64)
    return part


def balanced_parts(weights: list[int], count: int) -> list[int]:
    """The part (0..count-1) of each item, greedy largest first by weight, ties by position:
    deterministic, and within one item's weight of an even split."""
    loads = [0] * count
    part = [0] * len(weights)
    for item in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        target = min(range(count), key=lambda p: (loads[p], p))
        part[item] = target
        loads[target] += weights[item]
    return part


def renamed_shard(owner: str, shard: Part | None, part: Part | None) -> Part | None:
    """``owner(shard=...)``, the keyword ``part`` had before (#33): a DeprecationWarning, and the
    part it names; InputError if both are given and differ."""
    warnings.warn(f"{owner}(shard=...) is deprecated: write {owner}(part=...)", DeprecationWarning, stacklevel=4)
    if part is not None and part != shard:
        raise InputError(f"{owner}: give part= alone (shard= is its deprecated name)")
    return shard
