"""The L1 metadata cache: an LRU of sample rows (path, size, hash) by id, filled a batch per query (or from L2)."""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from dlindex.query.lookups import roots_by_id

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.catalog.state import CatalogState
    from dlindex.loader.l2 import L2Cache

DEFAULT_SIZE = 65536  # rows; ~200 bytes each, so ~13 MB a worker at most
_ROWS_OF = (
    "SELECT id, root_id, file_path, file_path_bytes, bytes, xxh3_128 FROM image_metadata "
    "WHERE id IN (SELECT value FROM json_each(:ids))"
)


class SampleRow(NamedTuple):
    path: bytes  # exact file name: root + file_path, as bytes
    bytes: int | None
    xxh3_128: str | None


class RowCache:
    """Sample rows by id: hits from memory, the misses of a call fetched in one query.

    The seed's loader kept 1,000 rows; a worker here keeps ``size`` (default 65,536; 0 keeps
    none). With ``l2``, misses are asked of the L2 cache first (under the catalog ``state`` the
    epoch was selected in), and what the catalog then answers is stored there while the
    catalog is still in that state.
    """

    def __init__(self, catalog: Catalog, size: int = DEFAULT_SIZE, l2: L2Cache | None = None,
                 state: CatalogState | None = None) -> None:  # fmt: skip
        assert l2 is None or state is not None, "L2 entries need the catalog state they belong to"
        self.catalog = catalog
        self.size = max(0, int(size))
        self.l2, self.state = l2, state
        self.hits = 0
        self.misses = 0
        self._rows: OrderedDict[int, SampleRow] = OrderedDict()

    def get(self, sample_id: int) -> SampleRow | None:
        return self.get_many([sample_id])[0]

    def get_many(self, ids: Sequence[int]) -> list[SampleRow | None]:
        """The rows of ``ids`` in order (None: no such sample)."""
        rows = self._rows
        out: list[SampleRow | None] = []
        missing: list[int] = []
        for i in ids:
            row = rows.get(i)
            if row is not None:
                rows.move_to_end(i)
            else:
                missing.append(i)
            out.append(row)
        self.hits += len(ids) - len(missing)
        self.misses += len(missing)
        if not missing:
            return out
        found = self._fetch(missing)
        for k, i in enumerate(ids):
            if out[k] is None:
                out[k] = found.get(i)
        while len(rows) > self.size:
            rows.popitem(last=False)
        return out

    def hit_rate(self) -> float:
        asked = self.hits + self.misses
        return self.hits / asked if asked else 0.0

    def _fetch(self, ids: list[int]) -> dict[int, SampleRow]:
        if self.l2 is None or self.state is None:
            return self._query(ids)
        found = {i: SampleRow(*row) for i, row in self.l2.load_rows(ids, self.state).items()}
        self._rows.update(found)
        asked = [i for i in ids if i not in found]
        if asked:
            fetched = self._query(asked)
            # A write since the epoch's selection: these rows may be of a later state than
            # the key says, so they are not stored (one read of one row decides).
            if self.catalog.state() == self.state:
                self.l2.store_rows(fetched, self.state)
            found |= fetched
        return found

    def _query(self, ids: list[int]) -> dict[int, SampleRow]:
        roots = roots_by_id(self.catalog)
        found: dict[int, SampleRow] = {}
        for start in range(0, len(ids), 10_000):  # bounded JSON per statement
            chunk = json.dumps(ids[start : start + 10_000])
            for id_, root_id, text, raw, size, digest in self.catalog.conn.execute(_ROWS_OF, {"ids": chunk}):
                root = roots.get(root_id)
                if root is None:
                    continue
                name = raw if raw is not None else os.fsencode(text)
                row = SampleRow(root[1] + bytes(name), size, digest)
                found[int(id_)] = row
                self._rows[int(id_)] = row
        return found
