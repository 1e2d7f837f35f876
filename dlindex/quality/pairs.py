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
from dlindex.features.neighbours import exact_distances
from dlindex.quality.hashes import HASH_BITS

Positions = npt.NDArray[np.intp]
PairChunk = tuple[Positions, Positions, npt.NDArray[np.float32]]  # (i, j, distance), i < j

CHUNK_PAIRS = 1 << 21  # candidate pairs held at once, at most (each costs ~40 bytes while checked)
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
        for p, q in _equal_runs(values[order]):
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
        if later.any():
            yield (
                i[later].astype(np.intp),
                j[later].astype(np.intp),
                distance[i[later] - start, j[later]].astype(np.float32),
            )


def embedding_pairs(vectors: npt.ArrayLike, threshold: float, *, chunk_rows: int = 1024) -> Iterator[PairChunk]:
    """Every pair of rows (i < j) with cosine distance (1 - cosine) at most ``threshold``, exactly.

    A float32 product of the normalised rows finds the candidates within a proven error
    bound; each is then scored by ``exact_distances`` (float64), the definition ``similar``
    uses: a zero vector is at distance 1 from everything.
    """
    limit = check_threshold(threshold)
    v = np.asarray(vectors, dtype=np.float32)
    assert v.ndim == 2
    n, dim = v.shape
    norms = np.sqrt(np.einsum("ij,ij->i", v.astype(np.float64), v.astype(np.float64)))
    with np.errstate(divide="ignore", invalid="ignore"):
        unit = np.where(norms[:, None] > 0, v / norms[:, None], 0.0).astype(np.float32)
    # |float32 dot of rounded unit rows - exact cosine| <= (dim + 2) u, for any summation order
    slack = 4.0 * (dim + 8) * _U32
    rows = max(1, min(chunk_rows, CHUNK_PAIRS // max(n, 1)))
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        approx = 1.0 - unit[start:stop] @ unit.T
        approx[:, norms == 0] = 1.0
        approx[norms[start:stop] == 0, :] = 1.0
        bi, j = np.nonzero(approx <= limit + slack)
        later = j > bi + start
        bi, j = bi[later], j[later]
        if not bi.size:
            continue
        i_out, j_out, d_out = [], [], []
        bounds = np.flatnonzero(np.diff(bi)) + 1  # np.nonzero lists row by row: split at each new row
        for b, partners in zip(bi[np.concatenate(([0], bounds))].tolist(), np.split(j, bounds), strict=True):
            exact = exact_distances(v[partners], v[start + b], "cosine")
            close = exact <= limit
            i_out.append(np.full(int(close.sum()), start + b, dtype=np.intp))
            j_out.append(partners[close].astype(np.intp))
            d_out.append(exact[close].astype(np.float32))
        i_all = np.concatenate(i_out)
        if i_all.size:
            yield i_all, np.concatenate(j_out), np.concatenate(d_out)


def _bands(count: int) -> list[tuple[int, int]]:
    """(shift, mask) of ``count`` bands of near-equal width covering the 64 bits."""
    edges = [round(b * HASH_BITS / count) for b in range(count + 1)]
    return [(lo, (1 << (hi - lo)) - 1) for lo, hi in itertools.pairwise(edges)]


def _equal_runs(sorted_values: npt.NDArray[np.uint64]) -> Iterator[tuple[Positions, Positions]]:
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
