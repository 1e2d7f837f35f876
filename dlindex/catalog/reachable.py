"""Is each root's tree where the catalog says? A cheap look for moved or unmounted trees.

``check`` reports what it finds as problems, ``stats`` as warnings, and manifest exports
refuse (a manifest would name files that are not there). It imports nothing of the catalog:
``check`` reads a file that ``Catalog`` may refuse to open.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterable
from typing import Any

_ROOTS = "SELECT id, path, path_bytes FROM roots"
# A few present files from each end of the root's key range: two reads of the unique index.
_FIRST_FILES = (
    "SELECT file_path, file_path_bytes FROM image_metadata WHERE root_id = :root AND status != 'missing' "
    "ORDER BY file_path LIMIT 3"
)
_LAST_FILES = (
    "SELECT file_path, file_path_bytes FROM image_metadata WHERE root_id = :root AND status != 'missing' "
    "ORDER BY file_path DESC LIMIT 3"
)
_GONE = (errno.ENOENT, errno.ENOTDIR)

Reader = Callable[[str, dict[str, Any]], Iterable[tuple[Any, ...]]]


def unreachable_roots(read: Reader, table: str = "image_metadata") -> list[str]:
    """One line per root whose tree is not where the catalog says: its folder is gone, or none
    of a few of its catalogued files (from both ends of the tree) is there (an unmounted or
    moved tree). Two index reads and up to six stat calls per root. A path this process may
    not look at (permission denied) is not called missing: it may well be there.

    Args:
        read: runs a statement with named parameters (``Catalog.read``, ``sqlite3.Connection.execute``).
        table: the rows to look in: a past state's reader names the table itself (whether a
            tree is there is a question about now, and the table's index answers it at once).
    """
    found = []
    for ident, text, raw in list(read(_ROOTS, {})):
        sample = {
            _path(name, name_raw)
            for query in (_FIRST_FILES, _LAST_FILES)
            for name, name_raw in read(query.replace("FROM image_metadata", f"FROM {table}"), {"root": ident})
        }
        sample.discard(None)
        root = _path(text, raw)
        if not sample or root is None:
            continue  # nothing catalogued as present: nothing to miss (or a row no scan wrote)
        root = root.rstrip(b"/") + b"/"
        if _missing(root, folder=True):
            found.append(
                f"root {text} is missing (moved or unmounted?) while the catalog has files under it; "
                f"mount it, or record a move with dlindex roots move {text} NEW"
            )
        elif all(_missing(root + name) for name in sample if name is not None):
            found.append(
                f"root {text} holds none of {len(sample)} catalogued files looked for (unmounted, emptied "
                "or replaced?); mount it, or rescan it if the files were deleted"
            )
    return found


def _path(text: object, raw: object) -> bytes | None:
    """A stored name's bytes (``*_bytes`` where it is not UTF-8); None for a value no scan writes."""
    if isinstance(raw, (bytes, memoryview)):
        return bytes(raw)
    return os.fsencode(text) if isinstance(text, str) else None


def _missing(path: bytes, folder: bool = False) -> bool:
    try:
        st = os.stat(path) if folder else os.lstat(path)
    except OSError as e:
        return e.errno in _GONE
    except ValueError:  # a NUL in a hand-edited row: no such name can exist, nor tell us anything
        return False
    return folder and not stat.S_ISDIR(st.st_mode)
