"""Catalog keys of file names: the name itself, or a one-to-one readable stand-in.

SQLite ``TEXT`` must be valid UTF-8, so a name that is not gets a stand-in in ``file_path``
(its bytes go into ``file_path_bytes``). The stand-in must never be another name's key, or
two files would share one ``UNIQUE(root_id, file_path)`` slot: see docs/design.md.
"""

from __future__ import annotations

import re


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
