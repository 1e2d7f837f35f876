"""How near pairs become groups: around a kept sample (no chains), or connected components.

Near pairs are not transitive: a~b and b~c does not make a~c. Connected components (single
linkage) chain them, so on a tree of similar pictures (clip art, flags, icons) one group can
swallow thousands of images that are not copies of each other; flagging all but one of them
would throw away real data. ``around_kept`` groups the way removal needs: samples are taken in
the keep policy's order, and the first one not yet in a group takes every ungrouped sample
within the limit of it, so every member of a group is a near copy of the kept one (the greedy
rule imagededup's ``find_duplicates_to_remove`` follows). Splits and leak checks need the
other rule: a chain must not cross a split, so they use ``components``.

Both work on nodes: a node is a sample, or (for hashes) one distinct hash value with all the
samples that share it, so a million identical hashes cost one node, not 10^12 pairs.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from dlindex.quality.pairs import PairChunk

Nodes = npt.NDArray[np.intp]


def components(count: int, chunks: Iterable[PairChunk]) -> Nodes:
    """The smallest node of each node's connected component (union-find with path halving)."""
    parent = list(range(count))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, j, _ in chunks:
        for a, b in zip(i.tolist(), j.tolist(), strict=True):
            ra, rb = root(a), root(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    return np.array([root(x) for x in range(count)], dtype=np.intp)


def around_kept(count: int, chunks: Iterable[PairChunk], rank: npt.NDArray[np.int64]) -> Nodes:
    """The leader node of each node (itself if it leads), -1 for nodes with no near pair.

    ``rank`` orders the nodes by the keep policy (lower is kept first). A node that is not
    yet taken leads, and takes every untaken node it is paired with; so each node is within
    the limit of its leader, and the leader has the best rank of its group.
    """
    sources: list[Nodes] = []
    targets: list[Nodes] = []
    for i, j, _ in chunks:
        sources += [i, j]
        targets += [j, i]
    leader = np.full(count, -1, dtype=np.intp)
    if not sources:
        return leader
    source = np.concatenate(sources)
    target = np.concatenate(targets)
    order = np.argsort(source, kind="stable")
    source, target = source[order], target[order]
    starts = np.searchsorted(source, np.arange(count + 1))
    paired = np.unique(source)
    taken = np.zeros(count, dtype=bool)
    for node in paired[np.argsort(rank[paired], kind="stable")].tolist():
        if taken[node]:
            continue
        near = target[starts[node] : starts[node + 1]]
        near = near[~taken[near]]
        if near.size == 0:
            continue  # every neighbour already belongs to a better-ranked sample's group
        taken[node] = True
        taken[near] = True
        leader[node] = node
        leader[near] = node
    return leader
