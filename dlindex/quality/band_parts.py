"""One band of the near-hash search over many hashes, a partition at a time from a file on disk.

The hashes are cut by the band's top ``t`` bits into 2^t partitions, written to one temporary
file (16 bytes a hash: the hash and its position) in a single pass over the hashes. Two band
values within ``radius`` bits have top bits within ``radius`` bits too, so every candidate
pair lies in one partition P (the flips of the low bits, searched as the in-memory band is) or
between P and Q = P ^ g for a g of 1 to ``radius`` top bits (each pair of partitions once, from
the P with g's highest bit clear: the same rule that takes each pair of buckets once); then the
low bits may differ in at most ``radius`` minus g's bits. Memory holds two partitions (about
2 x PART_HASHES hashes) and their bucket tables, whatever the number of hashes. The pairs are
exactly those of the in-memory band, in another order.

The file is ``tempfile.TemporaryFile`` (on Linux nameless, elsewhere unlinked at once): no exit
can leave it behind, and its space is freed when the band is done.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterator
from typing import IO

import numpy as np
import numpy.typing as npt

from dlindex.faults import disk_full_error, is_disk_full
from dlindex.quality import pairs
from dlindex.quality.pairs import (
    Band,
    PairChunk,
    Positions,
    _flips,
    band_pairs,
    buckets,
    cross,
    moved,
)

_RECORD = np.dtype([("hash", "<u8"), ("at", "<i8")])


def partitioned_pairs(
    h: npt.NDArray[np.uint64], k: int, earlier: list[Band], band: Band, parts: int
) -> Iterator[PairChunk]:
    """The pairs of one band (``band`` = (shift, width, radius)) found a partition at a time:
    the same pairs as the in-memory search of that band, for ``parts`` top bits."""
    shift, width, radius = band
    low = width - parts
    with _Partitions(h, shift + low, parts) as store:
        for p in range(1 << parts):
            here = _sorted(store.read(p), shift, low)
            yield from band_pairs(here[0], here[1], k, earlier, here[2], low, radius)
            for g in _flips(parts, radius):
                if p >> (g.bit_length() - 1) & 1:  # this pair of partitions is taken from p ^ g
                    continue
                there = _sorted(store.read(p ^ g), shift, low)
                if here[0].size and there[0].size:
                    yield from _between(here, there, k, earlier, low, radius - g.bit_count())


def _sorted(
    rows: npt.NDArray[np.void], shift: int, low: int
) -> tuple[npt.NDArray[np.uint64], Positions, npt.NDArray[np.uint32]]:
    """(hashes, their positions, their low band values) of a partition, sorted by the values."""
    hashes = np.ascontiguousarray(rows["hash"])
    values = ((hashes >> np.uint64(shift)) & np.uint64((1 << low) - 1)).astype(np.uint32)
    order = np.argsort(values, kind="stable")
    return hashes[order], rows["at"][order].astype(np.intp), values[order]


def _between(
    here: tuple[npt.NDArray[np.uint64], Positions, npt.NDArray[np.uint32]],
    there: tuple[npt.NDArray[np.uint64], Positions, npt.NDArray[np.uint32]],
    k: int,
    earlier: list[Band],
    low: int,
    radius: int,
) -> Iterator[PairChunk]:
    """The candidates between two partitions: low values equal or 1 to ``radius`` bits apart."""
    sorted_h = np.concatenate((here[0], there[0]))
    order = np.concatenate((here[1], there[1]))
    counts, starts, occupied = buckets(here[2], low)
    other_counts, other_starts, other_occupied = buckets(there[2], low)
    other_starts += here[0].size  # the second partition follows the first in sorted_h
    for f in itertools.chain([0], _flips(low, radius)):
        both = occupied & moved(other_occupied, f)
        if both.any():
            yield from cross(sorted_h, order, k, earlier, (starts, counts), (other_starts, other_counts), both, f)


class _Partitions:
    """The hashes cut by their bits ``shift`` .. ``shift + bits - 1``, in one temporary file."""

    def __init__(self, h: npt.NDArray[np.uint64], shift: int, bits: int) -> None:
        self.h, self.shift, self.bits = h, shift, bits
        self.file: IO[bytes] | None = None
        self.blocks: list[list[tuple[int, int]]] = [[] for _ in range(1 << bits)]  # (offset, records)

    def __enter__(self) -> _Partitions:
        folder = tempfile.gettempdir()
        try:
            self.file = tempfile.TemporaryFile(prefix=".dlindex-bands-")  # closed in __exit__
            size = 0
            step = pairs.PART_HASHES
            for at in range(0, self.h.size, step):
                chunk = self.h[at : at + step]
                part = ((chunk >> np.uint64(self.shift)) & np.uint64((1 << self.bits) - 1)).astype(np.intp)
                order = np.argsort(part, kind="stable")
                rows = np.empty(order.size, dtype=_RECORD)
                rows["hash"], rows["at"] = chunk[order], order + at
                self.file.write(rows.tobytes())
                ends = np.cumsum(np.bincount(part, minlength=1 << self.bits))
                for p, (start, end) in enumerate(
                    zip(np.concatenate(([0], ends[:-1])).tolist(), ends.tolist(), strict=True)
                ):
                    if end > start:
                        self.blocks[p].append((size + start * _RECORD.itemsize, end - start))
                size += rows.nbytes
            self.file.flush()
        except OSError as e:
            self.__exit__()
            if is_disk_full(e):
                raise disk_full_error(e, paths=[folder]) from None
            raise
        return self

    def read(self, p: int) -> npt.NDArray[np.void]:
        """Partition ``p``'s records, in the order of their positions."""
        assert self.file is not None
        fd = self.file.fileno()
        pieces = [
            np.frombuffer(os.pread(fd, n * _RECORD.itemsize, offset), dtype=_RECORD) for offset, n in self.blocks[p]
        ]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=_RECORD)

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
