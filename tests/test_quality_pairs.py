"""hash_pairs and embedding_pairs find exactly the pairs a brute force finds, each once, i < j."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlindex import InputError
from dlindex.features.neighbours import exact_distances
from dlindex.quality import pairs
from dlindex.quality.hashes import pack_bits
from dlindex.quality.pairs import brute_force_hash_pairs, embedding_pairs, hash_pairs, popcount

Found = dict[tuple[int, int], float]


def collect(chunks: object) -> Found:
    """The pairs of a chunk iterator; fails on a repeated pair or i >= j."""
    found: Found = {}
    for i, j, distance in chunks:  # type: ignore[attr-defined]
        assert i.shape == j.shape == distance.shape and distance.dtype == np.float32
        assert (i < j).all()
        for a, b, d in zip(i.tolist(), j.tolist(), distance.tolist(), strict=True):
            assert (a, b) not in found, f"pair {(a, b)} reported twice"
            found[(a, b)] = d
    return found


def reference_hash_pairs(hashes: np.ndarray, k: int) -> Found:
    """Python ints, pair by pair: what brute_force_hash_pairs must equal too."""
    values = [int(h) for h in hashes]
    return {
        (a, b): float(bin(values[a] ^ values[b]).count("1"))
        for a in range(len(values))
        for b in range(a + 1, len(values))
        if bin(values[a] ^ values[b]).count("1") <= k
    }


@st.composite
def clustered_hashes(draw: st.DrawFn) -> np.ndarray:
    """Random 64-bit hashes, or a few seeds with a few bits flipped in each copy."""
    n = draw(st.integers(0, 300))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        return rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
    seeds = rng.integers(0, 2**64, draw(st.integers(1, 5)), dtype=np.uint64, endpoint=False)
    hashes = seeds[rng.integers(0, seeds.size, n)]
    for _ in range(draw(st.integers(0, 6))):
        flip = (rng.random(n) < 0.4).astype(np.uint64) << rng.integers(0, 64, n).astype(np.uint64)
        hashes = hashes ^ flip
    return hashes


@settings(max_examples=150, deadline=None)
@given(clustered_hashes(), st.integers(0, 8))
def test_hash_pairs_equal_the_brute_force(hashes: np.ndarray, k: int) -> None:
    expected = collect(brute_force_hash_pairs(hashes, k))
    assert collect(hash_pairs(hashes, k)) == expected


@settings(max_examples=30, deadline=None)
@given(clustered_hashes(), st.integers(0, 64))
def test_brute_force_equals_a_pair_by_pair_count(hashes: np.ndarray, k: int) -> None:
    assert collect(brute_force_hash_pairs(hashes[:60], k)) == reference_hash_pairs(hashes[:60], k)


@pytest.mark.parametrize("k", [0, 1, 8, 15, 16, 63, 64])
def test_edge_cases(k: int) -> None:
    assert collect(hash_pairs(np.zeros(0, dtype=np.uint64), k)) == {}
    assert collect(hash_pairs(np.array([5], dtype=np.uint64), k)) == {}
    same = np.full(40, 0xDEADBEEF, dtype=np.uint64)
    assert collect(hash_pairs(same, k)) == {(a, b): 0.0 for a in range(40) for b in range(a + 1, 40)}
    opposite = np.array([0, 2**64 - 1, 0], dtype=np.uint64)  # 64 bits apart: pairs only when k >= 64
    expected = {(0, 2): 0.0, **({(0, 1): 64.0, (1, 2): 64.0} if k >= 64 else {})}
    assert collect(hash_pairs(opposite, k)) == expected


def test_long_runs_come_in_bounded_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pairs, "CHUNK_PAIRS", 7)
    hashes = np.repeat(np.array([0, 2**32 - 1, 2**64 - 1], dtype=np.uint64), 30)  # 32+ bits apart
    chunks = list(hash_pairs(hashes, 2))
    assert max(len(i) for i, _, _ in chunks) <= 7
    assert collect(iter(chunks)) == collect(brute_force_hash_pairs(hashes, 2))
    assert len(collect(iter(chunks))) == 3 * 30 * 29 // 2


@pytest.mark.parametrize("bad", [-1, 65, 1.5, True, "3"])
def test_a_bad_max_distance_is_an_input_error(bad: object) -> None:
    with pytest.raises(InputError, match="whole number of bits"):
        list(hash_pairs(np.zeros(3, dtype=np.uint64), bad))  # type: ignore[arg-type]


def test_popcount_and_bit_packing() -> None:
    values = np.array([0, 1, 2**64 - 1, 0b1011 << 60], dtype=np.uint64)
    assert popcount(values).tolist() == [0, 1, 64, 3]
    bits = np.zeros((2, 64), dtype=np.float32)
    bits[0, 0] = bits[1, 63] = bits[1, 1] = 1
    assert pack_bits(bits).tolist() == [1, 2**63 + 2]


def reference_embedding_pairs(vectors: np.ndarray, threshold: float) -> Found:
    found: Found = {}
    for a in range(len(vectors)):
        d = exact_distances(vectors, vectors[a], "cosine")
        found.update({(a, b): float(np.float32(d[b])) for b in range(a + 1, len(vectors)) if d[b] <= threshold})
    return found


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 120),
    st.integers(1, 12),
    st.floats(0, 2),
    st.integers(1, 50),
    st.integers(0, 2**32 - 1),
)
def test_embedding_pairs_equal_a_brute_force(n: int, dim: int, threshold: float, tile_rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    vectors = rng.integers(-2, 3, (n, dim)).astype(np.float32)  # ties, zero vectors, exact copies
    if n:
        vectors[::5] = vectors[0] * 3
    found = collect(embedding_pairs(vectors, threshold, tile_rows=tile_rows))
    assert found == reference_embedding_pairs(vectors, threshold)
    assert not any(np.isnan(d) for d in found.values())


@pytest.mark.parametrize("n", [1, 6, 7, 8, 13, 14, 15])
@pytest.mark.parametrize("tile_rows", [1, 7])
def test_tiles_at_the_edges_miss_no_pair(n: int, tile_rows: int) -> None:
    """n rows, every one a copy: each pair is found once, whether it is in a diagonal tile,
    a full tile or the short last row or column of tiles."""
    vectors = np.tile(np.array([[1.0, 2.0, 3.0]], dtype=np.float32), (n, 1))
    found = collect(embedding_pairs(vectors, 0.0, tile_rows=tile_rows))
    assert set(found) == {(a, b) for a in range(n) for b in range(a + 1, n)}


def test_tiles_at_the_edges_equal_a_brute_force() -> None:
    rng = np.random.default_rng(5)
    vectors = rng.normal(size=(37, 4)).astype(np.float32)
    vectors[rng.integers(0, 37, 12)] = vectors[3]  # copies land in every tile
    vectors[[0, 36]] = 0.0  # zero rows in the first and last tile
    expected = reference_embedding_pairs(vectors, 0.3)
    for tile_rows in (1, 5, 18, 36, 37, 2048):
        assert collect(embedding_pairs(vectors, 0.3, tile_rows=tile_rows)) == expected
    assert collect(embedding_pairs(vectors, 1.0, tile_rows=5)) == reference_embedding_pairs(vectors, 1.0)


def test_zero_vectors_are_at_distance_one() -> None:
    vectors = np.array([[0, 0], [0, 0], [1, 0], [2, 0]], dtype=np.float32)
    assert collect(embedding_pairs(vectors, 0.5)) == {(2, 3): 0.0}
    assert collect(embedding_pairs(vectors, 1.0))[(0, 1)] == 1.0


@pytest.mark.parametrize("bad", [-0.1, 2.5, float("nan")])
def test_a_bad_threshold_is_an_input_error(bad: float) -> None:
    with pytest.raises(InputError, match="cosine distance from 0 to 2"):
        list(embedding_pairs(np.ones((2, 2), dtype=np.float32), bad))


@pytest.mark.parametrize("k", [10, 15, 16, 32])
def test_wide_k_comes_in_bounded_chunks(monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    """Narrow bands (or the brute force beyond 16 bands) still yield at most CHUNK_PAIRS pairs at once."""
    monkeypatch.setattr(pairs, "CHUNK_PAIRS", 7)
    rng = np.random.default_rng(k)
    hashes = rng.integers(0, 2**64, 60, dtype=np.uint64, endpoint=False)
    hashes[::3] = hashes[0]
    chunks = list(hash_pairs(hashes, k))
    assert max(len(i) for i, _, _ in chunks) <= 7
    assert collect(iter(chunks)) == reference_hash_pairs(hashes, k)
