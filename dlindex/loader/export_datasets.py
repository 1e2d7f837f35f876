"""Reading an export back in a training job: PyTorch-compatible datasets, torch optional.

    from dlindex.loader import ManifestDataset, WdsDataset
    train = WdsDataset("shards/", split="train", transform=to_tensor)   # iterable, sharded
    loader = torch.utils.data.DataLoader(train, batch_size=256, num_workers=8)

``ManifestDataset`` is map-style (``len``/``[i]``) over a manifest export (jsonl, csv,
parquet, dali): it reads each source file when asked. ``WdsDataset`` iterates over the
tar shards of a ``wds`` export, split by rank and by DataLoader worker, reading each
shard sequentially. Both yield ``(image, label)``: the image decoded with Pillow (or the
raw bytes with ``decode=False``) and passed through ``transform``; ``label`` is the class
index (``dataset.classes[label]`` is its name). torch is imported only when a dataset is
created and torch is installed, to make ``WdsDataset`` a ``torch.utils.data.IterableDataset``.
"""

from __future__ import annotations

import array
import io
import json
import os
import sqlite3
import sys
import warnings
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from itertools import accumulate
from pathlib import Path
from typing import Any

from dlindex.errors import DlindexError
from dlindex.exported.appended import generation, keeps, removed_ids
from dlindex.exported.confine import read_regular, real_inside, resolve_inside
from dlindex.exported.formats import WDS
from dlindex.exported.index import listed_shards
from dlindex.exported.reader import absolute_paths, exact_path, load_index, manifest_files, manifest_rows, source_path
from dlindex.exported.tar import NOT_IMAGE, iter_tar
from dlindex.exported.validate import listed_bytes
from dlindex.loader.torch_optional import TorchOptionalIterable

__all__ = ["ManifestDataset", "MetadataCache", "WdsDataset", "iter_tar", "rank_and_world"]

_METADATA = (
    "SELECT image_metadata.*, labels.name AS label FROM image_metadata "
    "LEFT JOIN labels ON labels.id = image_metadata.label_id WHERE image_metadata.id = :id"
)


class MetadataCache:
    """Catalog rows by sample id through an LRU cache (the L1 cache in front of SQLite).

    Opens the catalog read-only, once per process (DataLoader workers each get their own).
    """

    def __init__(self, catalog: str | os.PathLike[str], maxsize: int = 65536) -> None:
        self.catalog = os.fspath(catalog)  # a file, or a postgresql:// URL
        self.maxsize = maxsize
        self._pid = -1
        self._conn: Any = None
        self.get = lru_cache(maxsize=maxsize)(self._lookup)

    def _lookup(self, sample_id: int) -> dict[str, Any] | None:
        if self._conn is None or self._pid != os.getpid():
            from dlindex.catalog.connection import connect_reader  # mode=ro (or immutable=1), or a server

            try:
                self._conn = connect_reader(self.catalog, timeout=30, any_thread=True)
            except sqlite3.Error as e:
                raise DlindexError(f"cannot open catalog {self.catalog}: {e}") from None
            self._pid = os.getpid()
        cursor = self._conn.execute(_METADATA, {"id": sample_id})
        row = cursor.fetchone()
        return dict(zip((d[0] for d in cursor.description), row, strict=True)) if row is not None else None

    def __getstate__(self) -> dict[str, Any]:
        return {"catalog": self.catalog, "maxsize": self.maxsize}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["catalog"], state["maxsize"])  # type: ignore[misc]


def rank_and_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """This process's rank and the world size: as given, else torch.distributed, else $RANK/$WORLD_SIZE."""
    if rank is not None and world_size is not None:
        return rank, world_size
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        found = dist.get_rank(), dist.get_world_size()
    else:
        found = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    return (found[0] if rank is None else rank), (found[1] if world_size is None else world_size)


def _worker() -> tuple[int, int]:
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return (info.id, info.num_workers) if info is not None else (0, 1)


def _decode(data: bytes, mode: str | None) -> Any:
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    return image.convert(mode) if mode else image


class SourceMissingError(DlindexError, FileNotFoundError):
    """A manifest's source file is not there (moved? pass ``root=``); also a FileNotFoundError."""


class ManifestDataset:
    """Map-style dataset over a manifest export: ``dataset[i]`` -> ``(image, label)``.

    Args:
        split, rank: only these shards (default: all).
        decode: Pillow-decode (converted to ``mode``); False gives the file's bytes.
        catalog: for ``metadata(i)``; default the catalog named in index.json.
        root: where the image tree is now, if it moved since the export (default: index.json's
            ``file_root``); manifest paths are relative to it.
    """

    def __init__(
        self, out_dir: str | os.PathLike[str], split: str | None = None, rank: int | None = None, *,
        transform: Callable[[Any], Any] | None = None, decode: bool = True, mode: str | None = "RGB",
        catalog: str | os.PathLike[str] | None = None, cache_size: int = 65536,
        root: str | os.PathLike[str] | None = None,
    ) -> None:  # fmt: skip
        self.out_dir = Path(out_dir)
        self.index = load_index(out_dir)
        # Every path is confined to this folder (its text, then its real path on open):
        # root= when the tree moved, else index.json's file_root.
        self.root = os.fsencode(_check_root(root) or self.index["file_root"])
        self.classes = [self.index["labels"][str(k)] for k in range(len(self.index["labels"]))]
        files = manifest_files(self.index, split, rank)
        if not files:
            raise DlindexError(
                f"{out_dir}: no manifest shards for split {split!r}, rank {rank!r} (a wds or mds export? use WdsDataset)"
            )
        self.paths: list[bytes] = []
        self.labels = array.array("l")
        self.ids = array.array("q")
        self.sizes = array.array("q")  # -1: the manifest records no size
        sizes = listed_bytes(listed_shards(self.index), [])
        generations = {s["file"]: generation(s) for s in listed_shards(self.index)}
        removed = removed_ids(self.out_dir, self.index)  # copies an export --append replaced or removed
        for name in files:
            for row in manifest_rows(
                self.out_dir,
                name,
                max_bytes=sizes.get(name),
                classes=len(self.classes),
                absolute_paths=absolute_paths(self.index),
            ):
                if removed and not keeps(removed, generations.get(name, 0), row["id"]):
                    continue
                self.paths.append(source_path(self.index, row["path"], self.root))
                self.labels.append(row["label_id"])
                self.ids.append(row["id"])
                self.sizes.append(-1 if row.get("bytes") is None else row["bytes"])
        self.transform = transform
        self.decode = decode
        self.mode = mode
        self.cache = MetadataCache(catalog or self.index["catalog"]["path"], cache_size)
        self._class_of = {name: k for k, name in enumerate(self.classes)}

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        size = self.sizes[i]
        try:
            data = read_regular(real_inside(self.paths[i], self.root, folder_links=True), None if size < 0 else size)
        except OSError as e:
            kind = SourceMissingError if isinstance(e, FileNotFoundError) else DlindexError
            raise kind(
                f"{os.fsdecode(self.paths[i])}: {e.strerror}; the export's source is gone (see dlindex export --verify)"
            ) from None
        image: Any = _decode(data, self.mode) if self.decode else data
        if self.transform is not None:
            image = self.transform(image)
        return image, self.labels[i]

    def metadata(self, i: int) -> dict[str, Any] | None:
        """The catalog's row for sample i (cached; None if the catalog no longer has it).

        ``label_id`` is the index of the row's label in ``self.classes`` (None if the export
        has no such class), as in the manifest and ``dlindex query``.
        """
        row = self.cache.get(self.ids[i])
        if row is None:
            return None
        row = dict(row)  # the cached dict stays as the catalog gave it
        del row["label_id"]  # the internal labels.id, never shown as label_id
        row["label_id"] = self._class_of.get(row["label"])
        return row


class WdsDataset(TorchOptionalIterable):
    """Iterable dataset over a ``wds`` export's shards: ``(image, label)`` per sample.

    Shards go to ranks, then to DataLoader workers. An export made with the same
    ``--world-size`` keeps its own rank assignment; with another world size every rank reads
    one contiguous block of the split's samples, all blocks the same size (the remainder
    dropped or padded with repeats, as the export's ``--drop-last``/``--pad`` chose; padded when
    dropping would leave a rank nothing), and a warning says so once. When a rank has fewer
    shards than workers, each worker reads every shard but only every K-th sample.
    ``shuffle_shards`` reorders shards per epoch (``set_epoch``) with ``seed``.
    ``root`` (where the image tree is now) only changes ``with_metadata``'s ``file``.
    """

    def __init__(
        self, out_dir: str | os.PathLike[str], split: str | None = None, *, rank: int | None = None,
        world_size: int | None = None, transform: Callable[[Any], Any] | None = None, decode: bool = True,
        mode: str | None = "RGB", with_metadata: bool = False, shuffle_shards: bool = False, seed: int = 0,
        root: str | os.PathLike[str] | None = None,
    ) -> None:  # fmt: skip
        self._args = dict(
            out_dir=out_dir, split=split, rank=rank, world_size=world_size, transform=transform, decode=decode,
            mode=mode, with_metadata=with_metadata, shuffle_shards=shuffle_shards, seed=seed, root=root,
        )  # fmt: skip
        self.out_dir = Path(out_dir)
        self.index = load_index(out_dir)
        if self.index.get("format") != WDS.name:
            raise DlindexError(f"{out_dir} is a {self.index.get('format')} export; WdsDataset reads wds exports")
        self.classes = [self.index["labels"][str(k)] for k in range(len(self.index["labels"]))]
        self.shards = [s for s in listed_shards(self.index) if split is None or s["split"] == split]
        self.removed = removed_ids(self.out_dir, self.index)  # copies an export --append replaced or removed
        if not self.shards:
            raise DlindexError(f"{out_dir}: no shards for split {split!r}")
        self.rank, self.world_size = rank, world_size
        self.transform, self.decode, self.mode = transform, decode, mode
        self.with_metadata, self.shuffle_shards, self.seed = with_metadata, shuffle_shards, seed
        self.root = _check_root(root)
        self.epoch = 0
        self.export_world = int(self.index["options"].get("world_size", 1))
        self.drop_last = bool(self.index["options"].get("drop_last", False))
        _, world = rank_and_world(rank, world_size)
        if world != self.export_world:
            total = sum(s["samples"] for s in self.shards)
            per, how = _share(total, world, self.drop_last)
            warnings.warn(
                f"{out_dir} was exported for world size {self.export_world}, read with {world}: each rank "
                f"reads a block of {per} of the {total} samples ({how})",
                stacklevel=2,
            )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._args, self.epoch))

    def set_epoch(self, epoch: int) -> None:
        """The epoch to shuffle shards for; an export appended to since is read from this epoch on."""
        if load_index(self.out_dir) != self.index:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # said once, when the dataset was made
                self.__init__(**self._args)  # type: ignore[misc]
        self.epoch = epoch

    def rank_shards(self) -> list[dict[str, Any]]:
        """The shards this process's rank reads (in part, when the world size is not the export's)."""
        seen: dict[str, dict[str, Any]] = {}
        for shard, _, _ in self.rank_segments():
            seen.setdefault(shard["file"], shard)
        return list(seen.values())

    def rank_segments(self) -> list[tuple[dict[str, Any], int, int]]:
        """(shard, first, end) sample ranges this rank reads, in order."""
        rank, world = rank_and_world(self.rank, self.world_size)
        if not 0 <= rank < world:
            raise DlindexError(f"rank {rank} is not in a world of size {world}")
        if world == self.export_world:
            mine = [(s, 0, s["samples"]) for s in self.shards if s["rank"] == rank]
        else:
            mine = _block(self.shards, world, rank, self.drop_last)
        if self.shuffle_shards:
            import random

            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(mine)
        return mine

    def __len__(self) -> int:
        """Samples this rank reads per epoch (all workers together)."""
        return sum(end - first for _, first, end in self.rank_segments())

    def __iter__(self) -> Iterator[Any]:
        worker, workers = _worker()
        segments = self.rank_segments()
        plan: list[tuple[tuple[dict[str, Any], int, int], int | None]]
        if len(segments) >= workers:
            plan = [(seg, None) for i, seg in enumerate(segments) if i % workers == worker]
        else:
            plan = [(seg, workers) for seg in segments]
        for (shard, first, end), stride in plan:

            def keep(n: int, first: int = first, end: int = end, stride: int | None = stride) -> bool:
                return first <= n < end and (stride is None or (n - first) % stride == worker)

            path = resolve_inside(os.fsencode(self.out_dir), shard["file"], what="shard")
            made = generation(shard)
            for sample in iter_tar(path, keep, stop=end, max_bytes=shard["bytes"]):
                if self.removed and not keeps(self.removed, made, _key_id(sample.get("__key__"))):
                    continue
                yield self._item(sample)

    def _item(self, sample: dict[str, Any]) -> Any:
        key = sample.pop("__key__")
        cls = sample.pop("cls", b"")
        meta = sample.pop("json", None)
        data = next((v for k, v in sample.items() if k not in NOT_IMAGE), None)
        label = int(cls) if cls.isdigit() and len(cls) < 10 else -1
        if data is None or not 0 <= label < len(self.classes):
            raise DlindexError(
                f"{self.out_dir}: sample {key!r} has no image or no valid .cls member (see dlindex export --verify)"
            )
        info: dict[str, Any] = {}
        if self.with_metadata and meta:
            try:
                info = json.loads(meta)
            except (ValueError, RecursionError):
                raise DlindexError(f"{self.out_dir}: sample {key!r} has a damaged .json member") from None
            if not isinstance(info, dict):
                raise DlindexError(f"{self.out_dir}: sample {key!r} has a .json member that is not an object")
        image: Any = _decode(data, self.mode) if self.decode else data
        if self.transform is not None:
            image = self.transform(image)
        if self.with_metadata:
            info["__key__"] = key
            if isinstance(info.get("path"), str):
                b64 = info.get("path_b64")
                exact = exact_path(info["path"], b64 if isinstance(b64, str) else None)
                info["file"] = os.fsdecode(source_path(self.index, exact, self.root))
            return image, label, info
        return image, label


def _key_id(key: Any) -> int:
    text = key.decode() if isinstance(key, bytes) else str(key)
    digits = text.partition("_")[0]  # a --pad repeat's key is ID_POSITION
    return int(digits) if digits.isdigit() else -1


def _share(total: int, world: int, drop_last: bool) -> tuple[int, str]:
    """Samples per rank for ``total`` over ``world`` ranks, and what happened to the remainder."""
    if total % world == 0:
        return total // world, "an even split"
    if drop_last and total >= world:
        return total // world, f"{total % world} dropped, as the export's --drop-last did"
    per = -(-total // world)
    why = "dropping would leave a rank nothing" if drop_last else "as the export's --pad did"
    return per, f"{per * world - total} repeated to pad, {why}"


def _block(
    shards: Sequence[dict[str, Any]], world: int, rank: int, drop_last: bool
) -> list[tuple[dict[str, Any], int, int]]:
    """Rank ``rank``'s contiguous block of the shards' samples, as (shard, first, end) ranges;
    positions past the end wrap around to the first samples (padding)."""
    total = sum(s["samples"] for s in shards)
    if not total:
        return []
    per, _ = _share(total, world, drop_last)
    starts = [0, *accumulate(s["samples"] for s in shards)]
    out: list[tuple[dict[str, Any], int, int]] = []
    pos, end = rank * per, (rank + 1) * per
    while pos < end:
        p = pos % total
        i = bisect_right(starts, p) - 1
        first = p - starts[i]
        take = min(shards[i]["samples"] - first, end - pos)
        out.append((shards[i], first, first + take))
        pos += take
    return out


def _check_root(root: str | os.PathLike[str] | None) -> str | os.PathLike[str] | None:
    if root is not None and not os.path.isdir(root):
        raise DlindexError(f"root {os.fsdecode(root)!r} is not a folder")
    return root


def _rebuild(args: dict[str, Any], epoch: int) -> WdsDataset:
    with warnings.catch_warnings():  # said once, where the dataset was made, not in every worker
        warnings.simplefilter("ignore")
        dataset = WdsDataset(**args)
    dataset.epoch = epoch
    return dataset
