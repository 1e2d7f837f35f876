"""``scan --texts``: after the images, the sidecar texts beside them (dlindex.text.sidecars).

The catalog's rows of the root are read a page at a time in path order; each folder they
sit in is listed once, and each image's candidates (its name with the suffix ``.txt``,
``.caption`` or ``.json`` instead of its own) are looked up in the listing. A sidecar whose
size and mtime are those stored with its text is not read again; a new or changed one is
read and its texts replace the stored ones; a sidecar that is gone takes its texts with it
(a folder that cannot be listed now keeps its texts: nothing is removed on a guess).
Every page is one write transaction: an interrupted pass keeps what it finished, and the
next scan goes on from the stat it left. Memory is one page and one folder's names.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dlindex.catalog.texts import STAGE_SCOPE, apply_texts, end_staging, stage_rows, start_staging
from dlindex.text.sidecars import SOURCES, UNREADABLE, read_sidecar

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

_PAGE = 5_000
_PAGE_ROWS = """SELECT id, file_path, file_path_bytes FROM image_metadata
    WHERE root_id = :root AND file_path > :after ORDER BY file_path LIMIT :page"""
_STORED = """SELECT image_id, source, file_bytes, file_mtime_ns FROM image_texts
    WHERE image_id IN (SELECT value FROM json_each(:ids)) AND seq = 0 AND source IN ('.caption', '.json', '.txt')"""
NOT_A_FILE = "not_a_file"


@dataclass
class SidecarCounts:
    """What one pass did: sidecars read and stored, unchanged, gone; those giving no text, by reason."""

    read: int = 0
    unchanged: int = 0
    removed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def scan_sidecars(catalog: Catalog, root_id: int, root: bytes) -> SidecarCounts:
    counts = SidecarCounts()
    after = ""
    listing: tuple[bytes, frozenset[bytes] | None] | None = None
    conn = catalog.conn
    try:
        while page := list(catalog.read(_PAGE_ROWS, {"root": root_id, "after": after, "page": _PAGE})):
            after = str(page[-1][1])
            ids = [int(row[0]) for row in page]
            stored = {(int(i), str(s)): (b, m) for i, s, b, m in catalog.read(_STORED, {"ids": json.dumps(ids)})}
            rows: list[tuple[int, str, int, str, str, int | None, int | None]] = []
            scope: list[tuple[int, str]] = []
            for image_id, file_path, raw in page:
                relative = bytes(raw) if raw is not None else str(file_path).encode("utf-8")
                folder, _, name = (root.rstrip(b"/") + b"/" + relative).rpartition(b"/")
                if listing is None or listing[0] != folder:
                    listing = (folder, _names(folder))
                if listing[1] is None:  # unreadable now: its sidecars' texts stay as they are
                    counts.skip(UNREADABLE)
                    continue
                stem = name.rpartition(b".")[0] or name
                for source in SOURCES:
                    _one(int(image_id), folder, stem + source.encode(), source, listing[1], stored, rows, scope, counts)
            if rows or scope:
                with catalog.write_transaction() as tx:
                    start_staging(tx)
                    stage_rows(tx, rows)
                    tx.executemany(STAGE_SCOPE, scope)
                    apply_texts(tx)
    finally:
        end_staging(catalog, conn)
    return counts


def _one(
    image_id: int,
    folder: bytes,
    name: bytes,
    source: str,
    names: frozenset[bytes],
    stored: dict[tuple[int, str], tuple[int | None, int | None]],
    rows: list[tuple[int, str, int, str, str, int | None, int | None]],
    scope: list[tuple[int, str]],
    counts: SidecarCounts,
) -> None:
    """Stage what one candidate sidecar says: nothing if it is unchanged, its texts, or its going."""
    had = (image_id, source) in stored
    if name not in names:
        if had:
            scope.append((image_id, source))
            counts.removed += 1
        return
    path = folder + b"/" + name
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        counts.skip(NOT_A_FILE)
        if had:
            scope.append((image_id, source))
        return
    if had and stored[(image_id, source)] == (st.st_size, st.st_mtime_ns):
        counts.unchanged += 1
        return
    texts = read_sidecar(path, source)
    scope.append((image_id, source))
    if isinstance(texts, str):
        counts.skip(texts)
        return
    counts.read += 1
    rows.extend((image_id, source, seq, t, enc, st.st_size, st.st_mtime_ns) for seq, (t, enc) in enumerate(texts))


def _names(folder: bytes) -> frozenset[bytes] | None:
    try:
        return frozenset(os.listdir(folder))
    except OSError:  # gone, or unreadable since the image pass
        return None
