"""Scanned roots: list them, and tell the catalog that a root's tree moved (no rescan).

    from dlindex import Catalog
    from dlindex.catalog.roots import list_roots, move_root
    with Catalog("train.db") as catalog:
        moved = move_root(catalog, "/mnt/old/images", "/data/images")   # checks a sample first

Rows keep their ``file_path`` (relative to the root), so moving a root is one UPDATE of the
``roots`` row (and the rows forget the inode and ctime a copy changes); before it, a sample of the root's files must be found under the new folder
with the size the catalog has, so a typo or a different tree is refused, not recorded.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlindex.catalog.paths import display_name, root_path
from dlindex.catalog.versions import command_text
from dlindex.errors import InputError

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

__all__ = ["MovedRoot", "RootInfo", "list_roots", "move_root"]

_LIST = (
    "SELECT roots.id, roots.path, roots.path_bytes, count(image_metadata.id), "
    "sum(CASE WHEN image_metadata.status = 'ok' THEN 1 ELSE 0 END) FROM roots "
    "LEFT JOIN image_metadata ON image_metadata.root_id = roots.id GROUP BY roots.id ORDER BY roots.id"
)
_ROOTS = "SELECT id, path, path_bytes FROM roots"
# Spread over the root: every n-th ok row by id, at most :limit of them.
_SAMPLE = (
    "SELECT file_path, file_path_bytes, bytes FROM image_metadata "
    "WHERE root_id = :root AND status = 'ok' ORDER BY (id * 2654435761) % 4294967296 LIMIT :limit"
)
_MOVE = "UPDATE roots SET path = :path, path_bytes = :raw WHERE id = :root"
# A copied tree (rsync -a, cp -a, a new disk) gives every file a new inode and ctime: the rows
# forget theirs, and the next scan records the new ones from lstat instead of reading every file.
_FORGET_IDENTITY = "UPDATE image_metadata SET inode = NULL, ctime_ns = NULL WHERE root_id = :root"
_TAKEN = "SELECT id FROM roots WHERE path = :path"
DEFAULT_CHECK = 20


@dataclass(frozen=True)
class RootInfo:
    id: int
    path: str  # shown form (backslash escapes where the name is not UTF-8)
    images: int
    ok: int
    exists: bool

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "path": self.path, "images": self.images, "ok": self.ok, "exists": self.exists}


@dataclass(frozen=True)
class MovedRoot:
    id: int
    old: str
    new: str
    checked: int  # files found under NEW with the catalogued size

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "old": self.old, "new": self.new, "checked": self.checked}


def list_roots(catalog: Catalog) -> Iterator[RootInfo]:
    """Every scanned root with its image counts and whether its folder exists now."""
    for ident, text, raw, images, ok in catalog.read(_LIST):
        path = root_path(text, raw)
        yield RootInfo(ident, text, images, ok or 0, os.path.isdir(path))


def move_root(
    catalog: Catalog,
    old: str | os.PathLike[str] | bytes,
    new: str | os.PathLike[str] | bytes,
    *,
    check: int = DEFAULT_CHECK,
) -> MovedRoot:
    """Point the root ``old`` at folder ``new``, after finding up to ``check`` of its files there
    with their catalogued size; InputError (nothing written) otherwise.

    Args:
        old: a root as ``dlindex roots`` lists it, or its id as text.
        check: how many files to look for (0: none, for a tree that is not mounted yet).
    """
    if check < 0:
        raise InputError(f"--check must be 0 or more, not {check}")
    root_id, old_raw = _find_root(catalog, old)
    new_raw = os.fsencode(new)
    if not os.path.isdir(new_raw):
        raise InputError(f"{os.fsdecode(new_raw)!r} is not a folder; move the files first, then the root")
    new_raw = os.path.realpath(new_raw)
    text, lossless = display_name(new_raw)
    taken = catalog.conn.execute(_TAKEN, {"path": text}).fetchone()
    if taken is not None and taken[0] != root_id:
        raise InputError(f"{text!r} is already root {taken[0]} of this catalog")
    checked = 0
    for name, raw, size in catalog.read(_SAMPLE, {"root": root_id, "limit": check}):
        rel = bytes(raw) if raw is not None else name.encode()
        path = new_raw.rstrip(b"/") + b"/" + rel
        try:
            found = os.stat(path).st_size
        except OSError:
            raise InputError(
                f"{os.fsdecode(path)!r} is not there: {os.fsdecode(new_raw)!r} does not hold the files of root "
                f"{display_name(old_raw)[0]!r} (pass --check 0 to record the move anyway)"
            ) from None
        if size is not None and found != size:
            raise InputError(f"{os.fsdecode(path)!r} has {found} bytes, the catalog says {size}: not the same tree")
        checked += 1
    with catalog.versioned(command_text("roots move", display_name(old_raw)[0], text)) as version:
        version.keep, version.summary = True, {"root": root_id}  # roots have no history: kept by name
        with catalog.write_transaction() as conn:
            conn.execute(_MOVE, {"path": text, "raw": None if lossless else new_raw, "root": root_id})
            conn.execute(_FORGET_IDENTITY, {"root": root_id})
    return MovedRoot(root_id, display_name(old_raw)[0], text, checked)


def _find_root(catalog: Catalog, given: str | os.PathLike[str] | bytes) -> tuple[int, bytes]:
    raw = os.fsencode(given)
    roots = {ident: root_path(t, b) for ident, t, b in catalog.read(_ROOTS)}
    wanted = {raw.rstrip(b"/") or b"/", os.path.abspath(raw).rstrip(b"/") or b"/"}
    for ident, path in roots.items():
        if path.rstrip(b"/") in wanted or (raw.isdigit() and int(raw) == ident):
            return ident, path
    known = ", ".join(display_name(p)[0] for p in roots.values()) or "none"
    raise InputError(f"{os.fsdecode(raw)!r} is not a root of this catalog (roots: {known}); see dlindex roots")
