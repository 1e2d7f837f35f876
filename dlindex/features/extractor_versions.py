"""Which version of its extractor made each vector, and which vectors are therefore stale.

An extractor's *version* is a text that changes when the vectors it computes would change:

- a built-in's is its name and a number dlindex raises whenever the built-in's output changes
  (``Extractor.version``);
- a model file's (``torch:``, ``torchvision:``) is a digest of the file's bytes: new weights,
  new vectors;
- a function's (``module:function``, ``file.py:function``) is what the function declares as
  ``dlindex_version`` (any text: ``extract.dlindex_version = "2"``), else a digest of the
  source file that defines it, else its module's ``__version__``, else ``unversioned`` (such
  vectors are never found stale).

A feature type records the version of its latest compute (``feature_types.extractor_version``)
and every computed vector the version that made it (``image_features.extractor_version``); a
vector of another version is *stale*, and ``features compute`` makes it again, as it makes
missing ones. A version is stored by an id that is a digest of its text, the same in every
catalog, so parts computed apart merge without renumbering (``extractor_versions`` keeps the
texts). Vectors stored before versions were recorded, and imported ones, have none (NULL): the
first compute that records a version takes them as its own, since nothing says otherwise.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Protocol

import xxhash

from dlindex.errors import InputError

if TYPE_CHECKING:
    from dlindex.catalog.backend import Connection
    from dlindex.catalog.connection import Catalog


class Versioned(Protocol):
    """What a version is read from: dlindex.features.extractors.Extractor."""

    @property
    def fn(self) -> Any: ...

    @property
    def version(self) -> str | None: ...


UNVERSIONED = "unversioned"
_DECLARED_MAX = 200  # characters of a declared version kept
_READ = 1 << 20
_SETTLED_NS = 2_000_000_000  # a file older than this is digested once per process

_ADD_VERSION = """INSERT INTO extractor_versions (feature_type, id, version) VALUES (?, ?, ?)
    ON CONFLICT (feature_type, id) DO NOTHING"""
_SET_CURRENT = "UPDATE feature_types SET extractor_version = ? WHERE name = ?"
_CLAIM = "UPDATE image_features SET extractor_version = ? WHERE feature_type = ? AND extractor_version IS NULL"
_VERSION_TEXT = "SELECT version FROM extractor_versions WHERE feature_type = ? AND id = ?"
# Vectors of the type not made by its current version.
STALE = "SELECT count(*) FROM image_features WHERE feature_type = ? AND extractor_version IS NOT ?"
# Each vector's id and version, -1 for none recorded (version ids are >= 0).
VECTOR_VERSIONS = "SELECT image_id, coalesce(extractor_version, -1) FROM image_features WHERE feature_type = ?"


def version_of(extractor: Versioned) -> str:
    """The version text of an extractor (see the module's note)."""
    if extractor.version is not None:
        return extractor.version
    return function_version(extractor.fn)


def function_version(fn: Any) -> str:
    """A user function's version: declared, else its source file's digest, else its module's
    ``__version__``, else ``unversioned``."""
    declared = getattr(fn, "dlindex_version", None)
    if declared is not None:
        try:
            return "declared:" + str(declared)[:_DECLARED_MAX]
        except Exception as e:  # the user's object: its __str__ may raise anything
            raise InputError(f"the extractor's dlindex_version cannot be read as text: {type(e).__name__}") from None
    module = sys.modules.get(str(getattr(fn, "__module__", None) or ""))
    source = getattr(module, "__file__", None)
    if isinstance(source, str) and source.endswith(".py") and os.path.isfile(source):
        try:
            return "source:" + file_digest(source)
        except OSError:
            pass
    version = getattr(module, "__version__", None)
    if isinstance(version, str) and module is not None:
        return f"module:{module.__name__}=={version[:_DECLARED_MAX]}"
    return UNVERSIONED


def file_digest(path: str) -> str:
    """xxh3-128 of a file's bytes, read a MiB at a time (model files are large); a file read
    before in this process, unchanged since (same inode, size and mtime), is not read again.
    A file written in the last seconds is always read: a rewrite within the clock's tick keeps
    its mtime (git's "racily clean" entries)."""
    st = os.stat(path)
    if time.time_ns() - st.st_mtime_ns < _SETTLED_NS:
        return _digest.__wrapped__(path, st.st_ino, st.st_size, st.st_mtime_ns)
    return _digest(os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _digest(path: str, inode: int, size: int, mtime_ns: int) -> str:
    digest = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(_READ):
            digest.update(chunk)
    return digest.hexdigest()


def version_id(version: str) -> int:
    """The id a version is stored by: 63 bits of a digest of its text, the same in every catalog."""
    return xxhash.xxh3_64_intdigest(version.encode("utf-8", "surrogateescape")) >> 1


def record(conn: Connection, ftype_name: str, version: str, *, claim: bool) -> int:
    """Make ``version`` the type's current one (in the caller's write transaction); ``claim``:
    the vectors without a recorded version become this version's. Its id."""
    vid = version_id(version)
    conn.execute(_ADD_VERSION, (ftype_name, vid, version))
    conn.execute(_SET_CURRENT, (vid, ftype_name))
    if claim:
        conn.execute(_CLAIM, (vid, ftype_name))
    return vid


def version_text(catalog: Catalog, name: str, current: int | None) -> str | None:
    """The text of version ``current`` of type ``name`` (None while none is recorded)."""
    if current is None:
        return None
    row = catalog.conn.execute(_VERSION_TEXT, (name, current)).fetchone()
    return None if row is None else str(row[0])


def stale_count(catalog: Catalog, name: str, current: int | None) -> int:
    """How many vectors of type ``name`` another version than ``current`` (its latest compute's) made."""
    if current is None:
        return 0  # nothing recorded: nothing to compare with
    row = catalog.conn.execute(STALE, (name, current)).fetchone()
    return int(row[0])


def stale_warning(name: str, stale: int, total: int | None = None) -> str:
    """The line a reader of stale vectors prints (they are used as they are)."""
    counted = f"{stale:,}" if total is None else f"{stale:,} of {total:,}"
    return (
        f"{counted} {name!r} vectors were made by another version of the type's extractor than its latest "
        f"compute ran; dlindex features compute --type {name} makes them again"
    )
