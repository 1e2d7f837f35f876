"""Catalog keys of file names, and the one rule for which sample a path names.

SQLite ``TEXT`` must be valid UTF-8, so a name that is not gets a stand-in in ``file_path``
(its bytes go into ``file_path_bytes``). The stand-in must never be another name's key, or
two files would share one ``UNIQUE(root_id, file_path)`` slot: see docs/design.md.

A path given by a user (``mark --by path``, ``similar PATH``, ``features import``) is keyed
by :func:`path_key`: lexically normalised; an absolute one is keyed under the deepest root
that contains it, a relative one may sit under any root. docs/concepts.md, "Which sample a
path names", is the rule in prose.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dlindex.catalog.backend import ReadConnection
from dlindex.catalog.postgres.dialect import postgres_form

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

_ROOTS = "SELECT id, path, path_bytes FROM roots"
# Each staged [root_id or null, key] pair, numbered by its place from 0: the ids it names.
_BY_KEY = postgres_form(
    "SELECT staged.key, image_metadata.id FROM json_each(:keys) AS staged "
    "JOIN roots JOIN image_metadata ON image_metadata.root_id = roots.id "
    "AND image_metadata.file_path = json_extract(staged.value, '$[1]') "
    "WHERE json_extract(staged.value, '$[0]') IS NULL OR json_extract(staged.value, '$[0]') = roots.id",
    # the pairs as one jsonb array; ORDINALITY counts from 1 where json_each's key counts from 0
    "SELECT staged.key - 1, image_metadata.id "
    "FROM jsonb_array_elements(%(keys)s::jsonb) WITH ORDINALITY AS staged(value, key) "
    "JOIN image_metadata ON image_metadata.file_path = staged.value ->> 1 "
    "WHERE jsonb_typeof(staged.value -> 0) = 'null' OR image_metadata.root_id = (staged.value ->> 0)::bigint",
)
_CHUNK = 10_000
NO_ROOT = -1  # path_key's root for an absolute path under no scanned root: it names no sample
UNKNOWN = -1  # resolve_paths: the path names no sample
AMBIGUOUS = -2  # resolve_paths: a relative path names samples under several roots


def display_name(name: bytes) -> tuple[str, bool]:
    """(text, lossless): the catalog key of a name or relative path, one name at a time.

    A UTF-8 name is its own key. A non-UTF-8 name gets a readable stand-in: each byte that
    is not UTF-8 as ``\\xNN`` and each backslash as ``\\x5c``, so the stand-in never
    contains '/' (the sort rule holds) and two names never share one. A UTF-8 name that
    reads as such a stand-in (``\\xff.png``, literally) is escaped the same way, so it
    cannot take the key of the file whose stand-in it spells. ``lossless`` is False when the
    key is not the name itself (then its bytes go into ``file_path_bytes``).
    """
    if b"/" in name:
        parts = [display_name(part) for part in name.split(b"/")]
        return "/".join(text for text, _ in parts), all(ok for _, ok in parts)
    try:
        text = name.decode("utf-8")
    except UnicodeDecodeError:
        return _escape(name), False
    if "\\" in text and _reads_as_stand_in(text):
        return _escape(name), False
    return text, True


def _escape(name: bytes) -> str:
    return name.replace(b"\\", b"\\x5c").decode("utf-8", "backslashreplace")


_ESCAPE = re.compile(r"\\x([0-9a-f]{2})")


def _reads_as_stand_in(text: str) -> bool:
    """Is ``text`` the stand-in of some name that is itself stored as a stand-in?

    Only then does keeping it literal collide; the recursion ends because unescaping a text
    with escapes shortens it.
    """
    if "\\" in _ESCAPE.sub("", text):
        return False  # a backslash that starts no escape: _escape never writes that
    raw = bytearray()
    pos = 0
    for m in _ESCAPE.finditer(text):
        raw += text[pos : m.start()].encode("utf-8")
        raw.append(int(m.group(1), 16))
        pos = m.end()
    raw += text[pos:].encode("utf-8")
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return "\\" in decoded and _reads_as_stand_in(decoded)


def root_path(text: str, raw: bytes | None) -> bytes:
    """A root's exact bytes from its ``roots`` row (``path_bytes`` when its name is not UTF-8)."""
    return bytes(raw) if raw is not None else os.fsencode(text)


def root_prefixes(conn: ReadConnection) -> list[tuple[bytes, int]]:
    """(root path ending in '/', root id) of every root, the deepest first: the deepest wins."""
    prefixes = [(root_path(text, raw).rstrip(b"/") + b"/", int(id_)) for id_, text, raw in conn.execute(_ROOTS)]
    return sorted(prefixes, key=lambda p: -len(p[0]))


def normalise(path: bytes) -> bytes:
    """``path`` lexically normalised: no ``.`` or empty parts, ``..`` folded, one leading '/'.

    Symbolic links are not followed (roots are stored resolved, keys never hold ``.``,
    ``..`` or ``//``), so a scanned key is its own normal form.
    """
    path = os.path.normpath(path)
    return b"/" + path.lstrip(b"/") if path.startswith(b"//") else path  # POSIX lets '//' mean more; Linux not


def path_key(path: bytes, prefixes: Sequence[tuple[bytes, int]]) -> tuple[int | None, str]:
    """(root id, catalog key) of a path given by a user, after :func:`normalise`.

    A relative path gets root id None (its key may sit under any root); an absolute one the
    deepest root of ``prefixes`` that contains it, or NO_ROOT (then the key is the whole
    path's, for messages).
    """
    path = normalise(path)
    if not path.startswith(b"/"):
        return None, display_name(path)[0]
    for prefix, root_id in prefixes:
        if path.startswith(prefix):
            return root_id, display_name(path[len(prefix) :])[0]
    return NO_ROOT, display_name(path)[0]


def resolve_paths(catalog: Catalog, paths: Sequence[bytes]) -> list[int]:
    """The sample id each path names, or UNKNOWN, or AMBIGUOUS (relative, under several roots).

    A relative path that names nothing and holds a backslash is tried once more as the
    catalog key itself: a stand-in copied from ``file_path`` (``caf\\xe9.jpg``), which
    :func:`display_name` would escape again.
    """
    prefixes = root_prefixes(catalog.conn)
    keys = [path_key(path, prefixes) for path in paths]
    found = _ids_of_keys(catalog, keys)
    retry = [at for at, (root_id, _) in enumerate(keys) if root_id is None and found[at] == UNKNOWN]
    literal = {at: key for at in retry if (key := _stand_in(paths[at])) is not None}
    if literal:
        again = _ids_of_keys(catalog, [(None, key) for key in literal.values()])
        for at, id_ in zip(literal, again, strict=True):
            found[at] = id_
    return found


def _stand_in(path: bytes) -> str | None:
    """``path`` as a catalog key written out (ASCII escapes, so valid UTF-8), if it may be one."""
    if b"\\" not in path:
        return None
    try:
        return normalise(path).decode("utf-8")
    except UnicodeDecodeError:
        return None


def _ids_of_keys(catalog: Catalog, keys: Sequence[tuple[int | None, str]]) -> list[int]:
    """The id each (root id or None, key) names, UNKNOWN or AMBIGUOUS; one statement per 10,000."""
    found = [UNKNOWN] * len(keys)
    for start in range(0, len(keys), _CHUNK):
        staged = json.dumps(keys[start : start + _CHUNK])  # NO_ROOT is no root's id: its keys find nothing
        for at, image_id in catalog.read(_BY_KEY, {"keys": staged}):
            at = start + int(at)
            found[at] = int(image_id) if found[at] == UNKNOWN else AMBIGUOUS
    return found
