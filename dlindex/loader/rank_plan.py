"""One rank's share of an epoch plan at any size: the query's ids and classes spilled to a file as
they stream, then only this rank's samples gathered from it (#34).

Memory then holds the rank's share (12 bytes a sample of it) and the chunk permutation (8 bytes
a 16-sample run), never the whole selection: a 10^8-row catalog over 8 ranks plans in ~0.25 GB.
The spill (12 bytes a selected sample) is written to ``$DLINDEX_PLAN_DIR``, else the temp folder,
and removed when the rank's share is gathered. Its free space is checked before every block is
written: too little is one line naming the folder, the bytes needed (projected from how far the
query got) and the bytes free. The order is the one the whole plan gives (Layout.rank_positions
over chunk_order), computed for this rank's positions only.
"""

from __future__ import annotations

import array
import contextlib
import errno
import hashlib
import os
import secrets
import tempfile
from dataclasses import replace
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
import numpy.typing as npt

from dlindex.loader import shared_plan
from dlindex.loader.layout import rank_runs
from dlindex.loader.selection import Selection
from dlindex.loader.shared_plan import ENV, PlanSpaceError
from dlindex.query import cache
from dlindex.query.rows import prepare, query_rows
from dlindex.query.spec import QuerySpec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

Ints = npt.NDArray[np.int64]
_BLOCK = 1 << 16  # rows spilled at a time (768 kB)
_GATHER = 1 << 22  # rows of the spill read at a time while gathering (48 MB)
_ROW_BYTES = 12  # id (int64) and class (int32)
_MAX_ID = "SELECT max(id) FROM image_metadata"


def spill_dir() -> str:
    """Where the query's spill goes: $DLINDEX_PLAN_DIR, else the temp folder (disk, not memory)."""
    return os.environ.get(ENV) or tempfile.gettempdir()


def rank_share(n: int, world: int, drop_last: bool) -> int:
    """Samples every rank reads (Layout.share for an epoch of ``n``)."""
    if n == 0:
        return 0
    return n // world if drop_last and n >= world else -(-n // world)


def resolve_rank(catalog: Catalog, spec: QuerySpec, *, rank: int, world: int, drop_last: bool, seed: int,
                 epoch: int, shuffle: bool, run: int) -> tuple[Selection, int]:  # fmt: skip
    """This rank's samples in its reading order (runs of ``run`` ids in a seeded order, as
    chunk_order), and how many the epoch selected in all; the digest is the whole selection's."""
    prepared = prepare(catalog, spec)
    state = catalog.state()  # before the query, as resolve()
    hit = spec.cache and cache.lookup(catalog, cache.cache_key(prepared.selection_sql, prepared.params),
                                      state.changes) is not None  # fmt: skip
    classes = tuple(prepared.classes or ())
    with Spill(catalog) as spill:
        for row in query_rows(catalog, replace(spec, columns=("id", "label_id"))):
            spill.add(row["id"], row["label_id"])
        spill.close_writing()
        digest = spill.digest(classes)
        n = spill.n
        per = rank_share(n, world, drop_last)
        src, length, dst = rank_runs(n, run, seed, epoch, shuffle, rank, per)
        ids, labels = spill.gather(src, length, dst, per)
    selection = Selection(ids=ids, labels=labels, sizes=np.broadcast_to(np.int64(-1), (per,)),
                          hashes=np.broadcast_to(np.zeros(1, dtype="V16"), (per,)), classes=classes,
                          cache_hit=bool(hit), digest=digest, changes=state.changes, token=state.token,
                          hashed=False)  # fmt: skip
    return selection, n


class Spill:
    """Two files (ids int64, classes int32) appended a block at a time, removed on exit."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.folder = spill_dir()
        stem = os.path.join(self.folder, f"dlindex-plan-{os.getpid()}-{secrets.token_hex(6)}")
        self.paths = (stem + ".ids.bin", stem + ".labels.bin")
        self.n = 0
        self.ascending = True
        self._last = -(1 << 63)
        self._ids, self._labels = array.array("q"), array.array("i")
        self._files: list[BinaryIO] = []
        self._hash = hashlib.sha256()

    def __enter__(self) -> Spill:
        shared_plan.sweep(self.folder)  # the spills of killed processes (1.2 GB each at 10^8)
        try:
            self._files = [open(p, "xb") for p in self.paths]  # noqa: SIM115  # closed by close_writing/__exit__
        except OSError as e:
            self._remove()
            raise PlanSpaceError(f"the epoch plan folder {self.folder} cannot be used "
                                 f"({e.strerror or e}); set {ENV} to a writable folder") from None  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()
        self._remove()

    def add(self, sample_id: int, label: int) -> None:
        self._ids.append(sample_id)
        self._labels.append(label)
        if len(self._ids) >= _BLOCK:
            self._flush()

    def _flush(self) -> None:
        ids, labels = self._ids, self._labels
        if not ids:
            return
        block = np.frombuffer(ids, dtype=np.int64)
        if self.ascending and (block[0] < self._last or bool((block[1:] < block[:-1]).any())):
            self.ascending = False
        self._last = int(block[-1])
        need = len(ids) * _ROW_BYTES
        try:
            free = shared_plan.free_bytes(self.folder)
            if need > free:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self._files[0].write(ids)
            self._files[1].write(labels)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise PlanSpaceError(f"the epoch plan's spill could not be written to {self.folder}: "
                                     f"{e.strerror or e}; set {ENV} to a folder with room") from None  # fmt: skip
            self._out_of_room(need)
        self._hash.update(ids)
        self.n += len(ids)
        self._ids, self._labels = array.array("q"), array.array("i")

    def _out_of_room(self, need: int) -> None:
        """One line: the folder, the bytes the spill needs (projected from the ids read so far,
        which come in id order, against the catalog's largest id) and the bytes free."""
        written = self.n * _ROW_BYTES
        with contextlib.suppress(OSError):
            os.truncate(self.paths[0], 0)  # what was written is freed before the line
            os.truncate(self.paths[1], 0)
        free = shared_plan.free_bytes(self.folder)
        rows = self.n + len(self._ids)
        top = self.catalog.conn.execute(_MAX_ID).fetchone()
        last = int(self._ids[-1]) if self._ids else 0
        projected = written + need
        if self.ascending and top and last > 0:
            projected = max(projected, int(rows * _ROW_BYTES * int(top[0]) / last))
        raise PlanSpaceError(f"the epoch plan's spill needs about {projected:,} bytes in {self.folder} "
                             f"({_ROW_BYTES} a selected sample), which has {free:,} free; "
                             f"set {ENV} to a folder with room")  # fmt: skip

    def close_writing(self) -> None:
        self._flush()
        self._close()

    def _close(self) -> None:
        for f in self._files:
            with contextlib.suppress(OSError):
                f.close()
        self._files = []

    def _remove(self) -> None:
        for p in self.paths:
            with contextlib.suppress(OSError):
                os.unlink(p)

    def digest(self, classes: tuple[str, ...]) -> str:
        """The whole selection's digest (Selection's): sha256 of its ids in id order and its classes."""
        if not self.ascending:  # a per-label draw may come grouped by class: sort it (its size)
            self._sort()
        self._hash.update("\0".join(classes).encode("utf-8", "surrogateescape"))
        return self._hash.hexdigest()[:32]

    def _sort(self) -> None:
        ids = np.fromfile(self.paths[0], dtype=np.int64)
        labels = np.fromfile(self.paths[1], dtype=np.int32)
        order = np.argsort(ids, kind="stable")
        ids, labels = ids[order], labels[order]
        ids.tofile(self.paths[0])
        labels.tofile(self.paths[1])
        self._hash = hashlib.sha256(ids.tobytes())
        self.ascending = True

    def gather(self, src: Ints, length: Ints, dst: Ints, per: int) -> tuple[Ints, npt.NDArray[np.int32]]:
        """The samples of runs (``src`` position, ``length``) placed at ``dst``: the spill read
        front to back once, a block at a time."""
        ids = np.empty(per, dtype=np.int64)
        labels = np.empty(per, dtype=np.int32)
        by_src = np.argsort(src, kind="stable")
        src, length, dst = src[by_src], length[by_src], dst[by_src]
        with open(self.paths[0], "rb") as fi, open(self.paths[1], "rb") as fl:
            at = 0
            while at < src.size:
                base = int(src[at])
                upto = int(np.searchsorted(src, base + _GATHER, side="left"))
                upto = max(upto, at + 1)
                s, ln, d = src[at:upto] - base, length[at:upto], dst[at:upto]
                top = int((s + ln).max())
                fi.seek(base * 8)
                fl.seek(base * 4)
                block_ids = np.fromfile(fi, dtype=np.int64, count=top)
                block_labels = np.fromfile(fl, dtype=np.int32, count=top)
                within = np.arange(int(ln.sum()), dtype=np.int64) - np.repeat(np.cumsum(ln) - ln, ln)
                take = np.repeat(s, ln) + within
                put = np.repeat(d, ln) + within
                ids[put] = block_ids[take]
                labels[put] = block_labels[take]
                at = upto
        return ids, labels
