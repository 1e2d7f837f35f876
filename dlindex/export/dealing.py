"""How one pass over a selection deals each row to its split's shard (jsonl manifests).

Two ways, one writer (manifest.write_jsonl_splits, and halves for the upper half of the ids):
by content hash for ``--split NAME=FRACTION`` (``plan.split_of``), or by the split folder each
row was scanned in for a pre-split tree (``--split tree`` or none), the row carrying its split
at ``EXTRA``. The second replaces a statement a split folder, each of which read the whole
table (the split column has no index), and the count of the selection's split folders that
came before them: one read of the catalog instead of three at 10^8 rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from dlindex.export.hashsplit import batch_splits
from dlindex.export.plan import EXTRA, ExportError

Rows = Sequence[tuple[Any, ...]]


class OutsideSplit(ExportError):
    """A selected row of a pre-split tree is in no split folder (or in one not asked for); the
    export turns it into the same message a count of the selection gives."""


@dataclass(frozen=True)
class Dealing:
    """The splits of one pass, in output order; with ``fractions``, dealt by content hash,
    else by each row's tree split (at EXTRA, cut off before the row is written). Picklable:
    the second process gets it as it is."""

    names: tuple[str, ...]
    fractions: tuple[tuple[str, float], ...] = ()

    def dealer(self) -> Callable[[Rows], tuple[Rows, list[str]]]:
        """A function from a batch of rows to (the rows to write, each one's split)."""
        if self.fractions:
            assign = batch_splits(dict(self.fractions))
            return lambda batch: (batch, assign(batch))
        known = frozenset(self.names)
        split, written = itemgetter(EXTRA), itemgetter(slice(0, EXTRA))  # in C: no Python frame a row

        def by_folder(batch: Rows) -> tuple[Rows, list[str]]:
            splits = list(map(split, batch))
            if not known.issuperset(splits):  # a None (no split folder) or a split not asked for
                raise OutsideSplit("a selected sample is in no split folder")
            return list(map(written, batch)), splits

        return by_folder
