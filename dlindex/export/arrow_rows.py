"""A selection's rows, which a columnar writer may read as Arrow batches instead of tuples.

``select_rows`` hands every writer the same lazy iterator of ROW tuples. Where the rows are one
plain statement over a catalog file, that iterator is a ``StatementRows``: a writer with a
``take_arrow`` step (parquet) asks it for ``arrow_batches()`` before taking a tuple, and gets
the statement's rows read in C (dlindex.catalog.sqlite.arrow_read) -- or None, and reads the
tuples as every other writer does. Either way the statement runs once and is logged once.
The dealing, tally and progress steps of a batch of tuples have their Arrow twins here, so
that a tree's split folders and their counts come out the same.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dlindex import faults
from dlindex.catalog.sqlite.arrow_read import ArrowReadError
from dlindex.exported import ExportError
from dlindex.query.rows import read_rows

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.query.rows import PreparedQuery

# How each column of a ROW (and a tree split) is read: the Arrow type it must have.
_KINDS = {
    "id": "int", "root_id": "int", "file_path": "text", "file_path_bytes": "blob", "label_row": "int",
    "width": "int", "height": "int", "format": "text", "bytes": "int", "xxh3_128": "text", "split": "text",
}  # fmt: skip


def statement_rows(
    catalog: Catalog, prepared: PreparedQuery, names: Sequence[str], statement: tuple[str, Mapping[str, Any]] | None
) -> Iterator[tuple[Any, ...]]:
    """The rows of a prepared selection (columns ``names``), or of ``statement`` (sql, params)
    wrapped around it: a StatementRows where they are one statement, else ``read_rows``'s
    (a sample or a narrow window: rows by id, dlindex.query.fetch)."""
    if statement is not None:
        return StatementRows(catalog, statement[0], statement[1], names)
    if prepared.picked_sql is None:
        return StatementRows(catalog, prepared.sql, prepared.params, names)
    return read_rows(catalog, prepared)


class StatementRows:
    """The rows of one statement as tuples (``catalog.read``: run on the first ``next``), or
    once, before any tuple is taken, as Arrow batches (``arrow_batches``)."""

    def __init__(self, catalog: Catalog, sql: str, params: Mapping[str, Any], names: Sequence[str]) -> None:
        self.catalog, self.sql, self.params, self.names = catalog, sql, params, tuple(names)
        self._rows: Iterator[tuple[Any, ...]] | None = None

    def __iter__(self) -> StatementRows:
        return self

    def __next__(self) -> tuple[Any, ...]:
        if self._rows is None:
            self._rows = self.catalog.read(self.sql, self.params)
        return next(self._rows)

    def close(self) -> None:
        """Stop the statement (as a generator's close): nothing more is read."""
        rows, self._rows = self._rows, iter(())
        close = getattr(rows, "close", None)
        if close is not None:
            close()

    def arrow_batches(self) -> Generator[Any, None, None] | None:
        """The rows as Arrow record batches named as ROW (plus ``split``), or None where they
        cannot be read so (then the tuples are still all there)."""
        if self._rows is not None or any(name not in _KINDS for name in self.names):
            return None
        if self.catalog.pinned is not None:  # the driver's own connection has no views of a past state
            return None
        catalog = self.catalog
        columns = [(name, _KINDS[name]) for name in self.names]
        batches = catalog.backend.read_arrow(catalog.conn, self.sql, self.params, columns)
        if batches is None:
            return None
        self._rows = iter(())  # read as Arrow: no tuples left to take
        return _logged(catalog, self.sql, self.params, batches)


def _logged(
    catalog: Catalog, sql: str, params: Mapping[str, Any], batches: Iterator[Any]
) -> Generator[Any, None, None]:
    """``batches`` as they come, the statement timed and logged once they end (as catalog.read
    logs its rows); a failure of the driver is one line: a damaged catalog's as dlindex says it."""
    seconds, rows = 0.0, 0
    try:
        while True:
            started = time.perf_counter()
            try:
                batch = next(batches, None)
            except ArrowReadError as e:
                if any(word in str(e) for word in ("malformed", "corrupt", "not a database", "not UTF-8")):
                    catalog.querylog.enabled = False  # a damaged file is written no more
                    raise faults.damaged_error(catalog.path, str(e)) from None
                raise ExportError(f"the catalog's rows could not be read: {e}; nothing was exported") from None
            seconds += time.perf_counter() - started
            if batch is None:
                break
            rows += batch.num_rows
            yield batch
        if catalog.querylog.enabled:
            catalog.querylog.record_read(catalog.conn, sql, params, seconds, rows)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def arrow_source(sink: Any, rows: Any) -> Generator[Any, None, None] | None:
    """``rows`` as Arrow batches where ``sink`` takes them (``take_arrow``, when its options
    allow: ``arrow_ready``) and they can be read so; else None: the sink takes tuples."""
    ready = getattr(sink, "arrow_ready", None)
    source = getattr(rows, "arrow_batches", None)
    if ready is None or source is None or not ready():
        return None
    batches: Generator[Any, None, None] | None = source()
    return batches


def tally_batch(tally: Any, split: str, rank: int, batch: Any) -> None:
    """``plan.Tally.add`` for a batch of Arrow rows: samples, and samples per catalog label
    (``tally`` is a Tally; plan imports this module, so the type is not named here)."""
    import pyarrow.compute as pc

    tally.samples[(split, rank)] += batch.num_rows
    for entry in pc.value_counts(batch.column("label_row")).to_pylist():
        tally.labels[(split, entry["values"])] += entry["counts"]


class ArrowPaths:
    """Each Arrow row's path as text, as ``shown_path(sample_path(row))`` gives it: the root's
    text prefix joined to the name in C; NULL, and ``odd``, where the per-row code must make it
    (a name that is not UTF-8, a root without a text prefix: ``odd_rows`` hands those over)."""

    def __init__(self, texts: Mapping[int, str]) -> None:
        import pyarrow as pa

        self.root_ids = pa.array(list(texts), pa.int64())
        self.root_texts = pa.array(list(texts.values()), pa.string())

    def joined(self, rows: Any) -> tuple[Any, Any]:
        """(the paths, NULL where odd; the odd rows' mask)."""
        import pyarrow.compute as pc

        prefix = pc.take(self.root_texts, pc.index_in(rows.column("root_id"), value_set=self.root_ids))
        path = pc.binary_join_element_wise(prefix, rows.column("file_path"), "")
        return path, pc.or_(pc.is_null(path), pc.is_valid(rows.column("file_path_bytes")))


def odd_rows(rows: Any, odd: Any) -> list[tuple[Any, ...]]:
    """The rows of an Arrow batch where ``odd`` is true, as tuples (the per-row code's input)."""
    picked = rows.filter(odd)
    return list(zip(*(column.to_pylist() for column in picked.columns), strict=True))
