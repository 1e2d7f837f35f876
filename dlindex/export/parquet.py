"""Parquet manifest shards: columns SAMPLE_KEYS plus ``path_bytes``, zstd, one table per shard."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlindex.export.files import hash_file
from dlindex.export.plan import BYTES, FILE, FORMAT, HASH, HEIGHT, ID, LABEL, WIDTH, ExportError, Group, sample_path
from dlindex.export.shards import Context, ShardInfo, shown_path, vector_list
from dlindex.export.writer import ShardWriter, batches

_Sample = tuple[tuple[Any, ...], bytes | None]  # a row and its feature vector


def pyarrow_modules() -> tuple[Any, Any]:
    """(pyarrow, pyarrow.parquet); ExportError saying how to install them when missing."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ExportError("--format parquet needs pyarrow: pip install 'dlindex[export]'") from None
    return pa, pq


class ParquetWriter(ShardWriter[_Sample]):
    """``path_bytes`` holds the exact name where it is not UTF-8, else null."""

    suffix = ".parquet"

    def __init__(self, ctx: Context, group: Group, number: int) -> None:
        super().__init__(ctx, group, number)
        self.pa, self.pq = pyarrow_modules()

    def seal_shard(self, path: Path, pending: list[_Sample]) -> tuple[int, str]:
        pa, ctx = self.pa, self.ctx
        index, names = ctx.plan.label_index, ctx.plan.labels
        raws = [sample_path(row, ctx.prefixes) for row, _ in pending]
        texts = [shown_path(raw) for raw in raws]
        shown = [text for text, _ in texts]
        exact = [None if b64 is None else raw for raw, (_, b64) in zip(raws, texts, strict=True)]
        columns: dict[str, Any] = {
            "id": pa.array([r[ID] for r, _ in pending], pa.int64()),
            "path": pa.array(shown, pa.string()),
            "label": pa.array([names[index[r[LABEL]]] for r, _ in pending], pa.string()),
            "label_id": pa.array([index[r[LABEL]] for r, _ in pending], pa.int32()),
            "width": pa.array([r[WIDTH] for r, _ in pending], pa.int32()),
            "height": pa.array([r[HEIGHT] for r, _ in pending], pa.int32()),
            "format": pa.array([r[FORMAT] for r, _ in pending], pa.string()),
            "bytes": pa.array([r[BYTES] for r, _ in pending], pa.int64()),
            "xxh3_128": pa.array([r[HASH] for r, _ in pending], pa.string()),
            "path_bytes": pa.array(exact, pa.binary()),
        }
        if ctx.features is not None:
            values = [v for _, blob in pending for v in vector_list(blob or b"", ctx.features.dtype)]
            flat = pa.array(values, pa.float64() if ctx.features.dtype == "<f8" else pa.float32())
            columns["feature"] = pa.FixedSizeListArray.from_arrays(flat, ctx.features.dim)
        self.pq.write_table(pa.table(columns), path, compression="zstd")
        return hash_file(path)


def write_parquet(ctx: Context, group: Group, number: int) -> list[ShardInfo]:
    sink = ParquetWriter(ctx, group, number)
    for batch, vectors in batches(group, ctx):
        sizes = (48 + len(row[FILE]) + len(row[HASH] or "") for row in batch)  # an estimate per row
        sink.add_batch([(row, vectors.get(row[ID])) for row in batch], sizes)
        ctx.tick(len(batch))
    return sink.finish()
