"""hash_pairs with wide bands and radii (multi-index hashing for many hashes) finds exactly the
brute force's pairs, each once, under every layout, chunk size and block size; and for many
spread-out hashes it chooses a layout whose candidates grow slower than n^2 / 256 per band."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from dlindex.quality import pairs
from dlindex.quality.pairs import band_plan, brute_force_hash_pairs, hash_pairs

Found = dict[tuple[int, int], float]


def collect(chunks: object) -> Found:
    found: Found = {}
    for i, j, distance in chunks:  # type: ignore[attr-defined]
        assert (i < j).all()
        for a, b, d in zip(i.tolist(), j.tolist(), distance.tolist(), strict=True):
            assert (a, b) not in found, f"pair {(a, b)} reported twice"
            found[(a, b)] = d
    return found


def layouts(k: int) -> list[list[tuple[int, int, int]]]:
    """Every layout band_plan may choose at ``k``: m bands, radii summing to k - m + 1."""
    found = []
    for m in range(2, k + 2):
        extra = k - m + 1
        cuts = sorted(pairs._cuts(m), key=lambda c: -c[1])
        plan = sorted((s, w, extra // m + (b < extra % m)) for b, (s, w) in enumerate(cuts))
        if all(w <= pairs._WIDEST or not r for _, w, r in plan):
            found.append(plan)
    return found


def clustered(rng: np.random.Generator, n: int) -> npt.NDArray[np.uint64]:
    """A few seeds with bits flipped (near and identical hashes, full and empty buckets)."""
    seeds = rng.integers(0, 2**64, int(rng.integers(1, 6)), dtype=np.uint64)
    h = seeds[rng.integers(0, seeds.size, n)]
    for _ in range(int(rng.integers(0, 8))):
        h = h ^ ((rng.random(n) < 0.4).astype(np.uint64) << rng.integers(0, 64, n).astype(np.uint64))
    return h


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("chunk", "rows", "part"), [(1 << 21, 1 << 18, 1 << 20), (64, 16, 1 << 20), (64, 16, 9)])
def test_every_layout_equals_the_brute_force(
    seed: int, chunk: int, rows: int, part: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also with the bands cut into partitions on disk (part: hashes a partition, ~2-5 top bits here)."""
    rng = np.random.default_rng(seed)
    h = clustered(rng, int(rng.integers(0, 250)))
    k = int(rng.integers(2, 9))  # radii up to 2-3 bits: larger ones take thousands of flips a band
    monkeypatch.setattr(pairs, "CHUNK_PAIRS", chunk)
    monkeypatch.setattr(pairs, "_ROWS", rows)
    monkeypatch.setattr(pairs, "PART_HASHES", part)
    expected = collect(brute_force_hash_pairs(h, k))
    for plan in layouts(k):
        monkeypatch.setattr(pairs, "band_plan", lambda hashes, limit, plan=plan: plan)
        assert collect(hash_pairs(h, k)) == expected, plan


def test_a_large_bucket_is_cut_into_bounded_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hundreds of hashes sharing a band value (low-information hashes) and their 1-bit
    neighbours: every chunk stays within 2 * CHUNK_PAIRS candidates, the pairs are exact."""
    rng = np.random.default_rng(7)
    base = np.uint64(0x0F0F_00FF_3C3C_5A5A)
    h = base ^ (rng.integers(0, 2**20, 600, dtype=np.uint64) << np.uint64(44))  # band 0 equal, the top varies
    h[:200] ^= np.uint64(1)  # the next bucket: one bit off in the low band
    monkeypatch.setattr(pairs, "CHUNK_PAIRS", 64)
    monkeypatch.setattr(pairs, "band_plan", lambda hashes, limit: [(0, 21, 2), (21, 22, 2), (43, 21, 2)])
    sizes: list[int] = []
    checked = pairs._checked

    def counting(*args: Any) -> Any:
        sizes.append(int(np.size(args[-1])))
        return checked(*args)

    monkeypatch.setattr(pairs, "_checked", counting)
    assert collect(hash_pairs(h, 6)) == collect(brute_force_hash_pairs(h, 6))
    assert max(sizes) <= 2 * 64


def test_many_spread_hashes_get_wide_bands() -> None:
    """The K + 1 exact bands pair ~n^2 / 256 per band at K = 8 (quadratic: 3.5e10 candidates
    at 10^6); with 10^5 spread-out hashes band_plan must pick wider bands with radii."""
    h = np.random.default_rng(0).integers(0, 2**64, 100_000, dtype=np.uint64)
    plan = band_plan(h, 8)
    assert len(plan) < 9 and any(r > 0 for _, _, r in plan)
    assert sum(r + 1 for _, _, r in plan) == 9  # any pair within 8 bits is a candidate somewhere
    small = band_plan(h[:1000], 8)
    assert small == [(s, w, 0) for s, w in pairs._cuts(9)]  # few hashes: today's exact bands


def test_a_catalog_sized_search_equals_the_exact_bands() -> None:
    """20,000 hashes with planted near copies: the chosen wide layout gives the same pairs as
    the K + 1 exact bands (the layout used before)."""
    rng = np.random.default_rng(3)
    h = rng.integers(0, 2**64, 30_000, dtype=np.uint64)
    src = rng.integers(0, h.size, 3000)
    flips = np.zeros(src.size, dtype=np.uint64)
    for _ in range(4):
        flips ^= np.uint64(1) << rng.integers(0, 64, src.size).astype(np.uint64)
    h[rng.integers(0, h.size, src.size)] = h[src] ^ flips
    plan = band_plan(h, 8)
    assert any(r for _, _, r in plan)
    got = collect(hash_pairs(h, 8))
    exact = [(s, w, 0) for s, w in pairs._cuts(9)]
    before = pairs.band_plan
    try:
        pairs.band_plan = lambda hashes, limit: exact  # type: ignore[assignment]
        assert got == collect(hash_pairs(h, 8))
    finally:
        pairs.band_plan = before


def test_many_hashes_are_searched_a_partition_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bands of more than PART_HASHES hashes are cut by their top bits into partitions in a
    temporary file: the search's peak is a few partitions, not ~30 bytes for every hash and its
    bucket table (before: 2.9 MB here, ~60 bytes a hash), and the pairs are the in-memory search's."""
    import tracemalloc

    rng = np.random.default_rng(11)
    n = 50_000
    h = rng.integers(0, 2**64, n, dtype=np.uint64)
    near = rng.integers(0, n, 1000)
    h[rng.integers(0, n, 1000)] = h[near] ^ (np.uint64(1) << rng.integers(0, 64, 1000).astype(np.uint64))
    h[:50] = h[50]  # identical hashes
    monkeypatch.setattr(pairs, "band_plan", lambda hashes, limit: [(0, 16, 1), (16, 16, 0), (32, 16, 0), (48, 16, 0)])
    whole = collect(hash_pairs(h, 4))
    monkeypatch.setattr(pairs, "PART_HASHES", 1 << 12)  # 16 partitions a band
    tracemalloc.start()
    try:
        count = sum(i.size for i, _, _ in hash_pairs(h, 4))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == len(whole) and collect(hash_pairs(h, 4)) == whole and len(whole) > 1000
    assert peak < 16 * n, peak  # ~0.6 MB


def test_a_full_disk_while_partitions_are_written_is_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import tempfile

    from dlindex.errors import DiskFullError

    class Full:
        def __init__(self) -> None:
            self.closed = False

        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self) -> None:
            self.closed = True

    files: list[Full] = []
    monkeypatch.setattr(tempfile, "TemporaryFile", lambda **kw: files.append(Full()) or files[-1])
    monkeypatch.setattr(pairs, "PART_HASHES", 64)
    h = np.random.default_rng(2).integers(0, 2**64, 1000, dtype=np.uint64)
    with pytest.raises(DiskFullError) as raised:
        list(hash_pairs(h, 4))
    assert "\n" not in str(raised.value) and "disk full" in str(raised.value)
    assert files and all(f.closed for f in files)
