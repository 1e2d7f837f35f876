"""``export --texts``: each sample's texts (dlindex.catalog.texts) in a manifest's rows.

Two fields after the sample's own: ``text``, its first text (by source name, then its place in
the source; null without one), what a caption column of HF ``load_dataset`` or a CLIP loader
reads; and ``texts``, all of them in that order (a list; in csv a JSON array). The packed
formats put both in each sample's metadata JSON and the first text where their clients look
for a caption too: wds a ``{key}.txt`` member (as img2dataset writes it), mds a ``text`` str
column (empty without one). Fetched a batch at a time beside the rows (``load``), so memory is
one batch's texts. dali's file lists carry no texts (its readers take a file and a label).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from dlindex.catalog.texts import TEXT_BODIES_OF, grouped_texts
from dlindex.export.plan import ExportError
from dlindex.exported.formats import FORMATS

# A batch of dense ids (an export in id order) reads its span in one range of the index, in
# index order, instead of a seek per id (10^6 rows of a 10^7 catalog: 0.65x -> see benchmarks).
_TEXTS_IN = """SELECT image_id, text FROM image_texts WHERE image_id BETWEEN :low AND :high
    ORDER BY image_id, source, seq"""
_quote = json.encoder.encode_basestring


@dataclass
class TextSource:
    """The texts of the batch being written, by sample id. ``read`` is a connection's execute: a
    batch's texts are one short statement, read in C (the query log's per-row generator cost
    ~1 us a row, a third of what the texts add to a manifest)."""

    read: Callable[[str, dict[str, Any]], Iterable[tuple[Any, ...]]]
    current: dict[int, list[str]] = field(default_factory=dict)

    def load(self, ids: list[int]) -> None:
        low, high = min(ids, default=0), max(ids, default=-1)
        if high - low < 2 * len(ids):
            rows = self.read(_TEXTS_IN, {"low": low, "high": high})
        else:
            rows = self.read(TEXT_BODIES_OF, {"ids": json.dumps(ids)})
        self.current = grouped_texts(rows)

    def of(self, ident: int) -> list[str]:
        return self.current.get(ident, [])


def text_source(read: Callable[[str, dict[str, Any]], Iterable[tuple[Any, ...]]], fmt: str, at: object) -> TextSource:
    """The texts of an export of format ``fmt``; ExportError where they cannot go yet."""
    carriers = [name for name, record in FORMATS.items() if record.texts]
    if fmt not in carriers:
        raise ExportError(f"--texts goes into {', '.join(carriers)} exports; {fmt} file lists carry no texts")
    if at is not None:
        raise ExportError("--texts exports the texts as they are now (texts keep no history yet): not with --at")
    return TextSource(read)


def json_fields(texts: list[str]) -> str:
    """``,"text":...,"texts":[...]``: the two fields as a jsonl line (and a packed sample's JSON) writes them."""
    quoted = list(map(_quote, texts))  # each text quoted once: the first is written twice
    return f',"text":{quoted[0] if quoted else "null"},"texts":[{",".join(quoted)}]'
