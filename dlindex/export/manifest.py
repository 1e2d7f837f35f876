"""Manifest shards as jsonl and csv: one row per sample (TEXT_KEYS), valid UTF-8 text.

A path that is not UTF-8 keeps its exact bytes in ``path_b64``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Any

from dlindex.export import halves
from dlindex.export.arrow_rows import ArrowPaths, odd_rows
from dlindex.export.dealing import Dealing
from dlindex.export.jsonl import JsonlWriter, deal, jsonl_lines, text_sizes
from dlindex.export.plan import (
    BYTES,
    FORMAT,
    HASH,
    HEIGHT,
    ID,
    LABEL,
    WIDTH,
    ExportError,
    Group,
    UpperHalf,
    sample_path,
)
from dlindex.export.shards import TEXT_KEYS, Context, ShardInfo, shown_path, text_prefixes, vector_list
from dlindex.export.writer import TextWriter, batches, fill

_BATCH = 4096


def write_jsonl(ctx: Context, group: Group, number: int) -> list[ShardInfo]:
    """One JSON object per line; a plain single file has its upper half written by a second process."""
    sink = JsonlWriter(ctx, group, number)
    upper = None
    half = ctx.upper.get(group.split) if ctx.upper is not None else None
    if half is not None and ctx.shard_size is None and ctx.shard_bytes is None and ctx.features is None:
        upper = halves.start(ctx, group, half)  # the upper half, written by a second process meanwhile
    try:
        for batch, vectors in batches(group, ctx):
            sink.take(batch, vectors)
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


def write_jsonl_splits(
    ctx: Context, groups: Sequence[Group], rows: Iterable[tuple[Any, ...]], dealing: Dealing,
    upper: UpperHalf | None, opened: Iterable[str] = (),
) -> list[ShardInfo]:  # fmt: skip
    """Splits in one pass (one rank, one shard a split; by fraction or tree folder, ``dealing``):
    the selection is read once and each row's line goes to its split's shard as it comes, in
    the selection's order; the rows of ``upper`` (the upper half of the ids) are written by a
    second process meanwhile, one part a split, appended to each split's shard at the end. The
    same shards, bytes and counts as a statement a split (write_jsonl), which read the whole
    selection once a split.

    Args:
        groups: one a split, in the order of ``fractions`` (rank 0), sharing one tally.
        opened: splits whose shard is written even when empty (as write_jsonl writes one
            for a split it cut in halves).
    """
    names = [g.split for g in groups]
    tally = groups[0].tally
    assert tally is not None and list(dealing.names) == names
    lines, dealer = jsonl_lines(ctx), dealing.dealer()
    sinks = {g.split: JsonlWriter(ctx, g, 0) for g in groups}
    written = dict.fromkeys(names, 0)
    running = None if upper is None else halves.start(ctx, groups[0], upper, dealing)
    try:
        rest = iter(rows)
        while batch := list(islice(rest, _BATCH)):
            kept, splits = dealer(batch)
            out, labels = deal(kept, lines(kept, {}), splits, names)
            for name, text in out.items():
                if text:
                    written[name] += len(text)
                    sinks[name].add_batch(text, text_sizes(text))
                    sinks[name].flush()
            tally.labels.update(labels)
            ctx.tick(len(batch))
        parts: dict[str, int] = {}
        if running is not None:
            parts, labels = running.finish_splits()
            tally.labels.update(labels)
        for name in names:
            if parts.get(name) and running is not None:
                sinks[name].append_file(running.split_part(name), parts[name])
                ctx.tick(parts[name])
            else:
                if running is not None:
                    running.split_part(name).unlink(missing_ok=True)
                if name in opened:
                    sinks[name].opened()
    except BaseException:
        if running is not None and running.process.is_alive():
            running.kill()
        raise
    for name in names:  # in split order, as one group after another counts them
        total = written[name] + parts.get(name, 0)
        if total or name in opened:
            tally.samples[(name, 0)] += total
    return [shard for name in names for shard in sinks[name].finish()]


class _Line:
    """A file for ``csv.writer`` whose ``write`` returns the text: ``writerow`` then gives the line."""

    write = str  # the identity on text, and no Python frame per row


class CsvWriter(TextWriter):
    """A header line (TEXT_KEYS, then ``feature`` with --features) atop each shard."""

    suffix = ".csv"

    def __init__(self, ctx: Context, group: Group, number: int) -> None:
        super().__init__(ctx, group, number)
        self.line = csv.writer(_Line(), lineterminator="\n").writerow
        self.header = self.line([*TEXT_KEYS, *(["feature"] if ctx.features is not None else []),
                                 *(["text", "texts"] if ctx.texts is not None else [])])  # fmt: skip
        self.columnar: _CsvColumnar | None = None  # the lookups of take_arrow, made on its first batch

    def values(self, row: tuple[Any, ...]) -> list[Any]:
        """A row's fields in TEXT_KEYS order (without --features' vector)."""
        k = self.ctx.plan.label_index[row[LABEL]]
        path, b64 = shown_path(sample_path(row, self.ctx.prefixes))
        name = self.ctx.plan.labels[k]
        return [row[ID], path, name, k, row[WIDTH], row[HEIGHT], row[FORMAT], row[BYTES], row[HASH], b64]

    def text_values(self, row: tuple[Any, ...]) -> list[Any]:
        """With --texts, a row's ``text`` and ``texts`` fields (the batch's texts loaded); else none."""
        if self.ctx.texts is None:
            return []
        texts = self.ctx.texts.of(row[ID])
        return [texts[0] if texts else None, json.dumps(texts, ensure_ascii=False)]

    def take(self, batch: Sequence[tuple[Any, ...]], vectors: dict[int, bytes]) -> None:
        line, feature = self.line, self.ctx.features
        by_bytes = self.ctx.shard_bytes is not None
        text: list[str] = []
        sizes: list[int] = []
        for row in batch:
            values = self.values(row)
            if feature is not None:
                values.append(json.dumps(vector_list(vectors[row[ID]], feature.dtype)))
            values += self.text_values(row)
            if by_bytes:  # an estimate, as --shard-bytes has always counted a csv row
                sizes.append(sum(len(str(v)) for v in values) + len(values))
            text.append(line(["" if v is None else v for v in values]))
        self.add_batch(text, sizes)
        self.flush()

    def arrow_ready(self) -> bool:
        """Whether ``take_arrow`` can take this export's rows (no vectors, no byte limit)."""
        return self.ctx.features is None and self.max_bytes is None

    def take_arrow(self, rows: Any) -> None:
        """A batch of rows as Arrow (ROW's columns: dlindex.export.arrow_rows): the same lines
        ``take`` writes, made by Arrow's kernels, cut into shards by count."""
        if self.columnar is None:
            self.columnar = _CsvColumnar(self)
        lines = self.columnar.lines(rows)
        for start, room in self.slices(len(lines)):
            self.opened().write(self.columnar.joined(lines.slice(start, room)))


class _CsvColumnar:
    """``CsvWriter.take``'s lines from Arrow rows: each field as text, joined by commas in C.
    A row with a field ``csv`` would quote (a comma, a quote, a control character: a line
    break among them) or a path the per-row code must make goes through ``take``'s own
    ``csv.writer`` and is put in its place, so every line is the one ``take`` writes."""

    _QUOTED = '[,"\\x00-\\x1f]'  # more than csv.writer quotes (QUOTE_MINIMAL, lines ending in a newline)

    def __init__(self, writer: CsvWriter) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        self.pa, self.pc, self.writer = pa, pc, writer
        ctx = writer.ctx
        self.paths = ArrowPaths(text_prefixes(ctx))
        index, names = ctx.plan.label_index, ctx.plan.labels
        self.label_rows = pa.array(list(index), pa.int64())
        self.label_names = pa.array([names[k] for k in index.values()], pa.string())
        self.label_ids = pa.array([str(k) for k in index.values()], pa.string())

    def lines(self, rows: Any) -> Any:
        pa, pc = self.pa, self.pc
        path, odd = self.paths.joined(rows)
        label = pc.index_in(rows.column("label_row"), value_set=self.label_rows)
        if label.null_count:
            raise ExportError("a selected sample's label is not in the export's class list; nothing was exported")
        name = pc.take(self.label_names, label)
        texts = [pc.fill_null(column, "") for column in (path, name, rows.column("format"), rows.column("xxh3_128"))]
        for text in texts:
            odd = pc.or_(odd, pc.match_substring_regex(text, self._QUOTED))

        def number(column: str) -> Any:
            return pc.fill_null(pc.cast(rows.column(column), pa.string()), "")

        fields = [number("id"), texts[0], texts[1], pc.take(self.label_ids, label), number("width"), number("height"),
                  texts[2], number("bytes"), texts[3], ""]  # fmt: skip
        if self.writer.ctx.texts is not None:
            first, every, odd = self.texts(rows, odd)
            fields += [first, every]
        lines = pc.binary_join_element_wise(pc.binary_join_element_wise(*fields, ","), "\n", "")
        if pc.any(odd).as_py():
            writer = self.writer
            kept = [
                writer.line(["" if v is None else v for v in [*writer.values(row), *writer.text_values(row)]])
                for row in odd_rows(rows, odd)
            ]
            lines = pc.replace_with_mask(lines, odd, pa.array(kept, pa.string()))
        return lines

    def texts(self, rows: Any, odd: Any) -> tuple[Any, Any, Any]:
        """The ``text`` and ``texts`` fields of a batch as ``take`` writes them: the first text
        as it is (a row whose first text csv would quote goes to ``take``), the JSON array (as
        ``json.dumps`` writes it: the texts quoted by json's own C encoder) in quotes, its quotes
        doubled (csv.writer quotes it: it holds quotes), unless it is ``[]``."""
        pa, pc = self.pa, self.pc
        source = self.writer.ctx.texts
        ids = rows.column("id").to_pylist()
        source.load(ids)
        every = [source.of(i) for i in ids]
        quote = _json_text
        first = pa.array([t[0] if t else "" for t in every], pa.string())
        arrays = pa.array([f"[{', '.join(map(quote, t))}]" for t in every], pa.string())
        quoted = pc.binary_join_element_wise('"', pc.replace_substring(arrays, '"', '""'), '"', "")
        shown = pc.if_else(pc.equal(arrays, "[]"), arrays, quoted)
        return first, shown, pc.or_(odd, pc.match_substring_regex(first, self._QUOTED))

    def joined(self, lines: Any) -> bytes:
        """The lines as one piece of UTF-8, joined in C."""
        pa, pc = self.pa, self.pc
        whole = pa.ListArray.from_arrays(pa.array([0, len(lines)], pa.int32()), lines.cast(pa.binary()))
        data: bytes = pc.binary_join(whole, b"")[0].as_py()
        return data


_json_text = json.encoder.encode_basestring  # json.dumps(..., ensure_ascii=False)'s quoting of a str


def write_csv(ctx: Context, group: Group, number: int) -> list[ShardInfo]:
    return fill(CsvWriter(ctx, group, number), group, ctx)
