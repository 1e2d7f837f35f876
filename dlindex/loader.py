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
import urllib.parse
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import DlindexError
from .export.confine import read_regular, real_inside, resolve_inside
from .export.reader import absolute_paths, listed_shards, load_index, manifest_files, manifest_rows, source_path
from .export.tar import iter_members
from .export.validate import listed_bytes

__all__ = ["ManifestDataset", "MetadataCache", "WdsDataset", "iter_tar", "rank_and_world"]

_METADATA = (
    "SELECT image_metadata.*, labels.name AS label FROM image_metadata "
    "JOIN labels ON labels.id = image_metadata.label_id WHERE image_metadata.id = :id"
)


class MetadataCache:
    """Catalog rows by sample id through an LRU cache (the L1 cache in front of SQLite).

    Opens the catalog read-only, once per process (DataLoader workers each get their own).
    """

    def __init__(self, catalog: str | os.PathLike[str], maxsize: int = 65536) -> None:
        self.catalog = os.fspath(catalog)
        self.maxsize = maxsize
        self._pid = -1
        self._conn: sqlite3.Connection | None = None
        self.get = lru_cache(maxsize=maxsize)(self._lookup)

    def _lookup(self, sample_id: int) -> dict[str, Any] | None:
        if self._conn is None or self._pid != os.getpid():
            uri = "file:" + urllib.parse.quote(os.path.abspath(self.catalog)) + "?mode=ro"
            try:
                self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
            except sqlite3.Error as e:
                raise DlindexError(f"cannot open catalog {self.catalog}: {e}") from None
            self._conn.row_factory = sqlite3.Row
            self._pid = os.getpid()
        row = self._conn.execute(_METADATA, {"id": sample_id}).fetchone()
        return dict(row) if row is not None else None

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


class ManifestDataset:
    """Map-style dataset over a manifest export: ``dataset[i]`` -> ``(image, label)``.

    Args:
        split, rank: only these shards (default: all).
        decode: Pillow-decode (converted to ``mode``); False gives the file's bytes.
        catalog: for ``metadata(i)``; default the catalog named in index.json.
    """

    def __init__(
        self, out_dir: str | os.PathLike[str], split: str | None = None, rank: int | None = None, *,
        transform: Callable[[Any], Any] | None = None, decode: bool = True, mode: str | None = "RGB",
        catalog: str | os.PathLike[str] | None = None, cache_size: int = 65536,
    ) -> None:  # fmt: skip
        self.out_dir = Path(out_dir)
        self.index = load_index(out_dir)
        self.classes = [self.index["labels"][str(k)] for k in range(len(self.index["labels"]))]
        files = manifest_files(self.index, split, rank)
        if not files:
            raise DlindexError(f"{out_dir}: no manifest shards for split {split!r}, rank {rank!r} (a wds or mds export? use WdsDataset)")
        self.paths: list[bytes] = []
        self.labels = array.array("l")
        self.ids = array.array("q")
        self.sizes = array.array("q")  # -1: the manifest records no size
        sizes = listed_bytes(listed_shards(self.index), [])
        self.root = os.fsencode(self.index["file_root"])
        for name in files:
            for row in manifest_rows(
                self.out_dir, name, max_bytes=sizes.get(name), classes=len(self.classes),
                absolute_paths=absolute_paths(self.index),
            ):
                self.paths.append(source_path(self.index, row["path"]))
                self.labels.append(row["label_id"])
                self.ids.append(row["id"])
                self.sizes.append(-1 if row.get("bytes") is None else row["bytes"])
        self.transform = transform
        self.decode = decode
        self.mode = mode
        self.cache = MetadataCache(catalog or self.index["catalog"]["path"], cache_size)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        size = self.sizes[i]
        try:
            data = read_regular(real_inside(self.paths[i], self.root), None if size < 0 else size)
        except OSError as e:
            raise DlindexError(f"{os.fsdecode(self.paths[i])}: {e.strerror}; the export's source is gone (see dlindex export --verify)") from None
        image: Any = _decode(data, self.mode) if self.decode else data
        if self.transform is not None:
            image = self.transform(image)
        return image, self.labels[i]

    def metadata(self, i: int) -> dict[str, Any] | None:
        """The catalog's row for sample i (cached; None if the catalog no longer has it)."""
        return self.cache.get(self.ids[i])


def iter_tar(
    path: str | os.PathLike[str], keep: Callable[[int], bool] | None = None, *, max_bytes: int | None = None
) -> Iterator[dict[str, Any]]:
    """Samples of a WebDataset tar: ``{"__key__": key, ext: bytes, ...}``, grouped by key.

    ``keep(n)`` decides whether the n-th sample of the file is read; others are seeked over.
    The tar must be a regular file of at most ``max_bytes``; a damaged or truncated one
    raises ExportError naming it (``dlindex.export.tar``).
    """
    sample: dict[str, Any] = {}
    key: bytes | None = None
    n = -1
    wanted = True
    for name, read in iter_members(path, max_bytes):
        stem, dot, ext = name.rpartition(b"/")[2].partition(b".")
        member_key = name[: len(name) - len(ext) - len(dot)]
        if member_key != key:
            if sample:
                yield sample
            key, sample, n = member_key, {}, n + 1
            wanted = keep is None or keep(n)
            if wanted:
                sample["__key__"] = member_key.decode("utf-8", "surrogateescape")
        if wanted:
            sample[ext.decode("utf-8", "surrogateescape")] = read()
    if sample:
        yield sample


class WdsDataset:
    """Iterable dataset over a ``wds`` export's shards: ``(image, label)`` per sample.

    Shards go to ranks (an export made with the same ``--world-size`` keeps its own rank
    assignment; otherwise shard i goes to rank i mod W), then to DataLoader workers; when a
    rank has fewer shards than workers, each worker reads every shard but only every K-th
    sample. ``shuffle_shards`` reorders shards per epoch (``set_epoch``) with ``seed``.
    """

    _torch_class: type | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> WdsDataset:
        base = _torch_iterable()
        if base is not None and not issubclass(cls, base):
            if cls._torch_class is None or cls._torch_class.__mro__[1] is not cls:
                cls._torch_class = type(cls.__name__, (cls, base), {"__module__": cls.__module__})
            cls = cls._torch_class
        return object.__new__(cls)

    def __init__(
        self, out_dir: str | os.PathLike[str], split: str | None = None, *, rank: int | None = None,
        world_size: int | None = None, transform: Callable[[Any], Any] | None = None, decode: bool = True,
        mode: str | None = "RGB", with_metadata: bool = False, shuffle_shards: bool = False, seed: int = 0,
    ) -> None:  # fmt: skip
        self._args = dict(
            out_dir=out_dir, split=split, rank=rank, world_size=world_size, transform=transform, decode=decode,
            mode=mode, with_metadata=with_metadata, shuffle_shards=shuffle_shards, seed=seed,
        )  # fmt: skip
        self.out_dir = Path(out_dir)
        self.index = load_index(out_dir)
        if self.index.get("format") != "wds":
            raise DlindexError(f"{out_dir} is a {self.index.get('format')} export; WdsDataset reads wds exports")
        self.classes = [self.index["labels"][str(k)] for k in range(len(self.index["labels"]))]
        self.shards = [s for s in listed_shards(self.index) if split is None or s["split"] == split]
        if not self.shards:
            raise DlindexError(f"{out_dir}: no shards for split {split!r}")
        self.rank, self.world_size = rank, world_size
        self.transform, self.decode, self.mode = transform, decode, mode
        self.with_metadata, self.shuffle_shards, self.seed = with_metadata, shuffle_shards, seed
        self.epoch = 0

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._args, self.epoch))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def rank_shards(self) -> list[dict[str, Any]]:
        """The shards this process's rank reads."""
        rank, world = rank_and_world(self.rank, self.world_size)
        if self.index["options"].get("world_size", 1) == world:
            mine = [s for s in self.shards if s["rank"] == rank]
        else:
            mine = [s for i, s in enumerate(self.shards) if i % world == rank]
        if self.shuffle_shards:
            import random

            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(mine)
        return mine

    def __len__(self) -> int:
        """Samples this rank reads per epoch (all workers together)."""
        return sum(s["samples"] for s in self.rank_shards())

    def __iter__(self) -> Iterator[Any]:
        worker, workers = _worker()
        shards = self.rank_shards()
        plan: list[tuple[dict[str, Any], int | None]]
        if len(shards) >= workers:
            plan = [(s, None) for i, s in enumerate(shards) if i % workers == worker]
        else:
            plan = [(s, workers) for s in shards]
        for shard, stride in plan:
            keep = None if stride is None else (lambda n, k=stride: n % k == worker)
            path = resolve_inside(os.fsencode(self.out_dir), shard["file"], what="shard")
            for sample in iter_tar(path, keep, max_bytes=shard["bytes"]):
                yield self._item(sample)

    def _item(self, sample: dict[str, Any]) -> Any:
        key = sample.pop("__key__")
        cls = sample.pop("cls", b"")
        meta = sample.pop("json", None)
        data = next((v for k, v in sample.items() if k != "npy"), None)
        label = int(cls) if cls.isdigit() and len(cls) < 10 else -1
        if data is None or not 0 <= label < len(self.classes):
            raise DlindexError(f"{self.out_dir}: sample {key!r} has no image or no valid .cls member (see dlindex export --verify)")
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
            return image, label, info
        return image, label


def _rebuild(args: dict[str, Any], epoch: int) -> WdsDataset:
    dataset = WdsDataset(**args)
    dataset.epoch = epoch
    return dataset


def _torch_iterable() -> type | None:
    try:
        from torch.utils.data import IterableDataset
    except ImportError:
        return None
    return IterableDataset
