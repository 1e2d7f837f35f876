"""`dlindex.loader.layout`: equal rank shares, disjoint worker spans, exact resume over any world."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlindex.errors import InputError
from dlindex.loader.layout import Layout, chunk_order


def layout(n: int, world: int = 1, workers: int = 1, batch: int = 4, window: int = 8, drop_last: bool = False,
           seed: int = 0, epoch: int = 0) -> Layout:  # fmt: skip
    order = chunk_order(np.arange(0, n, 5), n, seed, epoch, shuffle=True)
    return Layout(order=order, world=world, workers=workers, batch_size=batch, window=window, drop_last=drop_last,
                  seed=seed, epoch=epoch)  # fmt: skip


def emitted(lay: Layout) -> list[np.ndarray]:
    return [lay.stream(r, w) for r in range(lay.world) for w in range(lay.workers)]


def test_chunk_order_keeps_chunks_whole_and_changes_per_epoch() -> None:
    a = chunk_order(np.arange(0, 20, 5), 20, seed=1, epoch=0, shuffle=True)
    b = chunk_order(np.arange(0, 20, 5), 20, seed=1, epoch=1, shuffle=True)
    assert sorted(a.tolist()) == list(range(20))
    for at in range(0, 20, 5):  # every chunk is a run of five neighbours
        assert a[at : at + 5].tolist() == list(range(a[at], a[at] + 5))
    assert any(not np.array_equal(chunk_order(np.arange(0, 20, 5), 20, 1, e, True), a) for e in range(1, 6))
    assert np.array_equal(a, chunk_order(np.arange(0, 20, 5), 20, seed=1, epoch=0, shuffle=True))
    assert b.size == 20
    assert chunk_order(np.arange(0, 20, 5), 20, 1, 0, shuffle=False).tolist() == list(range(20))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 300), world=st.integers(1, 5), workers=st.integers(1, 4), batch=st.integers(1, 9),
       drop_last=st.booleans())  # fmt: skip
def test_ranks_get_equal_shares_and_workers_never_overlap(n: int, world: int, workers: int, batch: int,
                                                           drop_last: bool) -> None:  # fmt: skip
    lay = layout(n, world, workers, batch, drop_last=drop_last)
    shares = [lay.rank_positions(r) for r in range(world)]
    assert len({s.size for s in shares}) == 1
    for r, share in enumerate(shares):
        streams = [lay.stream(r, w) for w in range(workers)]
        joined = np.concatenate(streams) if streams else share[:0]
        expect = share[: lay.batches() * batch] if drop_last else share
        assert sorted(joined.tolist()) == sorted(expect.tolist())  # the share, each position once
    if n and not drop_last:
        seen = set(np.concatenate([s for s in shares]).tolist())
        assert seen == set(range(n))  # nothing lost; padding repeats only
    if drop_last and n >= world:
        assert lay.share() == n // world


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 300), world=st.integers(1, 5), workers=st.integers(1, 4), batch=st.integers(1, 9),
       window=st.integers(1, 12), drop_last=st.booleans(), seed=st.integers(0, 2**40))  # fmt: skip
def test_a_workers_stream_is_its_span_of_the_ranks_share_permuted_in_windows(
    n: int, world: int, workers: int, batch: int, window: int, drop_last: bool, seed: int
) -> None:
    # A worker makes only its own span (not its rank's whole share, ~100 MB at 10^8 rows): the
    # same positions in the same order as slicing the share would give.
    lay = layout(n, world, workers, batch, window=window, drop_last=drop_last, seed=seed)
    for r in range(world):
        share = lay.rank_positions(r)
        for w in range(workers):
            start, end = lay.worker_span(w)
            got = lay.stream(r, w)
            assert sorted(got.tolist()) == sorted(share[start:end].tolist())
            for at in range(0, got.size, max(window, 1)):  # permuted within each window only
                assert sorted(got[at : at + window].tolist()) == sorted(
                    share[start + at : min(start + at + window, end)].tolist()
                )
            assert np.array_equal(got, lay.stream(r, w))  # the same every time
    assert lay.stream(0, 0).base is None or lay.stream(0, 0).base is not lay.order  # a copy: permuted in place


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 250), world=st.integers(1, 4), workers=st.integers(1, 3), batch=st.integers(1, 6),
       new_world=st.integers(1, 5), new_workers=st.integers(1, 3), new_batch=st.integers(1, 7),
       cut=st.floats(0, 1))  # fmt: skip
def test_resume_reads_exactly_what_was_not_read(n: int, world: int, workers: int, batch: int, new_world: int,
                                                new_workers: int, new_batch: int, cut: float) -> None:  # fmt: skip
    lay = layout(n, world, workers, batch)
    steps = int(cut * lay.batches())  # batches every worker emitted, in lockstep
    offsets = [min(steps * batch, lay.worker_span(w)[1] - lay.worker_span(w)[0]) for w in range(workers)]
    seen = set(lay.consumed(offsets).tolist())
    nxt = lay.resumed(offsets, new_world, new_workers, new_batch)
    rest = set(np.concatenate(emitted(nxt)).tolist()) if nxt.order.size else set()
    assert seen | rest == set(range(n))
    assert not seen & set(nxt.order.tolist())
    assert nxt.generation == 1


def test_resume_state_must_match_the_workers() -> None:
    with pytest.raises(InputError, match="worker offsets"):
        layout(10, workers=2).consumed([1])
    with pytest.raises(InputError, match="rank 3"):
        layout(10, world=2).rank_positions(3)


def test_windows_permute_only_within_themselves() -> None:
    lay = layout(64, batch=4, window=8)
    plain = lay.rank_positions(0)
    out = lay.stream(0, 0)
    for at in range(0, 64, 8):
        assert sorted(out[at : at + 8].tolist()) == sorted(plain[at : at + 8].tolist())
    assert not np.array_equal(out, plain)
