"""One band of the near-hash search over many hashes, a partition at a time from a file on disk
(the file and its partitions here; the search of each partition and pair of them in pairs.py).

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

import math
import os
import tempfile
from typing import IO

import numpy as np
import numpy.typing as npt

from dlindex.faults import disk_full_error, is_disk_full

_RECORD = np.dtype([("hash", "<u8"), ("at", "<i8")])
Sorted = tuple[npt.NDArray[np.uint64], npt.NDArray[np.intp], npt.NDArray[np.uint32]]


def partition_bits(n: int, part_hashes: int) -> int:
    """Top bits of a band that cut ``n`` hashes into partitions of about ``part_hashes``: 0 for few."""
    return max(0, math.ceil(math.log2(n / part_hashes))) if n > part_hashes else 0


def sorted_partition(rows: npt.NDArray[np.void], shift: int, low: int) -> Sorted:
    """(hashes, their positions, their ``low`` band bits from ``shift``) of a partition, sorted by those bits."""
    hashes = np.ascontiguousarray(rows["hash"])
    values = ((hashes >> np.uint64(shift)) & np.uint64((1 << low) - 1)).astype(np.uint32)
    order = np.argsort(values, kind="stable")
    return hashes[order], rows["at"][order].astype(np.intp), values[order]


class Partitions:
    """The hashes cut by their bits ``shift`` .. ``shift + bits - 1``, in one temporary file
    written ``step`` hashes at a time."""

    def __init__(self, h: npt.NDArray[np.uint64], shift: int, bits: int, step: int) -> None:
        self.h, self.shift, self.bits, self.step = h, shift, bits, step
        self.file: IO[bytes] | None = None
        self.blocks: list[list[tuple[int, int]]] = [[] for _ in range(1 << bits)]  # (offset, records)

    def __enter__(self) -> Partitions:
        folder = tempfile.gettempdir()
        try:
            self.file = tempfile.TemporaryFile(prefix=".dlindex-bands-")  # closed in __exit__
            size = 0
            for at in range(0, self.h.size, self.step):
                chunk = self.h[at : at + self.step]
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
