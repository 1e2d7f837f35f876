"""Every export format in one record: what it writes, how it is read back, what its clients read.

The rest of dlindex asks this registry rather than naming formats: the CLI's ``--format``
choices and help, the default shard sizes, which writer runs, the merge rule, the index
file's name, validate's and verify's per-format checks, which exports ``leaks`` and the
loader can read. Code about one format only (its writer, its reader) names its record
(``WDS.name``). Writers, readers and checks are ``"module:attr"`` references, imported on
first use (``load``): this module imports nothing of dlindex, so the read side (and
``import dlindex.exported.formats``) stays cheap.

Adding a format: write its writer (``(Context, Group, first shard number) -> [ShardInfo]``),
add one ``Format`` to ``FORMATS``, and give it the hooks its layout needs (``names`` and
``finish`` when its files are not ``{split}-{shard:06d}{suffix}`` as written; ``clients``
and ``check_clients`` for keys a client library reads from index.json; ``sink`` when its
writer is a class whose ``take`` encodes a batch, so a pre-split tree is written in one pass).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from typing import Any

Ref = str  # "package.module:attribute", imported when used


@dataclass(frozen=True)
class Format:
    """One export format.

    The hooks' signatures (``Ref`` fields), as run.py, merge.py, describe.py, validate.py and
    verify.py call them:

    - ``writer(ctx, group, number) -> list[ShardInfo]``: one (split, rank) group's shards,
      numbered on from ``number``.
    - ``needs() -> Any``: raises ExportError (before anything is read) when a module the
      writer needs is missing.
    - ``names(split, rank, base, count) -> list[str]``: the names the writer gives a group's
      ``count`` files, its split's earlier groups having written ``base`` shards (merge's
      rule); None: ``{split}-{base + k:06d}{suffix}``, the files of each suffix in turn.
    - ``finish(out, shards, splits, *, world_size, workers, features, shard_bytes, texts) ->
      (shards, files)``: the format's own files once every group is written (export and
      merge alike): the shards as index.json lists them and index.json's ``files`` entries.
    - ``clients(shards, splits, seen, features, shard_bytes, texts) -> tuple``: the values of
      ``client_keys``, in order, as index.json carries them (``texts``: written with ``--texts``).
    - ``check_clients(data, path, listed, version) -> None``: ExportError if those keys of
      a loaded index.json are not what the client may read (``listed``: the files it lists).
    - ``verify(root, index, skip, problem) -> int``: ``--verify``'s reading of the shards
      (samples found), besides sizes and hashes.
    - ``extend(staging, staged, files, delta, shards, splits, generation, *, features,
      shard_bytes) -> (files, renames, replaced)``: ``export --append``'s own files: index.json's
      ``files`` for the export with the appended ``shards`` (all of them), the appended files to
      rename from ``staged/delta`` (the added samples' own export) into the export, and the index
      files it wrote in ``staging`` to replace the export's. None: the format has no such files.
    - ``sink``: the writer's class, ``(ctx, group, number)`` with ``take(batch, vectors)``
      and ``finish() -> list[ShardInfo]``, so that one pass over a pre-split tree can feed
      every split folder's shards at once (dlindex.export.dealing); None: a group at a time.
    """

    name: str
    kind: str  # in words, as --format's help groups the formats
    packed: bool  # the shards carry the image bytes (read at export); else a manifest names the files
    writer: Ref
    suffixes: tuple[str, ...]  # the files of one shard as the export lists them (dali: the list, its manifest)
    shard_size: int | None = None  # samples per shard without --shard-size/--shard-bytes (None: no cut)
    shard_bytes: int | None = None  # bytes per shard without --shard-size/--shard-bytes (None: no cut)
    manifest: str | None = None  # the suffix of its files of one row per sample (reader.manifest_rows)
    ids_file: bool = False  # it lists its sample ids in ids.i64 (finish writes it)
    index: str = "index.json"  # its own index file
    one_pass: bool = True  # the writer reads a group's rows once (dali: twice, lists then manifests)
    halves: bool = False  # one plain file is written in two halves by two processes
    workers: bool = False  # --workers applies: shards per rank a multiple of it
    reader: Ref | None = None  # dlindex's dataset over it (None: only its client reads it)
    client_keys: tuple[str, ...] = ()  # index.json keys its client library reads
    needs: Ref | None = None
    names: Ref | None = None
    finish: Ref | None = None
    clients: Ref | None = None
    check_clients: Ref | None = None
    verify: Ref | None = None
    verified: str = "{files} files, {samples} source images"  # --verify's summary
    sink: Ref | None = None
    extend: Ref | None = None
    texts: bool = True  # it carries each sample's texts (``export --texts``; dlindex.export.texts)

    @property
    def files_per_shard(self) -> int:
        return len(self.suffixes)


_MANIFEST_READER = "dlindex.loader:ManifestDataset"

JSONL = Format(
    "jsonl", "manifests", False, "dlindex.export.manifest:write_jsonl", (".jsonl",), manifest=".jsonl",
    halves=True, reader=_MANIFEST_READER, sink="dlindex.export.jsonl:JsonlWriter",
)  # fmt: skip
CSV = Format(
    "csv", "manifests", False, "dlindex.export.manifest:write_csv", (".csv",), manifest=".csv",
    reader=_MANIFEST_READER, sink="dlindex.export.manifest:CsvWriter",
)  # fmt: skip
PARQUET = Format(
    # pyarrow (so pandas) reads every file of the folder as data except names starting with "_"
    "parquet", "manifests", False, "dlindex.export.parquet:write_parquet", (".parquet",), manifest=".parquet",
    index="_index.json", reader=_MANIFEST_READER, needs="dlindex.export.parquet:pyarrow_modules",
    sink="dlindex.export.parquet:ParquetWriter",
)  # fmt: skip
DALI = Format(
    "dali", "file lists", False, "dlindex.export.dali:write_dali", (".txt", ".jsonl"), manifest=".jsonl",
    one_pass=False, reader=_MANIFEST_READER, texts=False,  # DALI's readers take a file and a label
)  # fmt: skip
WDS = Format(
    "wds", "WebDataset tars", True, "dlindex.export.wds:write_wds", (".tar",), shard_bytes=256 << 20,
    ids_file=True, workers=True, reader="dlindex.loader:WdsDataset", client_keys=("wds",),
    names="dlindex.export.wds:part_names", finish="dlindex.export.wds:finish_wds",
    clients="dlindex.export.wds:recipe_keys", check_clients="dlindex.exported.validate:check_wds_keys",
    verify="dlindex.exported.packed:check_wds", verified="{files} files, {samples} samples in the shards",
    extend="dlindex.export.wds:extend_wds",
)  # fmt: skip
MDS = Format(
    # streaming's own default shard size; its StreamingDataset reads "version" and "shards"
    "mds", "MosaicML Streaming", True, "dlindex.export.mds:write_mds", (".mds",), shard_bytes=64 << 20,
    client_keys=("version", "shards"), names="dlindex.export.mds:shard_files",
    finish="dlindex.export.mds:finish_mds", clients="dlindex.export.mds:streaming_keys",
    check_clients="dlindex.exported.validate:check_streaming_keys",
    verified="{files} files (mds shards: size and checksum only)", extend="dlindex.export.mds:extend_mds",
)  # fmt: skip

# By name, in the order the CLI lists them; the first is the default.
FORMATS: dict[str, Format] = {f.name: f for f in (JSONL, CSV, PARQUET, DALI, WDS, MDS)}
NAMES = tuple(FORMATS)
DEFAULT = JSONL.name
# An export's own index file is one of these (index.index_path looks for them in this order).
INDEX_NAMES = tuple(dict.fromkeys(f.index for f in FORMATS.values()))
# The suffixes of the files reader.manifest_rows reads (dali's lists are not among them).
MANIFEST_SUFFIXES = tuple(dict.fromkeys(f.manifest for f in FORMATS.values() if f.manifest is not None))


def get(name: str) -> Format:
    """The format called ``name``; KeyError if there is none (callers say so in their own words)."""
    return FORMATS[name]


@cache
def load(ref: Ref) -> Any:
    """The object a ``"module:attr"`` reference names, its module imported now."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def listing(names: tuple[str, ...]) -> str:
    """``a, b and c``: format names in a sentence."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
