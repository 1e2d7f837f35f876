"""Pairs of near-duplicate vectors: 64-bit hashes within K bits, embeddings within a cosine distance.

``hash_pairs`` is exact multi-index hashing. The 64 bits are cut into m bands, band b with a
radius r_b, the radii summing to K - m + 1: two hashes at most K bits apart differ in at most
r_b bits of some band b (else they would differ in at least K + 1), so they are candidates in
that band. With m = K + 1 every radius is 0: the hashes agreeing on a band, found by sorting on
the band's value and walking each run of equal values by offset. Bands that wide (7 bits at
K = 8) pair about n^2 / 256 hashes each, quadratic; so for many hashes fewer, wider bands
(3 of 21-22 bits, radius 2 at K = 8) are used: the hashes are sorted into the band's buckets,
and each occupied bucket v is paired with the buckets v ^ f for every f of at most r_b bits,
where only the real candidates are ever formed. The layout is chosen per call by the cost it
is expected to have on a sample of the hashes, not on the assumption that bits are uniform.
A pair is reported only in the first band where it is a candidate, so no set of seen pairs
is kept, and pairs come in chunks of bounded size.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from dlindex.errors import InputError
from dlindex.quality.band_parts import Partitions, Sorted, partition_bits, sorted_partition
from dlindex.quality.hashes import HASH_BITS, popcount

Positions = npt.NDArray[np.intp]
PairChunk = tuple[Positions, Positions, npt.NDArray[np.float32]]  # (i, j, distance), i < j
Band = tuple[int, int, int]  # (shift, width, radius): bits shift .. shift + width - 1, within radius

CHUNK_PAIRS = 1 << 21  # candidate pairs held at once, at most (each costs ~40 bytes while checked)
TILE_ROWS = 2048  # embedding_pairs compares 2048 x 2048 rows at once: a 16 MiB float32 tile
# With more bands than this, bands are under 4 bits wide and almost every pair is a candidate
# in several bands: comparing every pair once is cheaper.
_MOST_BANDS = 16
# Bands with a radius are bucketed by their value (a table of 2^width counts): at most 22 bits.
_WIDEST = 22
_SMALL = 20_000  # fewer hashes than this: the K + 1 exact bands, no estimate
_SAMPLE = 2048  # hashes whose pairs estimate each layout's candidates (2M pairs)
_ROWS = 1 << 18  # hashes of the source buckets paired at once
PART_HASHES = 1 << 20  # more hashes: a band is searched by partitions on disk (band_parts.py)
# Estimated seconds a candidate pair, a bit of an occupancy set per flip and a sorted hash cost (measured)
_PAIR_COST, _PROBE_COST, _SORT_COST = 1.5e-8, 4e-9, 1.5e-7
# Per bit b < 6 of a 64-bit word: the bits whose position has bit b clear (0x5555..., 0x3333...)
_LOW_HALF = [sum(1 << v for v in range(64) if not v >> b & 1) for b in range(6)]
_U32 = 2.0**-24  # float32 unit roundoff


def check_max_distance(max_distance: int) -> int:
    whole = isinstance(max_distance, int | np.integer) and not isinstance(max_distance, bool)
    if not whole or not 0 <= max_distance <= HASH_BITS:
        raise InputError(f"max distance must be a whole number of bits from 0 to {HASH_BITS}, not {max_distance!r}")
    return int(max_distance)


def check_threshold(threshold: float) -> float:
    value = float(threshold)
    if not (0.0 <= value <= 2.0):  # also rejects NaN
        raise InputError(f"threshold must be a cosine distance from 0 to 2, not {threshold!r}")
    return value


def hash_pairs(hashes: npt.ArrayLike, max_distance: int) -> Iterator[PairChunk]:
    """Every pair of positions (i < j) whose hashes differ in at most ``max_distance`` bits, exactly."""
    k = check_max_distance(max_distance)
    h = np.ascontiguousarray(hashes, dtype=np.uint64).reshape(-1)
    if k + 1 > _MOST_BANDS:
        yield from brute_force_hash_pairs(h, k)
        return
    plan = band_plan(h, k)
    parts = partition_bits(h.size, PART_HASHES)
    for band, (shift, width, radius) in enumerate(plan):
        if parts and width > 1:  # many hashes: the band's candidates come from partitions on disk
            yield from _partitioned(h, k, plan[:band], (shift, width, radius), min(parts, width - 1))
            continue
        values = (h >> np.uint64(shift)) & np.uint64((1 << width) - 1)
        if width <= 32:
            values = values.astype(np.uint32)
        order = np.argsort(values, kind="stable")
        if h.size < 2**31:
            order = order.astype(np.int32)
        values, sorted_h = values[order], h[order]  # candidates read neighbouring hashes, not scattered ones
        yield from band_pairs(sorted_h, order, k, plan[:band], values, width, radius)
        del values, order, sorted_h


def _partitioned(h: npt.NDArray[np.uint64], k: int, earlier: list[Band], band: Band, parts: int) -> Iterator[PairChunk]:
    """One band's pairs, a partition of its top ``parts`` bits (and a pair of them) at a time (band_parts.py)."""
    shift, width, radius = band
    low = width - parts
    with Partitions(h, shift + low, parts, PART_HASHES) as store:
        for p in range(1 << parts):
            here = sorted_partition(store.read(p), shift, low)
            yield from band_pairs(*here[:2], k, earlier, here[2], low, radius)
            for g in _flips(parts, radius):
                if not p >> (g.bit_length() - 1) & 1:  # each pair of partitions once, from p with g's top bit clear
                    there = sorted_partition(store.read(p ^ g), shift, low)
                    yield from _between(here, there, k, earlier, low, radius - g.bit_count())


def _between(here: Sorted, there: Sorted, k: int, earlier: list[Band], low: int, radius: int) -> Iterator[PairChunk]:
    """The candidates between two partitions: low band bits equal or 1 to ``radius`` bits apart."""
    if not (here[0].size and there[0].size):
        return
    sorted_h, order = np.concatenate((here[0], there[0])), np.concatenate((here[1], there[1]))
    counts, starts, occupied = buckets(here[2], low)
    other_counts, other_starts, other_occupied = buckets(there[2], low)
    other_starts += here[0].size  # the second partition follows the first in sorted_h
    for f in itertools.chain([0], _flips(low, radius)):
        both = occupied & moved(other_occupied, f)
        if both.any():
            yield from cross(sorted_h, order, k, earlier, (starts, counts), (other_starts, other_counts), both, f)


def band_pairs(
    sorted_h: npt.NDArray[np.uint64],
    order: Positions,
    k: int,
    earlier: list[Band],
    values: npt.NDArray[Any],
    width: int,
    radius: int,
) -> Iterator[PairChunk]:
    """The candidates of hashes sorted by their band ``values`` (``width`` bits): equal values,
    and values 1 to ``radius`` bits apart."""
    for p, q in equal_runs(values):
        yield from _checked(sorted_h, order, k, earlier, p, q)
    if radius:
        yield from _flip_pairs(sorted_h, order, k, earlier, values, width, radius)


def band_plan(hashes: npt.NDArray[np.uint64], k: int) -> list[Band]:
    """The band layout (shift, width, radius) expected to cost least for these hashes at ``k``:
    the K + 1 exact bands, or 3 to K wider bands with radii, each estimated on a sample."""
    n = hashes.size
    plans = [[(shift, width, 0) for shift, width in _cuts(k + 1)]]
    for m in range(max(2, -(-HASH_BITS // _WIDEST)), k + 1):
        extra = k - m + 1  # radii sum: any pair within k is within its radius in some band
        cuts = sorted(_cuts(m), key=lambda c: -c[1])  # the wider bands take the larger radii
        plans.append(sorted((shift, width, extra // m + (b < extra % m)) for b, (shift, width) in enumerate(cuts)))
    if n < _SMALL or len(plans) == 1:
        return plans[0]
    sample = hashes[np.linspace(0, n - 1, _SAMPLE).astype(np.intp)]
    x = (sample[:, None] ^ sample[None, :])[np.triu_indices(_SAMPLE, 1)]
    scale = n * (n - 1) / 2 / x.size
    costs = []
    for plan in plans:
        candidates = sum(int((popcount((x >> np.uint64(s)) & np.uint64((1 << w) - 1)) <= r).sum()) for s, w, r in plan)
        probes = sum((1 << w) * _ball(w, r) for _, w, r in plan if r)  # bits of the occupancy sets
        costs.append(candidates * scale * _PAIR_COST + probes * _PROBE_COST + len(plan) * n * _SORT_COST)
    return plans[int(np.argmin(costs))]


def _cuts(count: int) -> list[tuple[int, int]]:
    """(shift, width) of ``count`` bands of near-equal width covering the 64 bits."""
    edges = [round(b * HASH_BITS / count) for b in range(count + 1)]
    return [(lo, hi - lo) for lo, hi in itertools.pairwise(edges)]


def _ball(width: int, radius: int) -> int:
    """How many values are within ``radius`` bits of one value of ``width`` bits, itself left out."""
    return sum(math.comb(width, d) for d in range(1, radius + 1))


def _flips(width: int, radius: int) -> Iterator[int]:
    for d in range(1, radius + 1):
        for bits in itertools.combinations(range(width), d):
            yield sum(1 << b for b in bits)


def _flip_pairs(
    sorted_h: npt.NDArray[np.uint64],
    order: Positions,
    k: int,
    earlier: list[Band],
    values: npt.NDArray[np.uint32],
    width: int,
    radius: int,
) -> Iterator[PairChunk]:
    """The pairs whose band values differ in 1 to ``radius`` bits: bucket v with bucket v ^ f,
    each pair of buckets once (from the one whose value has f's highest bit clear). Which
    buckets are occupied is a bit set, so finding the pairs of buckets costs 2^width / 64
    word operations a flip f, however many hashes there are."""
    counts, starts, occupied = buckets(values, width)
    word = np.arange(occupied.size)
    for f in _flips(width, radius):
        top = f.bit_length() - 1
        both = occupied & moved(occupied, f)
        if top < 6:
            both &= np.uint64(_LOW_HALF[top])
        else:
            both[(word >> (top - 6)) & 1 == 1] = 0
        if both.any():
            yield from cross(sorted_h, order, k, earlier, (starts, counts), (starts, counts), both, f)


def buckets(
    values: npt.NDArray[np.uint32], width: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint64]]:
    """(hashes a bucket, where each bucket starts, which buckets are occupied as a bit set) of sorted values."""
    counts = np.bincount(values, minlength=max(64, 1 << width))
    starts = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    return counts, starts, np.packbits(counts > 0, bitorder="little").view("<u8").astype(np.uint64)


def moved(occupied: npt.NDArray[np.uint64], f: int) -> npt.NDArray[np.uint64]:
    """The bit set whose bit v is bit v ^ ``f`` of ``occupied`` (word gather, then in-word swaps)."""
    out: npt.NDArray[np.uint64] = occupied[np.arange(occupied.size) ^ (f >> 6)]
    for b in range(min(6, f.bit_length())):
        if f >> b & 1:
            shift, low = np.uint64(1 << b), np.uint64(_LOW_HALF[b])
            out = ((out >> shift) & low) | ((out & low) << shift)
    return out


def cross(
    sorted_h: npt.NDArray[np.uint64],
    order: Positions,
    k: int,
    earlier: list[Band],
    sources: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
    targets: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
    both: npt.NDArray[np.uint64],
    f: int,
) -> Iterator[PairChunk]:
    """Every source bucket v set in ``both`` with target bucket v ^ ``f``, ~_ROWS source hashes at once;
    ``sources`` and ``targets`` are (starts, counts) of the buckets in ``sorted_h``."""
    starts, counts = sources
    source = np.flatnonzero(np.unpackbits(both.view(np.uint8), bitorder="little"))
    cut = np.searchsorted(starts[source + 1], np.arange(_ROWS, int(starts[-1]), _ROWS))
    for part in np.split(source, np.unique(cut)):
        if part.size:
            yield from _cross(sorted_h, order, k, earlier, starts, counts, part, part ^ f, targets)


def _cross(
    sorted_h: npt.NDArray[np.uint64],
    order: Positions,
    k: int,
    earlier: list[Band],
    starts: npt.NDArray[np.int64],
    counts: npt.NDArray[np.int64],
    source: npt.NDArray[np.int64],
    target: npt.NDArray[np.int64],
    targets: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
) -> Iterator[PairChunk]:
    """Every hash of each source bucket with every hash of its target bucket, checked. The
    bucket pairs are taken by the target's size b, so each source hash meets its b targets as
    one row of a (rows, b) array: no pair is spelled out unless it is within the limit."""
    target_starts, target_counts = targets
    size = target_counts[target]
    if size.max() < 1 << 16:
        size = size.astype(np.uint16)  # sorted by radix
    by_size = np.argsort(size, kind="stable")
    size = size[by_size]
    edges = np.flatnonzero(np.diff(size)) + 1
    for part in np.split(np.arange(size.size), edges):
        b = int(size[part[0]])
        pick = by_size[part]
        a, s0, t0 = counts[source[pick]], starts[source[pick]], target_starts[target[pick]]
        rank = np.arange(int(a.sum())) - np.repeat(np.cumsum(a) - a, a)
        p, t = np.repeat(s0, a) + rank, np.repeat(t0, a)  # a row per source hash; its targets from t
        step = max(1, CHUNK_PAIRS // b)
        for r in range(0, p.size, step):
            for c in range(0, b, CHUNK_PAIRS):
                columns = np.arange(c, min(b, c + CHUNK_PAIRS))
                q = t[r : r + step, None] + columns[None, :]
                yield from _checked(sorted_h, order, k, earlier, np.broadcast_to(p[r : r + step, None], q.shape), q)


def _checked(
    sorted_h: npt.NDArray[np.uint64], order: Positions, k: int, earlier: list[Band], p: Positions, q: Positions
) -> Iterator[PairChunk]:
    """The candidates (p, q) (positions in band order, arrays of one shape) within ``k`` bits
    that no earlier band had as candidates, as positions (i, j) of the hashes."""
    x = sorted_h[p] ^ sorted_h[q]
    distance = popcount(x)
    keep = distance <= k
    for shift, width, radius in earlier:  # reported in an earlier band already
        keep &= popcount((x >> np.uint64(shift)) & np.uint64((1 << width) - 1)) > radius
    if keep.any():
        i, j = order[p[keep]].astype(np.intp), order[q[keep]].astype(np.intp)
        yield _ordered(i, j, distance[keep].astype(np.float32))


def brute_force_hash_pairs(hashes: npt.ArrayLike, max_distance: int) -> Iterator[PairChunk]:
    """The same pairs as ``hash_pairs`` by comparing every pair (the reference; O(n^2))."""
    k = check_max_distance(max_distance)
    h = np.ascontiguousarray(hashes, dtype=np.uint64).reshape(-1)
    n = h.size
    rows = max(1, CHUNK_PAIRS // max(n, 1))
    for start in range(0, n, rows):
        block = h[start : start + rows]
        distance = popcount(block[:, None] ^ h[None, :])
        i, j = np.nonzero(distance <= k)
        i = i + start
        later = j > i
        i, j = i[later].astype(np.intp), j[later].astype(np.intp)
        for at in range(0, i.size, CHUNK_PAIRS):  # one row holds up to n pairs when n > CHUNK_PAIRS
            ci, cj = i[at : at + CHUNK_PAIRS], j[at : at + CHUNK_PAIRS]
            yield ci, cj, distance[ci - start, cj].astype(np.float32)


def embedding_pairs(vectors: npt.ArrayLike, threshold: float, *, tile_rows: int = TILE_ROWS) -> Iterator[PairChunk]:
    """Every pair of rows (i < j) with cosine distance (1 - cosine) at most ``threshold``, exactly.

    The normalised rows are compared tile by tile (``tile_rows`` x ``tile_rows`` float32
    products, upper triangle only), so memory is bounded whatever n is. The float32 product
    finds the candidates within a proven error bound; each is then scored in float64 by the
    definition ``similar`` uses (``exact_distances``): a zero vector is at distance 1 from everything.
    """
    limit = check_threshold(threshold)
    v = np.asarray(vectors, dtype=np.float32)
    assert v.ndim == 2
    n, dim = v.shape
    norms = np.zeros(n)
    unit = np.zeros_like(v)
    for at in range(0, n, TILE_ROWS):  # float64 a tile of rows at a time
        wide = v[at : at + TILE_ROWS].astype(np.float64)
        norms[at : at + TILE_ROWS] = np.sqrt((wide * wide).sum(axis=1))  # as exact_distances computes them
        with np.errstate(divide="ignore", invalid="ignore"):
            scaled = wide / norms[at : at + TILE_ROWS, None]
        unit[at : at + TILE_ROWS] = np.where(norms[at : at + TILE_ROWS, None] > 0, scaled, 0.0)
    # |float32 dot of rounded unit rows - exact cosine| <= (dim + 2) u, for any summation order
    least_cosine = 1.0 - limit - 4.0 * (dim + 8) * _U32
    rows = max(1, tile_rows)
    for q0 in range(0, n, rows):
        q1 = min(n, q0 + rows)
        for d0 in range(q0, n, rows):
            d1 = min(n, d0 + rows)
            cosine = unit[q0:q1] @ unit[d0:d1].T
            bi, bj = np.nonzero(cosine >= least_cosine)  # a zero row's cosine is 0: distance 1, as defined
            i, j = bi + q0, bj + d0
            keep = j > i  # the diagonal tiles: upper triangle only
            yield from _scored(v, norms, i[keep], j[keep], limit)


def _scored(
    v: npt.NDArray[np.float32], norms: npt.NDArray[np.float64], i: Positions, j: Positions, limit: float
) -> Iterator[PairChunk]:
    """The candidate pairs (i, j) within ``limit`` by the float64 cosine distance, in bounded chunks."""
    step = max(1, CHUNK_PAIRS // max(1, v.shape[1]))
    for at in range(0, i.size, step):
        ci, cj = i[at : at + step].astype(np.intp), j[at : at + step].astype(np.intp)
        dots = (v[cj].astype(np.float64) * v[ci].astype(np.float64)).sum(
            axis=1
        )  # exact_distances' expression, bit for bit
        scale = norms[ci] * norms[cj]
        with np.errstate(divide="ignore", invalid="ignore"):
            distance = np.where(scale > 0, np.clip(1.0 - dots / scale, 0.0, 2.0), 1.0)
        close = distance <= limit
        if close.any():
            yield ci[close], cj[close], distance[close].astype(np.float32)


def _bands(count: int) -> list[tuple[int, int]]:
    """(shift, mask) of ``count`` bands of near-equal width covering the 64 bits."""
    edges = [round(b * HASH_BITS / count) for b in range(count + 1)]
    return [(lo, (1 << (hi - lo)) - 1) for lo, hi in itertools.pairwise(edges)]


def equal_runs(sorted_values: npt.NDArray[np.uint64]) -> Iterator[tuple[Positions, Positions]]:
    """(p, q) position arrays, p < q, of every pair within a run of equal sorted values, chunked."""
    n = sorted_values.size
    if n < 2:
        return
    starts = np.flatnonzero(np.concatenate(([True], sorted_values[1:] != sorted_values[:-1])))
    lengths = np.diff(np.append(starts, n))
    run_end = np.repeat(starts + lengths, lengths)  # per position: one past its run's end
    active = np.flatnonzero(run_end - np.arange(n) > 1)  # positions with a later equal value
    offset = 1
    while active.size:
        for at in range(0, active.size, CHUNK_PAIRS):
            p = active[at : at + CHUNK_PAIRS]
            yield p, p + offset
        offset += 1
        active = active[run_end[active] - active > offset]


def _ordered(i: Positions, j: Positions, distance: npt.NDArray[np.float32]) -> PairChunk:
    low = np.minimum(i, j)
    return low, np.maximum(i, j), distance
