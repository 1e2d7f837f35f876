"""Parquet manifest shards: columns SAMPLE_KEYS plus ``path_bytes``, zstd, one table per shard."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from operator import add
from pathlib import Path
from typing import Any

from dlindex.export.arrow_rows import ArrowPaths, odd_rows
from dlindex.export.files import hash_file
from dlindex.export.plan import EXTRA, FILE, HASH, ID, ExportError, Group, sample_path
from dlindex.export.shards import Context, ShardInfo, shown_path, text_prefixes, vector_list
from dlindex.export.writer import ShardWriter, fill

_Sample = tuple[Any, ...]  # a row (its feature vector, with --features, waits in ParquetWriter.vectors)
ROW_GROUP = 1 << 20  # rows: pyarrow's default row group (write_table's row_group_size=None)


def pyarrow_modules() -> tuple[Any, Any]:
    """(pyarrow, pyarrow.parquet); ExportError saying how to install them when missing."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ExportError("--format parquet needs pyarrow: pip install 'dlindex[export]'") from None
    return pa, pq


class ParquetWriter(ShardWriter[_Sample]):
    """``path_bytes`` holds the exact name where it is not UTF-8, else null.

    Memory stays one row group: each batch becomes Arrow columns at once (``stage``), and every
    ``ROW_GROUP`` rows go to the open shard file as one row group, the cut ``pq.write_table``
    makes in one table of the shard (so the file is the same, byte for byte).
    """

    suffix = ".parquet"

    def __init__(self, ctx: Context, group: Group, number: int) -> None:
        super().__init__(ctx, group, number)
        self.pa, self.pq = pyarrow_modules()
        self.staged: list[Any] = []  # Arrow tables of the open shard not yet written
        self.staged_rows = 0
        self.file: Any = None  # the open shard's pq.ParquetWriter
        self.encoding: _Encoding | None = None  # the row group being written on its thread
        self.vectors: dict[int, bytes] = {}  # the pending rows' vectors (--features)
        self.row_texts: dict[int, list[str]] = {}  # the pending rows' texts (--texts)
        self.texts = text_prefixes(ctx)
        index, names = ctx.plan.label_index, ctx.plan.labels
        self.label_names = {row: names[k] for row, k in index.items()}
        self.columnar: _Columnar | None = None  # the lookups of take_arrow, made on its first batch

    def take(self, batch: Sequence[tuple[Any, ...]], vectors: dict[int, bytes]) -> None:
        if self.ctx.features is not None:
            self.vectors.update(vectors)
        if self.ctx.texts is not None:  # the batch's texts wait with its rows, as vectors do
            self.row_texts.update((row[ID], self.ctx.texts.of(row[ID])) for row in batch)
        sizes = (48 + len(row[FILE]) + len(row[HASH] or "") for row in batch)  # an estimate per row
        self.add_batch(batch, sizes)
        self.stage()

    def arrow_ready(self) -> bool:
        """Whether ``take_arrow`` can take this export's rows (no vectors, no byte limit)."""
        return self.ctx.features is None and self.max_bytes is None

    def take_arrow(self, rows: Any) -> None:
        """A batch of rows as Arrow (ROW's columns: dlindex.export.arrow_rows), cut into shards
        as ``add_batch`` cuts tuples, staged as the same columns ``table`` makes of them."""
        if self.columnar is None:
            self.columnar = _Columnar(self)
        table = self.columnar.table(rows)
        for start, room in self.slices(table.num_rows):
            self.staged.append(table.slice(start, room))
            self.staged_rows += room
            while self.staged_rows >= ROW_GROUP:
                self.write_rows(ROW_GROUP)

    def stage(self) -> None:
        """Turn the pending samples into Arrow columns; write every full row group."""
        if self.pending:
            table = self.table(self.pending)
            self.staged.append(table)
            self.staged_rows += table.num_rows
            self.pending = []
        while self.staged_rows >= ROW_GROUP:
            self.write_rows(ROW_GROUP)

    def write_rows(self, n: int) -> None:
        """Write the first ``n`` staged rows as one row group of the open shard: joined and
        encoded on a thread (pyarrow does both without Python's lock) while this one builds
        the next group's columns; one group at a time, in order."""
        table = self.pa.concat_tables(self.staged)
        rest = table.slice(n)
        self.staged = [rest] if rest.num_rows else []
        self.staged_rows -= n
        if self.file is None:
            path = self.ctx.out / self.shard_file(len(self.shards))
            self.file = self.pq.ParquetWriter(path, table.schema, compression="zstd")
        self.wait()  # the group before, written (or its error raised here)
        file, head = self.file, table.slice(0, n)
        # contiguous, as one table: the same pages as the whole shard written at once
        self.encoding = _Encoding(lambda: file.write_table(head.combine_chunks()))

    def wait(self) -> None:
        """Until the row group on its thread is written; its error, if any, raised here."""
        encoding, self.encoding = self.encoding, None
        if encoding is not None:
            encoding.result()

    def seal_shard(self, path: Path, pending: list[_Sample]) -> tuple[int, str]:
        self.stage()
        if self.file is None:  # the whole shard in one table, as it has always been written
            table = self.pa.concat_tables(self.staged).combine_chunks()  # contiguous, as one table: same pages
            self.staged = []
            self.pq.write_table(table, path, compression="zstd")
        else:
            if self.staged_rows:
                self.write_rows(self.staged_rows)
            self.wait()
            self.file.close()
        self.file, self.staged, self.staged_rows = None, [], 0
        return hash_file(path)

    def table(self, pending: list[_Sample]) -> Any:
        pa, ctx = self.pa, self.ctx
        # Columns by transposing the rows in C; a value after ROW (a tree split) is left out.
        ident, root, name, raw, label, width, height, fmt, size, digest = list(zip(*pending, strict=True))[:EXTRA]
        texts = self.texts
        if raw.count(None) == len(raw) and texts.keys() >= set(root):  # UTF-8 names under UTF-8 roots
            shown: list[str] = list(map(add, map(texts.__getitem__, root), name))
            exact: list[bytes | None] = [None] * len(pending)
        else:
            raws = [sample_path(row, ctx.prefixes) for row in pending]
            texts_b64 = [shown_path(r) for r in raws]
            shown = [text for text, _ in texts_b64]
            exact = [None if b64 is None else r for r, (_, b64) in zip(raws, texts_b64, strict=True)]
        columns: dict[str, Any] = {
            "id": pa.array(list(ident), pa.int64()),  # from a tuple: ~8x slower (pyarrow 26)
            "path": pa.array(shown, pa.string()),
            "label": pa.array(list(map(self.label_names.__getitem__, label)), pa.string()),
            "label_id": pa.array(list(map(ctx.plan.label_index.__getitem__, label)), pa.int32()),
            "width": pa.array(width, pa.int32()),
            "height": pa.array(height, pa.int32()),
            "format": pa.array(fmt, pa.string()),
            "bytes": pa.array(size, pa.int64()),
            "xxh3_128": pa.array(digest, pa.string()),
            "path_bytes": pa.array(exact, pa.binary()),
        }
        if ctx.features is not None:
            blobs = [self.vectors.get(i) or b"" for i in ident]
            for i in ident:
                self.vectors.pop(i, None)
            values = [v for blob in blobs for v in vector_list(blob, ctx.features.dtype)]
            flat = pa.array(values, pa.float64() if ctx.features.dtype == "<f8" else pa.float32())
            columns["feature"] = pa.FixedSizeListArray.from_arrays(flat, ctx.features.dim)
        if ctx.texts is not None:
            captions = [self.row_texts.get(i, []) for i in ident]  # get: a --pad repeat shares its sample's
            for i in ident:
                self.row_texts.pop(i, None)
            columns["text"] = pa.array([t[0] if t else None for t in captions], pa.string())
            columns["texts"] = pa.array(captions, pa.list_(pa.string()))
        return pa.table(columns)


class _Columnar:
    """``ParquetWriter.table``'s columns made from Arrow rows by Arrow's own kernels: a name
    under a root with a text prefix is that prefix and its text, joined in C; the few others
    (a name that is not UTF-8, a root without a text prefix) go through ``sample_path`` and
    ``shown_path`` as ``table`` takes them, row by row, and are put in their places."""

    def __init__(self, writer: ParquetWriter) -> None:
        import pyarrow.compute as pc

        pa, ctx = writer.pa, writer.ctx
        self.pa, self.pc, self.ctx = pa, pc, ctx
        self.paths = ArrowPaths(writer.texts)
        index = ctx.plan.label_index
        self.label_rows = pa.array(list(index), pa.int64())
        self.label_names = pa.array([writer.label_names[row] for row in index], pa.string())
        self.label_ids = pa.array(list(index.values()), pa.int32())

    def table(self, rows: Any) -> Any:
        pa, pc = self.pa, self.pc
        path, odd = self.paths.joined(rows)
        exact = pa.nulls(rows.num_rows, pa.binary())
        if pc.any(odd).as_py():
            raws = [sample_path(row, self.ctx.prefixes) for row in odd_rows(rows, odd)]
            shown = [shown_path(raw) for raw in raws]
            path = pc.replace_with_mask(path, odd, pa.array([text for text, _ in shown], pa.string()))
            kept = [None if b64 is None else raw for raw, (_, b64) in zip(raws, shown, strict=True)]
            exact = pc.replace_with_mask(exact, odd, pa.array(kept, pa.binary()))
        label = pc.index_in(rows.column("label_row"), value_set=self.label_rows)
        if label.null_count:
            raise ExportError("a selected sample's label is not in the export's class list; nothing was exported")

        # A column of the driver's batch keeps the whole batch alive (Arrow's C import holds it
        # as one): the columns kept as they are are copied out, so a staged row group holds
        # only its own columns (~450 MB less at the peak of a 10^7-row manifest).
        def own(name: str) -> Any:
            return pa.concat_arrays([rows.column(name)])

        columns = {
            "id": own("id"),
            "path": path,
            "label": pc.take(self.label_names, label),
            "label_id": pc.take(self.label_ids, label),
            "width": rows.column("width").cast(pa.int32()),
            "height": rows.column("height").cast(pa.int32()),
            "format": own("format"),
            "bytes": own("bytes"),
            "xxh3_128": own("xxh3_128"),
            "path_bytes": exact,
        }  # fmt: skip
        texts = self.ctx.texts
        if texts is not None:  # the batch's texts, fetched as batches() fetches them for tuples
            ids = rows.column("id").to_pylist()
            texts.load(ids)
            captions = [texts.of(i) for i in ids]
            columns["text"] = pa.array([t[0] if t else None for t in captions], pa.string())
            columns["texts"] = pa.array(captions, pa.list_(pa.string()))
        return pa.table(columns)


class _Encoding:
    """One row group written on a thread of its own, which ends with the write whatever the
    export does meanwhile (nothing is left running after a failure)."""

    def __init__(self, write: Callable[[], object]) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(write,), name="dlindex-parquet", daemon=True)
        self.thread.start()

    def _run(self, write: Callable[[], object]) -> None:
        try:
            write()
        except BaseException as e:  # raised in the export's thread, by result()
            self.error = e

    def result(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def write_parquet(ctx: Context, group: Group, number: int) -> list[ShardInfo]:
    return fill(ParquetWriter(ctx, group, number), group, ctx)
