"""Where an epoch's bytes come from: loose files by catalog path, or a dlindex wds export's shards.

Either source reads a window of samples in its storage order (file neighbours, shard
members front to back) and hands them back in the order asked. An export is used only for
samples whose member still matches the catalog's hash; the others are read from their files.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Generator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import xxhash

from dlindex.errors import DlindexError
from dlindex.exported.confine import read_regular, resolve_inside
from dlindex.exported.formats import WDS
from dlindex.exported.ids import wds_ids
from dlindex.exported.index import listed_shards
from dlindex.exported.reader import load_index
from dlindex.exported.tar import NOT_IMAGE, iter_members
from dlindex.loader.selection import Selection, pick

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.loader.row_cache import RowCache

Ints = npt.NDArray[np.int64]
MAX_SAMPLE_BYTES = 1 << 30  # one image file; a larger one is refused before it is read
FILE_RUN = 16  # neighbouring files read as one chunk: locality, while batches still mix classes
Read = bytes | str  # the bytes, or why they could not be read


@dataclass(frozen=True)
class WdsExport:
    """A wds export, as far as the loader needs it: shard files and the id of every member."""

    out_dir: str
    shards: tuple[tuple[bytes, int], ...]  # (confined path, byte size) in index order
    starts: Ints  # export position of each shard's first member
    ids: Ints  # sample id of every export position
    splits: tuple[str, ...] = ()  # each shard's split (export --split), in index order

    @classmethod
    def open(cls, out_dir: str | os.PathLike[str]) -> WdsExport:
        index = load_index(out_dir)
        if index.get("format") != WDS.name:
            raise DlindexError(f"{os.fsdecode(out_dir)} is a {index.get('format')} export, not wds")
        ids = wds_ids(out_dir, index)
        if ids is None:
            raise DlindexError(f"{os.fsdecode(out_dir)} has no ids.i64 (written since 0.2); export it again")
        base = os.fsencode(out_dir)
        listed = listed_shards(index)
        shards = tuple((resolve_inside(base, s["file"], what="shard"), int(s["bytes"])) for s in listed)
        starts = np.cumsum([0] + [int(s["samples"]) for s in listed[:-1]], dtype=np.int64)
        splits = tuple(str(s.get("split", "")) for s in listed)
        return cls(os.fsdecode(out_dir), shards, starts, np.frombuffer(ids, dtype=np.int64), splits)

    def split_ids(self, names: tuple[str, ...]) -> Ints:
        """The ids of the samples in the export's splits ``names``; refuses one it does not have."""
        have = tuple(dict.fromkeys(self.splits))
        unknown = [n for n in names if n not in have]
        if unknown:
            raise DlindexError(f"{self.out_dir} has no split {unknown[0]!r}; its splits are: {', '.join(have)}")
        ends = np.append(self.starts[1:], self.ids.size)
        parts = [self.ids[a:b] for a, b, split in zip(self.starts, ends, self.splits, strict=True) if split in names]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)

    def positions_of(self, ids: Ints) -> Ints:
        """Each id's first export position (-1: not in the export)."""
        unique, first = np.unique(self.ids, return_index=True)
        at = np.searchsorted(unique, ids)
        at = np.minimum(at, max(unique.size - 1, 0))
        found = unique.size > 0 and unique[at] == ids
        return np.where(found, first[at] if unique.size else -1, -1).astype(np.int64)

    def covers(self, selection: Selection) -> bool:
        return bool(selection.ids.size) and bool((self.positions_of(selection.ids) >= 0).all())


def arrange_files(selection: Selection) -> tuple[Selection, Ints]:
    """Loose files keep the catalog's id order (the scan's: folder neighbours); runs of FILE_RUN."""
    return selection, np.arange(0, len(selection), FILE_RUN, dtype=np.int64)


def arrange_wds(selection: Selection, export: WdsExport) -> tuple[Selection, Ints, Ints]:
    """The selection in export order, chunk starts at shard boundaries, and each sample's
    export position."""
    where = export.positions_of(selection.ids)
    order = np.argsort(where, kind="stable")
    ordered = _reorder(selection, order)
    where = where[order]
    shard = np.searchsorted(export.starts, where, side="right") - 1
    starts = np.flatnonzero(np.diff(shard, prepend=-1)).astype(np.int64)
    return ordered, starts, where


def _reorder(selection: Selection, order: Ints) -> Selection:
    return replace(selection, ids=selection.ids[order], labels=selection.labels[order],
                   sizes=pick(selection.sizes, order), hashes=pick(selection.hashes, order))  # fmt: skip


class FileReader:
    """Reads samples from their files, a window in id order (the files' neighbourhood)."""

    def __init__(self, selection: Selection, rows: RowCache) -> None:
        self.selection = selection
        self.rows = rows

    def read(self, positions: Ints) -> list[Read]:
        ids = self.selection.ids[positions]
        order = np.argsort(ids, kind="stable")
        found = self.rows.get_many(ids[order].tolist())
        out: list[Read] = [""] * positions.size
        for k, row in zip(order.tolist(), found, strict=True):
            out[k] = _read_file(row.path if row is not None else None, int(ids[k]))
        return out


def _read_file(path: bytes | None, sample_id: int) -> Read:
    if path is None:
        return f"sample {sample_id} is no longer in the catalog"
    try:
        return read_regular(path, MAX_SAMPLE_BYTES, follow=True)
    except (OSError, DlindexError) as e:
        return f"{os.fsdecode(path)}: {getattr(e, 'strerror', None) or e}"


class WdsReader:
    """Reads samples from an export's shards front to back (one open cursor per shard in use);
    a member whose hash is not the catalog's, or a damaged shard, falls back to the file."""

    def __init__(self, selection: Selection, export: WdsExport, where: Ints, files: FileReader) -> None:
        self.selection, self.export, self.where, self.files = selection, export, where, files
        self.fallbacks = 0
        self._cursors: OrderedDict[int, _Cursor] = OrderedDict()

    def read(self, positions: Ints) -> list[Read]:
        out: list[Read | None] = [None] * positions.size
        where = self.where[positions]
        shard = np.searchsorted(self.export.starts, where, side="right") - 1
        for k in dict.fromkeys(shard.tolist()):
            mine = np.flatnonzero(shard == k)
            members = (where[mine] - self.export.starts[k]).tolist()
            got = self._cursor(k, min(members)).take(members)
            for j, member in zip(mine.tolist(), members, strict=True):
                found = got.get(member)
                pos = int(positions[j])
                if found is not None and _matches(found, self.selection.hashes[pos], int(self.selection.ids[pos])):
                    out[j] = found[1]
        late = [j for j, read in enumerate(out) if read is None]
        if late:
            self.fallbacks += len(late)
            for j, read in zip(late, self.files.read(positions[late]), strict=True):
                out[j] = read
        return [r if r is not None else "" for r in out]

    def _cursor(self, shard: int, first: int) -> _Cursor:
        cursor = self._cursors.pop(shard, None)
        if cursor is None or cursor.next_member > first:
            if cursor is not None:
                cursor.close()
            path, size = self.export.shards[shard]
            cursor = _Cursor(path, size)
        self._cursors[shard] = cursor
        while len(self._cursors) > 2:  # a worker reads one shard at a time; bound the open files
            self._cursors.popitem(last=False)[1].close()
        return cursor

    def close(self) -> None:
        for cursor in self._cursors.values():
            cursor.close()
        self._cursors.clear()


def _matches(data: tuple[int, bytes], digest: np.void, sample_id: int) -> bool:
    key_id, blob = data
    if key_id != sample_id:
        return False
    want = bytes(digest)
    return want == b"\0" * 16 or xxhash.xxh3_128_digest(blob) == want


class _Cursor:
    """A forward reader of one shard's members: ``take`` the wanted ones, seek over the rest."""

    def __init__(self, path: bytes, size: int) -> None:
        self.next_member = 0
        self._wanted: set[int] = set()
        self._samples = _shard_samples(path, size, self._wanted, self)

    def take(self, members: list[int]) -> dict[int, tuple[int, bytes]]:
        self._wanted.clear()
        self._wanted.update(members)
        out: dict[int, tuple[int, bytes]] = {}
        last = max(members)
        try:
            for n, sample in self._samples:
                out[n] = sample
                if n >= last:
                    break
        except (DlindexError, OSError):
            self.close()  # damaged or gone: what is missing is read from the files
        return out

    def close(self) -> None:
        self._samples.close()
        self.next_member = 1 << 62  # never reused


def _shard_samples(
    path: bytes, size: int, wanted: set[int], cursor: _Cursor
) -> Generator[tuple[int, tuple[int, bytes]]]:
    """(member number, (id from its key, image bytes)) of the wanted samples, in order."""
    key: bytes | None = None
    n = -1
    image: bytes | None = None
    for name, read in iter_members(path, size):
        base = name.rpartition(b"/")[2]
        member_key, _, ext = base.partition(b".")
        if member_key != key:
            if image is not None:
                yield n, (_key_id(key), image)
            key, n, image = member_key, n + 1, None
            cursor.next_member = n + 1
        if n in wanted and image is None and ext.decode("ascii", "replace") not in NOT_IMAGE:
            image = read()
    if image is not None:
        yield n, (_key_id(key), image)


def _key_id(key: bytes | None) -> int:
    head = (key or b"").partition(b"_")[0]
    return int(head) if head.isdigit() and len(head) < 19 else -1


def named_export(
    path: str | os.PathLike[str], selection: Selection, splits: tuple[str, ...] | None
) -> tuple[WdsExport, Selection]:
    """The export at ``path`` and the part of ``selection`` to read from it: the samples of its
    splits ``splits``; of its only split when none is named (an export of several needs a name,
    so a training run never reads the validation split unasked); None: every sample."""
    export = WdsExport.open(path)
    have = tuple(dict.fromkeys(export.splits))
    if splits == () and len(have) > 1:
        raise DlindexError(f"{export.out_dir} holds the splits {', '.join(have)}: name the one to read, "
                           f"split={have[0]!r} (or a list of them)")  # fmt: skip
    if splits:
        selection = selection.keep(np.isin(selection.ids, export.split_ids(splits)))
        if not len(selection):
            raise DlindexError(f"no selected sample is in split {', '.join(splits)} of {export.out_dir}")
    if not export.covers(selection):
        raise DlindexError(f"{os.fsdecode(path)} does not hold every sample of the selection; "
                           "export the selection again or use source='files'")  # fmt: skip
    return export, selection


def find_export(catalog: Catalog, selection: Selection) -> WdsExport | None:
    """The newest recorded wds export that holds every sample of ``selection``; None when there is none."""
    from dlindex.export.registry import recorded_exports

    for recorded in recorded_exports(catalog, WDS.name):
        try:
            export = WdsExport.open(Path(recorded.path))
        except (DlindexError, OSError):
            continue  # gone, damaged or from before ids.i64: the files still serve
        if export.covers(selection):
            return export
    return None


def describe(export: WdsExport | None) -> dict[str, Any]:
    return {"source": WDS.name if export else "files", "export": export.out_dir if export else None}
