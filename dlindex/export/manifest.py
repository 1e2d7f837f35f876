"""Manifest shards as jsonl and csv: one row per sample (TEXT_KEYS), valid UTF-8 text.

A path that is not UTF-8 keeps its exact bytes in ``path_b64``.
"""

from __future__ import annotations

import csv
import json

from dlindex.export import halves
from dlindex.export.jsonl import JsonlWriter, jsonl_lines, text_sizes
from dlindex.export.plan import BYTES, FORMAT, HASH, HEIGHT, ID, LABEL, WIDTH, Group, sample_path
from dlindex.export.shards import TEXT_KEYS, Context, ShardInfo, shown_path, vector_list
from dlindex.export.writer import TextWriter, batches


def write_jsonl(ctx: Context, group: Group, number: int) -> list[ShardInfo]:
    """One JSON object per line; a plain single file has its upper half written by a second process."""
    lines = jsonl_lines(ctx)
    sink = JsonlWriter(ctx, group, number)
    upper = None
    half = ctx.upper.get(group.split) if ctx.upper is not None else None
    if half is not None and ctx.shard_size is None and ctx.shard_bytes is None and ctx.features is None:
        upper = halves.start(ctx, group, half)  # the upper half, written by a second process meanwhile
    try:
        for batch, vectors in batches(group, ctx):
            text = lines(batch, vectors)
            sink.add_batch(text, text_sizes(text))
            sink.flush()
            ctx.tick(len(batch))
        if upper is not None:
            count = upper.finish(group)
            sink.append_file(upper.part, count)
            ctx.tick(count)
    except BaseException:
        if upper is not None and upper.process.is_alive():
            upper.kill()
        raise
    return sink.finish()


class _Line:
    """A file for ``csv.writer`` whose ``write`` returns the text: ``writerow`` then gives the line."""

    write = str  # the identity on text, and no Python frame per row


class CsvWriter(TextWriter):
    """A header line (TEXT_KEYS, then ``feature`` with --features) atop each shard."""

    suffix = ".csv"

    def __init__(self, ctx: Context, group: Group, number: int) -> None:
        super().__init__(ctx, group, number)
        self.line = csv.writer(_Line(), lineterminator="\n").writerow
        self.header = self.line([*TEXT_KEYS, *(["feature"] if ctx.features is not None else [])])


def write_csv(ctx: Context, group: Group, number: int) -> list[ShardInfo]:
    index, names = ctx.plan.label_index, ctx.plan.labels
    sink = CsvWriter(ctx, group, number)
    line = sink.line
    feature = ctx.features
    by_bytes = ctx.shard_bytes is not None
    for batch, vectors in batches(group, ctx):
        text: list[str] = []
        sizes: list[int] = []
        for row in batch:
            k = index[row[LABEL]]
            path, b64 = shown_path(sample_path(row, ctx.prefixes))
            values = [row[ID], path, names[k], k, row[WIDTH], row[HEIGHT], row[FORMAT], row[BYTES], row[HASH], b64]
            if feature is not None:
                values.append(json.dumps(vector_list(vectors[row[ID]], feature.dtype)))
            if by_bytes:  # an estimate, as --shard-bytes has always counted a csv row
                sizes.append(sum(len(str(v)) for v in values) + len(values))
            text.append(line(["" if v is None else v for v in values]))
        sink.add_batch(text, sizes)
        sink.flush()
        ctx.tick(len(batch))
    return sink.finish()
