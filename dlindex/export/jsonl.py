"""jsonl manifest shards: the line encoder (shared with the second process) and their writer."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

from dlindex.export.dealing import partition
from dlindex.export.files import drain_into
from dlindex.export.plan import ID, LABEL, Group
from dlindex.export.shards import Context, json_maker, text_prefixes, vector_list
from dlindex.export.texts import json_fields
from dlindex.export.writer import TextWriter


def jsonl_lines(ctx: Context) -> Callable[[Sequence[tuple[Any, ...]], dict[int, bytes]], list[str]]:
    """A function from a batch of rows (and their vectors) to its jsonl lines."""
    make = json_maker(ctx)
    feature = ctx.features
    texts = text_prefixes(ctx)
    quote = json.encoder.encode_basestring
    names = ctx.plan.labels
    parts = {i: f'"label":{quote(names[k])},"label_id":{k}' for i, k in ctx.plan.label_index.items()}

    def lines(batch: Sequence[tuple[Any, ...]], vectors: dict[int, bytes]) -> list[str]:
        if feature is not None:
            return [make(row)[:-1] + _more(row, vectors) + "}\n" for row in batch]
        # The common row (UTF-8 name under a UTF-8 root, no NULLs) inline: this loop is the
        # whole cost of a million-row manifest next to SQLite's own.
        out: list[str] = []
        append = out.append
        of = None if ctx.texts is None else ctx.texts.of
        for row in batch:
            ident, root, name, raw, label, width, height, fmt, size, digest = row
            prefix = texts.get(root)
            end = "}\n" if of is None else json_fields(of(ident)) + "}\n"
            if (prefix is None or raw is not None or fmt is None or digest is None or width is None
                    or height is None or size is None):  # fmt: skip
                append(make(row)[:-1] + end)
            else:
                append(
                    f'{{"id":{ident},"path":{quote(prefix + name)},{parts[label]},"width":{width},'
                    f'"height":{height},"format":"{fmt}","bytes":{size},"xxh3_128":"{digest}","path_b64":""' + end
                )
        return out

    def _more(row: tuple[Any, ...], vectors: dict[int, bytes]) -> str:
        more = "" if feature is None else ',"feature":' + json.dumps(vector_list(vectors[row[ID]], feature.dtype))
        return more if ctx.texts is None else more + json_fields(ctx.texts.of(row[ID]))

    return lines


def deal(
    batch: Sequence[tuple[Any, ...]], text: list[str], splits: Sequence[str], names: Sequence[str]
) -> tuple[dict[str, Sequence[str]], Counter[tuple[str, Any]]]:
    """A batch's lines dealt to their ``splits`` (each row's, one of ``names``; dealing.Dealing
    gives them), in order, with the (split, catalog label id) counts."""
    out: dict[str, Sequence[str]] = {name: [] for name in names}
    parts = partition(text, splits, names)
    out.update(parts)
    if len(parts) == 1:  # a batch of one split: most, in a tree's id order
        counts = Counter(map(itemgetter(LABEL), batch))
        return out, Counter({(parts[0][0], label): n for label, n in counts.items()})
    return out, Counter(zip(splits, map(itemgetter(LABEL), batch), strict=True))


def text_sizes(lines: Sequence[str]) -> Iterator[int]:
    """The encoded size of each line, as ``--shard-bytes`` counts it (lazily: only it needs them)."""
    return (len(text) if text.isascii() else len(text.encode("utf-8", "surrogateescape")) for text in lines)


class JsonlWriter(TextWriter):
    """One JSON object per line, valid UTF-8; a path that is not UTF-8 keeps its bytes in path_b64."""

    suffix = ".jsonl"
    positional = False  # jsonl_lines unpacks a row of ROW's length

    def __init__(self, ctx: Context, group: Group, number: int) -> None:
        super().__init__(ctx, group, number)
        self.lines = jsonl_lines(ctx)

    def take(self, batch: Sequence[tuple[Any, ...]], vectors: dict[int, bytes]) -> None:
        text = self.lines(batch, vectors)
        self.add_batch(text, text_sizes(text))
        self.flush()

    def append_file(self, path: Path, count: int) -> None:
        """Append lines another process wrote (``count`` samples) to the open shard."""
        self.flush()
        drain_into(path, self.opened().write)  # the part's blocks freed as they are copied
        self.count += count
