"""Where every sample of an epoch goes: chunk order, equal rank shares, worker spans, shuffle windows.

All pure functions of their arguments (no I/O): every rank, every worker and a restarted job
compute the same layout, and resume removes exactly what was consumed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dlindex.errors import InputError

Ints = npt.NDArray[np.int64]
_CHUNK_TAG = 0x636875
_WINDOW_TAG = 0x77696E


def chunk_order(chunk_starts: Ints, n: int, seed: int, epoch: int, shuffle: bool) -> Ints:
    """Positions 0..n-1 with the chunks (runs starting at ``chunk_starts``) in a seeded order.

    Chunks are what is read sequentially (a run of neighbouring files, one shard); their
    order changes every epoch, their insides stay in locality order.
    """
    positions = np.arange(n, dtype=np.int64)
    if not shuffle or n == 0:
        return positions
    starts = np.asarray(chunk_starts, dtype=np.int64)
    bounds = np.append(starts, n)
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(seed) >> 32, int(epoch), _CHUNK_TAG])
    picked = rng.permutation(starts.size)
    # each picked chunk's positions, shifted from where it lands to where it starts: no list of
    # a view per chunk (625k of them at 10^7 samples)
    lengths = np.diff(bounds)[picked]
    landed = np.cumsum(lengths) - lengths
    del positions
    order = np.repeat(starts[picked] - landed, lengths)
    for at in range(0, n, 1 << 20):  # in blocks: no second array of n
        order[at : at + (1 << 20)] += np.arange(at, min(n, at + (1 << 20)), dtype=np.int64)
    return order


def rank_runs(n: int, run: int, seed: int, epoch: int, shuffle: bool, rank: int, per: int) -> tuple[Ints, Ints, Ints]:
    """``rank``'s ``per`` positions of ``chunk_order`` over runs of ``run`` (chunk starts 0, run,
    2 run, ...), as (source position, length, destination) of each piece, without the order of
    all ``n``: what ``Layout.rank_positions(rank)`` holds, padding repeats included.

    Memory: 16 bytes a run (the permutation and where each run ends), not 8 bytes a sample.
    """
    empty = np.zeros(0, dtype=np.int64)
    if n == 0 or per == 0:
        return empty, empty, empty
    runs = -(-n // run)
    if shuffle:
        rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(seed) >> 32, int(epoch), _CHUNK_TAG])
        picked = rng.permutation(runs)  # the same draw as chunk_order's
    else:
        picked = np.arange(runs, dtype=np.int64)
    ends = np.arange(1, runs + 1, dtype=np.int64) * run  # where each landed run ends in the order
    ends[int(np.flatnonzero(picked == runs - 1)[0]) :] -= runs * run - n  # the last run is short
    srcs, lengths, dsts = [], [], []
    first, last = rank * per, (rank + 1) * per  # past n: repeats from the start (padding)
    for lap in range(first // n, (last - 1) // n + 1):
        lo, hi = max(first, lap * n) - lap * n, min(last, (lap + 1) * n) - lap * n
        k0 = int(np.searchsorted(ends, lo, side="right"))
        k1 = min(runs, int(np.searchsorted(ends, hi, side="left")) + 1)
        end, mine = ends[k0:k1], picked[k0:k1].astype(np.int64)
        begin = end - np.where(mine == runs - 1, n - (runs - 1) * run, run)
        s, e = np.maximum(begin, lo), np.minimum(end, hi)
        srcs.append(mine * run + (s - begin))
        lengths.append(e - s)
        dsts.append(s - lo + (max(first, lap * n) - first))
    return np.concatenate(srcs), np.concatenate(lengths), np.concatenate(dsts)


@dataclass(frozen=True)
class Layout:
    """One generation of an epoch's layout: ``order`` (the positions still to be read, in reading
    order) over ``world`` ranks of ``workers`` workers, cut into batches of ``batch_size``."""

    order: Ints
    world: int
    workers: int
    batch_size: int
    window: int
    drop_last: bool
    seed: int
    epoch: int
    generation: int = 0  # bumped by each resume within an epoch
    # >= 0: the layout of this rank only, whose selection holds its share in reading order
    # (order is then empty and ``total`` is the epoch's sample count): see rank_plan
    only_rank: int = -1
    total: int = 0

    @property
    def samples(self) -> int:
        """Samples left to read this generation, over all ranks."""
        return self.total if self.only_rank >= 0 else int(self.order.size)

    def __post_init__(self) -> None:
        for name in ("world", "workers", "batch_size", "window"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be 1 or more, not {getattr(self, name)}")

    def share(self) -> int:
        """Samples every rank reads: equal for all ranks (the rest dropped or padded by repeats)."""
        n, world = self.samples, self.world
        if n == 0:
            return 0
        if self.drop_last and n >= world:
            return n // world
        return -(-n // world)

    def rank_positions(self, rank: int) -> Ints:
        """A rank's share of the positions, in order."""
        self._check_rank(rank)
        per = self.share()
        if self.only_rank >= 0:
            return np.arange(per, dtype=np.int64)  # the selection holds the share in reading order
        if per == 0:
            return self.order[:0]
        return self._rank_slice(rank, 0, per)

    def _check_rank(self, rank: int) -> None:
        """InputError for a rank outside the world, or whose share this plan does not hold."""
        if not 0 <= rank < self.world:
            raise InputError(f"rank {rank} is not in a world of size {self.world}")
        if self.only_rank >= 0 and rank != self.only_rank:
            raise InputError(f"this epoch plan holds rank {self.only_rank}'s share only, not rank {rank}'s")

    def _rank_slice(self, rank: int, start: int, end: int) -> Ints:
        """A new array of ``rank_positions(rank)[start:end]``, made without the rest of the rank's
        share: each worker needs its own span only (at 10^8 a rank's share is ~100 MB)."""
        size, first = int(self.order.size), rank * self.share()
        if end <= start or size == 0:
            return self.order[:0].copy()
        if first + end <= size:
            return self.order[first + start : first + end].copy()
        at = np.arange(first + start, first + end) % size  # past the end: repeats (padding)
        picked: Ints = self.order[at]
        return picked

    def batches(self) -> int:
        """Batches every rank yields."""
        per = self.share()
        return per // self.batch_size if self.drop_last else -(-per // self.batch_size)

    def worker_span(self, worker: int) -> tuple[int, int]:
        """[start, end) of a worker's contiguous piece of its rank's positions: whole batches."""
        k, w = self.batches(), self.workers
        first, last = worker * k // w, (worker + 1) * k // w
        return first * self.batch_size, min(last * self.batch_size, self.share())

    def worker_batches(self, worker: int) -> int:
        k, w = self.batches(), self.workers
        return (worker + 1) * k // w - worker * k // w

    def stream(self, rank: int, worker: int) -> Ints:
        """The positions a worker emits, in order: its span, permuted within shuffle windows."""
        start, end = self.worker_span(worker)
        self._check_rank(rank)
        # a rank's own plan holds its share in reading order (0..share-1); either way a new array,
        # permuted in place below
        span = np.arange(start, end, dtype=np.int64) if self.only_rank >= 0 else self._rank_slice(rank, start, end)
        if self.window <= 1 or span.size <= 1:
            return span
        rng = np.random.default_rng([int(self.seed) & 0xFFFFFFFF, int(self.seed) >> 32, int(self.epoch),
                                     self.generation, rank, worker, _WINDOW_TAG])  # fmt: skip
        out = span
        for at in range(0, span.size, self.window):
            piece = out[at : at + self.window]
            out[at : at + self.window] = piece[rng.permutation(piece.size)]
        return out

    def consumed(self, offsets: list[int]) -> Ints:
        """Positions every rank has emitted when each of its workers emitted ``offsets[w]``
        samples (ranks step in lockstep, as in data-parallel training)."""
        if self.only_rank >= 0:
            raise InputError("a rank's own plan cannot say what the other ranks read; resume plans the whole epoch")
        if len(offsets) != self.workers:
            raise InputError(f"resume state has {len(offsets)} worker offsets for {self.workers} workers")
        taken = [self.stream(r, w)[: max(0, int(o))] for r in range(self.world) for w, o in enumerate(offsets)]
        return np.unique(np.concatenate(taken)) if taken else self.order[:0]

    def resumed(self, offsets: list[int], world: int, workers: int, batch_size: int) -> Layout:
        """The layout of what is left after ``offsets``, over a (maybe different) world."""
        done = self.consumed(offsets)
        left = self.order[~np.isin(self.order, done)]
        _, first = np.unique(left, return_index=True)  # padding repeats: each sample once
        left = left[np.sort(first)]
        return Layout(order=left, world=world, workers=workers, batch_size=batch_size, window=self.window,
                      drop_last=self.drop_last, seed=self.seed, epoch=self.epoch,
                      generation=self.generation + 1)  # fmt: skip
