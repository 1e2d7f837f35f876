"""DALI ``readers.file`` file lists: ``relative/path label_id`` per line, relative to ``file_root``.

Each list ``{split}-{shard:06d}.txt`` has a jsonl manifest of the same samples beside it
(``.jsonl``: ids, hashes, sizes), which ``--verify`` and ``dlindex.loader`` read.
"""

from __future__ import annotations

from dataclasses import replace

from dlindex.export.files import HashingFile
from dlindex.export.manifest import batches, write_jsonl
from dlindex.export.plan import ID, LABEL, ExportError, Group, sample_path
from dlindex.export.shards import Context, Cutter, ShardInfo, shard_name


def write_dali(ctx: Context, group: Group, number: int) -> list[ShardInfo]:
    index = ctx.plan.label_index
    rows = group.rows if isinstance(group.rows, list) else list(group.rows)  # read twice: lists, then manifests
    group = replace(group, rows=rows)
    cut = Cutter(ctx.shard_size, ctx.shard_bytes)
    shards: list[ShardInfo] = []
    out: HashingFile | None = None
    count = size = first = 0
    cuts: list[int] = []  # sample counts per list: the manifests are cut the same way
    for batch, _ in batches(group, replace(ctx, features=None)):
        lines: list[bytes] = []
        for row in batch:
            path = sample_path(row, ctx.prefixes)
            if b"\n" in path or b"\r" in path:
                raise ExportError(f"id {row[ID]}: a DALI file list cannot hold a file name with a line break")
            line = path + b" %d\n" % index[row[LABEL]]
            if out is not None and cut.full(count, size, len(line)):
                out.write(b"".join(lines))
                lines = []
                shards.append(_close(out, group, count, first))
                cuts.append(count)
                out = None
            if out is None:
                out = HashingFile(ctx.out / shard_name(group.split, number + len(shards), ".txt"))
                first += count
                count = size = 0
            lines.append(line)
            count += 1
            size += len(line)
        if out is not None:
            out.write(b"".join(lines))
    if out is not None:
        shards.append(_close(out, group, count, first))
        cuts.append(count)
    # The companion manifests: same shard numbers, same samples per file.
    start = 0
    for k, n in enumerate(cuts):
        part = replace(group, rows=rows[start : start + n], padded=0, positions=(), tally=None)
        shards.extend(write_jsonl(replace(ctx, shard_size=n, shard_bytes=None), part, number + k))
        start += n
    return shards


def _close(out: HashingFile, group: Group, count: int, first: int) -> ShardInfo:
    digest = out.close()
    return ShardInfo(out.path.name, group.split, group.rank, count, out.bytes, digest, first)
