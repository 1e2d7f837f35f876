"""How one pass over a selection deals each row to its split's shards.

Two ways, for the writers of one pass (manifest.write_jsonl_splits with halves for the upper
half of the ids; write_dealt for any format with a sink, formats.Format.sink): by content hash for ``--split NAME=FRACTION`` (``plan.split_of``), or by the split folder each
row was scanned in for a pre-split tree (``--split tree`` or none), the row carrying its split
at ``EXTRA``. The second replaces a statement a split folder, each of which read the whole
table (the split column has no index), and the count of the selection's split folders that
came before them: one read of the catalog instead of three at 10^8 rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter
from typing import TYPE_CHECKING, Any, TypeVar

from dlindex.export.arrow_rows import arrow_source, tally_batch
from dlindex.export.hashsplit import batch_splits
from dlindex.export.plan import EXTRA, ROW, ExportError, Group

if TYPE_CHECKING:
    from dlindex.export.shards import Context, ShardInfo

Rows = Sequence[tuple[Any, ...]]
T = TypeVar("T")
_BATCH = 4096


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

    def dealer(self, strip: bool = True) -> Callable[[Rows], tuple[Rows, list[str]]]:
        """A function from a batch of rows to (the rows to write, each one's split); without
        ``strip`` a row keeps its split after ROW (for writers that read rows by position)."""
        if self.fractions:
            assign = batch_splits(dict(self.fractions))
            return lambda batch: (batch, assign(batch))
        known = frozenset(self.names)
        split, written = itemgetter(EXTRA), itemgetter(slice(0, EXTRA))  # in C: no Python frame a row

        def by_folder(batch: Rows) -> tuple[Rows, list[str]]:
            splits = list(map(split, batch))
            if not known.issuperset(splits):  # a None (no split folder) or a split not asked for
                raise OutsideSplit("a selected sample is in no split folder")
            return list(map(written, batch)) if strip else batch, splits

        return by_folder


def partition(rows: Sequence[T], splits: Sequence[str], names: Sequence[str]) -> list[tuple[str, Sequence[T]]]:
    """A dealt batch's rows (or their encoded lines) by split, in ``names`` order, each in the
    batch's order; splits with none left out."""
    if splits and splits.count(splits[0]) == len(splits):  # one split: most batches of a tree in id order
        return [(splits[0], rows)]
    parts: dict[str, list[T]] = {name: [] for name in names}
    for name, row in zip(splits, rows, strict=True):
        parts[name].append(row)
    return [(name, part) for name, part in parts.items() if part]


def deal_batch(batch: Any, names: Sequence[str]) -> list[tuple[str, Any]]:
    """``partition`` for a batch of Arrow rows (dlindex.export.arrow_rows): by its ``split``
    column, in ``names`` order, each in the batch's order, the column dropped."""
    import pyarrow.compute as pc

    splits = batch.column("split")
    rows = batch.select(list(ROW))
    found = pc.unique(splits).to_pylist()
    if splits.null_count or not set(names).issuperset(found):
        raise OutsideSplit("a selected sample is in no split folder")
    if len(found) == 1:
        return [(found[0], rows)]
    return [(name, rows.filter(pc.equal(splits, name))) for name in names if name in found]


def write_dealt(
    ctx: Context, groups: Sequence[Group], rows: Iterable[tuple[Any, ...]], dealing: Dealing, sink: Any
) -> list[ShardInfo]:
    """Every split's shards from one pass over ``rows`` (one rank, no second process): each
    batch is dealt and each split's rows go to that split's ``sink`` (the format's writer
    class, formats.Format.sink) as they come; the same shards as one group after another."""
    names = [g.split for g in groups]
    tally = groups[0].tally
    assert tally is not None and list(dealing.names) == names
    sinks = {g.split: sink(ctx, g, 0) for g in groups}
    columnar = None if dealing.fractions else arrow_source(sinks[names[0]], rows)
    if columnar is not None:  # Arrow batches, dealt by their split column (dlindex.export.arrow_rows)
        with closing(columnar):  # the driver's statement ends here, whatever stops the loop
            for batch in columnar:
                for name, part in deal_batch(batch, names):
                    tally_batch(tally, name, 0, part)
                    sinks[name].take_arrow(part)
                ctx.tick(batch.num_rows)
        return [shard for name in names for shard in sinks[name].finish()]
    dealer = dealing.dealer(strip=not sink.positional)
    rest = iter(rows)
    while batch := list(islice(rest, _BATCH)):
        kept, splits = dealer(batch)
        for name, part in partition(kept, splits, names):
            tally.add(name, 0, part)
            sinks[name].take(part, {})
        ctx.tick(len(batch))
    return [shard for name in names for shard in sinks[name].finish()]
