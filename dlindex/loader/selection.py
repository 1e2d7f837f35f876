"""One epoch's samples: a query resolved once, kept as compact arrays in locality order."""

from __future__ import annotations

import array
import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from dlindex.catalog.state import CatalogState
from dlindex.errors import InputError
from dlindex.query import cache
from dlindex.query.rows import prepare, query_rows
from dlindex.query.spec import QuerySpec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.loader.l2 import L2Cache, Labelled

Ints = npt.NDArray[np.int64]
_COLUMNS = ("id", "label_id", "bytes", "xxh3_128")
_NO_HASH = b"\0" * 16
_HASHES_OF = "SELECT id, xxh3_128 FROM image_metadata WHERE id IN (SELECT value FROM json_each(:ids))"


def epoch_seed(seed: int, epoch: int) -> int:
    """The query seed of one epoch: every (seed, epoch) pair draws its own per-label sample."""
    digest = hashlib.sha256(f"dlindex-epoch:{int(seed)}:{int(epoch)}".encode()).digest()
    return int.from_bytes(digest[:7], "big")  # < 2**56: binds as SQLite's INTEGER


@dataclass(frozen=True)
class Selection:
    """The samples of one epoch, in id order (the scan's order, so neighbours share folders).

    Arrays, not rows: 36 bytes a sample while the epoch is planned; the plan then keeps the ids
    and classes in a file its workers share (dlindex.loader.shared_plan).
    """

    ids: Ints
    labels: npt.NDArray[np.int32] | Ints  # class index into ``classes``
    sizes: Ints  # bytes as scanned (-1: unknown)
    hashes: npt.NDArray[np.void]  # xxh3_128 as 16 raw bytes (zeros: unknown)
    classes: tuple[str, ...]
    cache_hit: bool  # the L3 result cache answered the query
    digest: str = field(default="")  # what the samples are: resume checks it
    changes: int = -1  # the catalog's change counter, read before the query ran
    l2_hit: bool = False  # the L2 cache (Redis) answered the query
    token: str = ""  # the catalog's change token, read with the counter (dlindex.catalog.state)
    hashed: bool = True  # sizes and hashes were read (else -1 and zeros, until with_hashes)

    @property
    def state(self) -> CatalogState:
        """The catalog state the samples were selected in: what L2 entries are keyed by."""
        return CatalogState(self.changes, self.token)

    def __len__(self) -> int:
        return int(self.ids.size)

    def keep(self, mask: npt.NDArray[np.bool_]) -> Selection:
        return replace(self, ids=self.ids[mask], labels=self.labels[mask], sizes=pick(self.sizes, mask),
                       hashes=pick(self.hashes, mask), digest=_digest(self.ids[mask], self.classes))  # fmt: skip


def pick(values: npt.NDArray[Any], index: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``values[index]``; a column not read (one value repeated, no memory) stays one."""
    if values.size and values.strides[0] == 0:
        n = int(np.count_nonzero(index)) if index.dtype == np.bool_ else int(index.size)
        return np.broadcast_to(values[:1], (n,))
    out: npt.NDArray[Any] = values[index]
    return out


def with_hashes(catalog: Catalog, selection: Selection) -> Selection:
    """The selection with its content hashes (what an export's members are checked against),
    read by id when the epoch's query left them out."""
    if selection.hashed:
        return selection
    ids = selection.ids
    hashes = np.zeros(ids.size, dtype="V16")
    for start in range(0, ids.size, 10_000):  # bounded JSON per statement; ids ascending
        chunk = ids[start : start + 10_000]
        found = dict(catalog.conn.execute(_HASHES_OF, {"ids": json.dumps(chunk.tolist())}).fetchall())
        for k, sample_id in enumerate(chunk.tolist()):
            hashes[start + k] = np.void(_hash_bytes(found.get(sample_id)))
    return replace(selection, hashes=hashes, hashed=True)


def epoch_spec(filters: QuerySpec, seed: int, epoch: int) -> QuerySpec:
    """The query of one epoch: the user's filters; a per-label draw seeded by (seed, epoch)."""
    if filters.limit is not None or filters.offset:
        raise InputError("a training selection takes no limit or offset; use per_label or filters")
    has_class = True if filters.has_class is None else filters.has_class
    if not has_class:
        raise InputError("a training selection needs a class for every sample (has_class=False selects none)")
    return replace(filters, columns=_COLUMNS, order="id", seed=epoch_seed(seed, epoch), has_class=True)


def resolve(catalog: Catalog, spec: QuerySpec, l2: L2Cache | None = None, *, full: bool = True) -> Selection:
    """Run the epoch's query once (through the L2 cache when given, and the L3 result cache)
    into arrays; ``full=False`` leaves sizes and hashes out (``with_hashes`` reads them later)
    unless the L2 cache, which keeps them, is on."""
    prepared = prepare(catalog, spec)
    state = catalog.state()  # before the query: a result is never filed under a newer state
    changes = state.changes
    key = cache.cache_key(prepared.selection_sql, prepared.params)
    classes = tuple(prepared.classes or ())
    parts = l2.load_selection(key, state) if l2 is not None and spec.cache else None
    if parts is not None:
        return _from_parts(parts, classes, state, cache_hit=False, l2_hit=True)
    hit = spec.cache and cache.lookup(catalog, key, changes) is not None
    full = full or (l2 is not None and spec.cache)  # the L2 cache keeps sizes and hashes
    id_array, labels, sizes, hashes = _fetch_arrays(catalog, spec, full)
    if id_array.size > 1 and not bool((id_array[1:] >= id_array[:-1]).all()):
        order = np.argsort(id_array, kind="stable")  # per-label draws may come grouped by class
        id_array, labels, sizes, hashes = id_array[order], labels[order], pick(sizes, order), pick(hashes, order)
    selection = Selection(
        ids=id_array, labels=labels, sizes=sizes, hashes=hashes, classes=classes, cache_hit=bool(hit),
        digest=_digest(id_array, classes), changes=changes, token=state.token, hashed=full,
    )  # fmt: skip
    # Stored only if no write committed during the query: the result is then the state's.
    if l2 is not None and spec.cache and catalog.state() == state:
        l2.store_selection(key, state, _parts(selection))
    return selection


def _fetch_arrays(catalog: Catalog, spec: QuerySpec, full: bool) -> tuple[Ints, npt.NDArray[np.int32], Ints,
                                                                       npt.NDArray[np.void]]:  # fmt: skip
    """The query's ids and classes (with ``full``, sizes and hashes too) straight into packed
    arrays: 12 bytes a row (36 full), no list of Python objects (the 10^7-row plan once took
    3.3 GB that way). Without ``full``, sizes are -1 and hashes zeros, one value each."""
    ids, labels, sizes = array.array("q"), array.array("i"), array.array("q")
    hashes = bytearray()
    if not full:
        for row in query_rows(catalog, replace(spec, columns=("id", "label_id"))):
            ids.append(row["id"])
            labels.append(row["label_id"])
        n = len(ids)
        return (np.frombuffer(ids, dtype=np.int64), np.frombuffer(labels, dtype=np.int32),
                np.broadcast_to(np.int64(-1), (n,)), np.broadcast_to(np.zeros(1, dtype="V16"), (n,)))  # fmt: skip
    for row in query_rows(catalog, spec):
        ids.append(row["id"])
        labels.append(row["label_id"])
        size = row["bytes"]
        sizes.append(-1 if size is None else size)
        hashes += _hash_bytes(row["xxh3_128"])
    return (np.frombuffer(ids, dtype=np.int64), np.frombuffer(labels, dtype=np.int32),
            np.frombuffer(sizes, dtype=np.int64), np.frombuffer(hashes, dtype="V16"))  # fmt: skip


def _parts(selection: Selection) -> list[Labelled]:
    """A selection cut by label, each part in id order: one L2 value per (selection, label)."""
    from dlindex.loader.l2 import Labelled

    out = []
    for label in np.unique(selection.labels).tolist():
        mask = selection.labels == label
        out.append(Labelled(int(label), selection.ids[mask], selection.sizes[mask], selection.hashes[mask]))
    return out


def _from_parts(parts: list[Labelled], classes: tuple[str, ...], state: CatalogState, *, cache_hit: bool,
                l2_hit: bool) -> Selection:  # fmt: skip
    ids = np.concatenate([p.ids for p in parts]) if parts else np.zeros(0, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    labels = np.concatenate([np.full(p.ids.size, p.label, dtype=np.int64) for p in parts]) if parts else ids
    sizes = np.concatenate([p.sizes for p in parts]) if parts else ids
    hashes = np.concatenate([p.hashes for p in parts]) if parts else np.zeros(0, dtype="V16")
    return Selection(ids=ids[order], labels=labels[order], sizes=sizes[order], hashes=hashes[order].copy(),
                     classes=classes, cache_hit=cache_hit, digest=_digest(ids[order], classes),
                     changes=state.changes, token=state.token, l2_hit=l2_hit)  # fmt: skip


def hash_bytes(text: Any) -> bytes:
    """16 raw bytes of an xxh3_128 hex digest (zeros when the catalog has none)."""
    return _hash_bytes(text)


def _hash_bytes(text: Any) -> bytes:
    if not isinstance(text, str) or len(text) != 32:
        return _NO_HASH
    try:
        return bytes.fromhex(text)
    except ValueError:
        return _NO_HASH


def _digest(ids: Ints, classes: tuple[str, ...]) -> str:
    h = hashlib.sha256(np.ascontiguousarray(ids).tobytes())
    h.update("\0".join(classes).encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:32]
