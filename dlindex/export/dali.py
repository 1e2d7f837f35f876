"""DALI ``readers.file`` file lists: ``relative/path label_id`` per line, relative to ``file_root``.

Each list ``{split}-{shard:06d}.txt`` has a jsonl manifest of the same samples beside it
(``.jsonl``: ids, hashes, sizes), which ``--verify`` and ``dlindex.loader`` read.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from itertools import islice

from dlindex.export.files import HashingFile
from dlindex.export.manifest import write_jsonl
from dlindex.export.plan import ID, LABEL, ExportError, Group, sample_path
from dlindex.export.shards import Context, ShardInfo
from dlindex.export.writer import FileWriter, batches


class DaliWriter(FileWriter[bytes]):
    """File list lines, as bytes: the names exactly as they are on disk."""

    suffix = ".txt"

    def write(self, file: HashingFile, pieces: list[bytes]) -> None:
        file.write(b"".join(pieces))


def write_dali(ctx: Context, group: Group, number: int) -> list[ShardInfo]:
    index = ctx.plan.label_index
    # read twice, lists then manifests: a list, or the plan's spilled rows (read again from disk)
    rows = group.rows if isinstance(group.rows, Collection) else list(group.rows)
    group = replace(group, rows=rows)
    sink = DaliWriter(ctx, group, number)
    for batch, _ in batches(group, replace(ctx, features=None)):
        lines: list[bytes] = []
        for row in batch:
            path = sample_path(row, ctx.prefixes)
            if b"\n" in path or b"\r" in path:
                raise ExportError(f"id {row[ID]}: a DALI file list cannot hold a file name with a line break")
            lines.append(path + b" %d\n" % index[row[LABEL]])
        sink.add_batch(lines, map(len, lines))
        sink.flush()
    lists = sink.finish()
    # The companion manifests: same shard numbers, same samples per file.
    shards = list(lists)
    again = iter(rows)
    for k, shard in enumerate(lists):
        n = shard.samples
        part = replace(group, rows=islice(again, n), padded=0, positions=(), tally=None)
        shards.extend(write_jsonl(replace(ctx, shard_size=n, shard_bytes=None), part, number + k))
    return shards
