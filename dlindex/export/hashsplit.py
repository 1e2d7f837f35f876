"""Split fractions without a spill: one statement per split, which the database narrows by hash.

A sample's split is a range of the top 64 bits of its content hash (``plan.split_of``), and
those bits are the hash's first 16 hex digits: for a lowercase hex hash, comparing those
digits as text is comparing the numbers. So each split's statement is the selection's own
(same filters, order, limit) keeping the rows whose hash prefix lies in the split's range, or
whose hash is not such a prefix (none, or odd text); the rows that reach Python are then
checked by ``split_of`` itself, so a split holds exactly the rows, in exactly the order, that
dealing the whole selection out would give it, and nothing waits in memory or on disk. The
cost is a pass of the database over the selection per split, in C, instead of every row
going through Python, a spill file and back.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from dlindex.export.plan import UNIT, select_rows, split_of

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.query.spec import QuerySpec

_HEX16 = "[0-9a-f]" * 16 + "*"
# Inclusive at both ends (a superset: split_of decides the bounds); a NULL or odd hash always passes.
_IN_RANGE = """SELECT * FROM ({query}) AS selected WHERE selected.xxh3_128 IS NULL
    OR NOT (selected.xxh3_128 GLOB :hex16)
    OR (substr(selected.xxh3_128, 1, 16) >= :low AND substr(selected.xxh3_128, 1, 16) <= :high)"""


def hash_ranges(fractions: Mapping[str, float]) -> dict[str, tuple[str, str]]:
    """Per split: the lowest and highest 16-digit hash prefix it can hold (both inclusive)."""
    ranges: dict[str, tuple[str, str]] = {}
    low, total = 0, 0.0
    names = list(fractions)
    for k, name in enumerate(names):
        total += fractions[name]
        high = (1 << 64) - 1 if k == len(names) - 1 else min(int(total * UNIT), (1 << 64) - 1)
        ranges[name] = (f"{low:016x}", f"{high:016x}")
        low = high
    return ranges


def split_streams(
    catalog: Catalog, spec: QuerySpec, shuffle: bool, seed: int, fractions: Mapping[str, float]
) -> tuple[dict[str, Iterator[tuple[Any, ...]]], Any]:
    """Per split of ``fractions``: its rows, lazily, each split its own statement (nothing is
    read before the rows are iterated)."""
    assign = split_of(fractions)
    streams: dict[str, Iterator[tuple[Any, ...]]] = {}
    prepared = None
    for name, (low, high) in hash_ranges(fractions).items():
        wrap = (_IN_RANGE, {"hex16": _HEX16, "low": low, "high": high})
        rows, prepared = select_rows(catalog, spec, shuffle, seed, wrap=wrap)
        streams[name] = _only(rows, assign, name)
    return streams, prepared


def _only(rows: Iterator[tuple[Any, ...]], assign: Any, name: str) -> Iterator[tuple[Any, ...]]:
    for row in rows:
        if assign(row) == name:
            yield row
