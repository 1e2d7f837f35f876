"""Pairs of near-duplicate vectors: 64-bit hashes within K bits, embeddings within a cosine distance.

``hash_pairs`` is exact multi-index hashing: split the 64 bits into K + 1 bands; two hashes
at most K bits apart differ in at most K bands, so they agree on at least one (pigeonhole).
Per band, the hashes are sorted by the band's value and each run of equal values is walked
by offset (position p with p + 1, then p + 2, ...), so the work is the candidate count, not
n squared. A pair is reported only in the first band where it agrees, so no set of seen
pairs is kept, and pairs come in chunks of bounded size.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from dlindex.errors import InputError
from dlindex.quality.hashes import HASH_BITS

Positions = npt.NDArray[np.intp]
PairChunk = tuple[Positions, Positions, npt.NDArray[np.float32]]  # (i, j, distance), i < j

CHUNK_PAIRS = 1 << 21  # candidate pairs held at once, at most (each costs ~40 bytes while checked)
TILE_ROWS = 2048  # embedding_pairs compares 2048 x 2048 rows at once: a 16 MiB float32 tile
# With more bands than this, bands are under 4 bits wide and almost every pair is a candidate
# in several bands: comparing every pair once is cheaper.
_MOST_BANDS = 16
_U32 = 2.0**-24  # float32 unit roundoff
_BYTE_BITS = np.array([bin(b).count("1") for b in range(256)], dtype=np.uint8)


def popcount(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint8]:
    """Set bits of each uint64."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2
        counted: npt.NDArray[np.uint8] = np.bitwise_count(x)
        return counted
    as_bytes = np.ascontiguousarray(x).view(np.uint8).reshape(-1, 8)
    summed: npt.NDArray[np.uint8] = _BYTE_BITS[as_bytes].sum(axis=1, dtype=np.uint8)
    return summed


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
    bands = _bands(k + 1)
    for band, (shift, mask) in enumerate(bands):
        values = (h >> np.uint64(shift)) & np.uint64(mask)
        order = np.argsort(values, kind="stable")
        for p, q in equal_runs(values[order]):
            i, j = order[p], order[q]
            x = h[i] ^ h[j]
            keep = popcount(x) <= k
            for earlier_shift, earlier_mask in bands[:band]:  # reported in an earlier band already
                keep &= ((x >> np.uint64(earlier_shift)) & np.uint64(earlier_mask)) != 0
            if keep.any():
                yield _ordered(i[keep], j[keep], popcount(x[keep]).astype(np.float32))


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
