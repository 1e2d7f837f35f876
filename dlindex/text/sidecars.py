"""One sidecar file's texts: ``NAME.txt`` / ``NAME.caption`` beside ``NAME.jpg`` (the whole file
is the text) and ``NAME.json`` (the text is a field: ``caption``, ``text``...), as webdataset,
img2dataset and captioning tools write them.

Kept losslessly: ``encoding`` says how the file's bytes come back from the stored text
(``text.encode(encoding) == the file``): ``utf-8``, ``utf-8-sig`` (a BOM), ``utf-16-le`` /
``utf-16-be`` (the BOM stays the text's first character), else ``cp1252`` or ``latin-1``
(every byte is a character). For a JSON sidecar it is ``json:FIELD``: the text is that
field's value. A file larger than MAX_TEXT_BYTES, with NUL bytes and no UTF-16 BOM (binary),
or a JSON sidecar that is not an object with a text field gives no text, and a reason.
"""

from __future__ import annotations

import codecs
import json
import os

from dlindex.catalog.texts import MAX_TEXT_BYTES
from dlindex.text.records import TEXT_FIELDS

# The sources scan writes: the sidecar's suffix (an import's source never starts with '.').
SOURCES = (".caption", ".json", ".txt")
TOO_LARGE = "too_large"
BINARY = "binary"
NOT_JSON = "not_json"
NO_FIELD = "no_text_field"
UNREADABLE = "unreadable"
Texts = list[tuple[str, str]]  # (text, encoding), in order


def read_sidecar(path: bytes, source: str) -> Texts | str:
    """The texts of the sidecar at ``path``, or why it gives none (one of the reasons above)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return UNREADABLE
    try:
        data = os.read(fd, MAX_TEXT_BYTES + 1)  # a FIFO opened non-blocking reads nothing, never hangs
        if len(data) > MAX_TEXT_BYTES:
            return TOO_LARGE
    except OSError:
        return UNREADABLE
    finally:
        os.close(fd)
    return from_json(data) if source == ".json" else from_bytes(data)


def from_bytes(data: bytes) -> Texts | str:
    for bom, encoding in ((codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be")):
        if data.startswith(bom) and len(data) % 2 == 0:
            try:
                text = data.decode(encoding)
            except UnicodeDecodeError:  # a lone surrogate: no text
                return BINARY
            return [(text, encoding)] if "\0" not in text else BINARY
    if b"\0" in data:
        return BINARY
    for encoding in ("utf-8-sig" if data.startswith(codecs.BOM_UTF8) else "utf-8", "cp1252", "latin-1"):
        try:
            return [(data.decode(encoding), encoding)]
        except UnicodeDecodeError:
            continue
    raise AssertionError("latin-1 decodes every byte")


def from_json(data: bytes) -> Texts | str:
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep
        return NOT_JSON
    if not isinstance(obj, dict):
        return NOT_JSON
    for field in TEXT_FIELDS:
        value = obj.get(field)
        values: list[object] = value if isinstance(value, list) else [value]
        strings = [v for v in values if isinstance(v, str)]
        if value is not None and values and len(strings) == len(values):
            if not all(_storable(v) for v in strings):
                return BINARY
            return [(v, f"json:{field}") for v in strings]
    return NO_FIELD


def _storable(text: str) -> bool:
    if "\0" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape
        return False
    return True
