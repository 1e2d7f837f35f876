"""The records of a ``text import`` file: (where, key, texts), read one at a time.

CSV/TSV (a header row), JSONL, JSON (a list of objects, or COCO captions: ``images`` with
``id`` and ``file_name``, ``annotations`` with ``image_id`` and ``caption``) and Parquet. A
record's key is a sample id (an integer) or a path (absolute, or relative to its root); its
text field holds a string or a list of strings. The fields are found by name (``KEY_FIELDS``,
``TEXT_FIELDS``) unless the user names them. Every size is bounded before it is held: a line
of JSONL, a CSV field, a whole JSON file, one text (docs/text.md#import).
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dlindex.catalog.texts import MAX_TEXT_BYTES
from dlindex.errors import InputError
from dlindex.query.mark import read_records

KEY_FIELDS = ("id", "path", "file_path", "file_name", "filename", "image", "image_path")
TEXT_FIELDS = ("text", "caption", "captions", "description", "alt_text", "alt", "title")
FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet"}
# A whole JSON file is parsed at once (COCO captions of train2017: 92 MB; Python's objects for
# it take several times the file); past this, JSONL, which is read a line at a time.
MAX_JSON_BYTES = 128 << 20
_SHOWN = 60

Record = tuple[str, int | str, list[str]]  # where (for messages), key, texts


def file_format(path: Path, given: str | None) -> str:
    if given is not None:
        if given not in FORMATS.values():
            raise InputError(f"unknown --format {given!r}; choose from: csv, tsv, jsonl, json, parquet")
        return given
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InputError(
            f"{path}: cannot tell the format from its suffix; name it with --format csv|tsv|jsonl|json|parquet"
        )
    return fmt


def read_file(path: Path, fmt: str, key_field: str | None, text_field: str | None) -> Iterator[Record]:
    """Every record of ``path``; raises InputError naming the line or item of a bad one."""
    try:
        if fmt in ("csv", "tsv"):
            yield from _csv(path, "\t" if fmt == "tsv" else ",", key_field, text_field)
        elif fmt == "jsonl":
            yield from _jsonl(path, key_field, text_field)
        elif fmt == "json":
            yield from _json(path, key_field, text_field)
        else:
            yield from _parquet(path, key_field, text_field)
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start} of a block: {e.reason})") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a folder; give a file") from None
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None


def _pick(fields: Sequence[str], given: str | None, known: tuple[str, ...], what: str, path: Path | str) -> str:
    if given is not None:
        if given not in fields:
            raise InputError(f"{path}: no field {given!r}; it has: {', '.join(map(str, fields[:20]))}")
        return given
    for name in known:
        if name in fields:
            return name
    option = "--key" if what == "key" else "--field"
    raise InputError(
        f"{path}: no {what} field ({', '.join(known)}); name it with {option} (it has: {', '.join(map(str, fields[:20]))})"
    )


def _csv(path: Path, delimiter: str, key_field: str | None, text_field: str | None) -> Iterator[Record]:
    csv.field_size_limit(MAX_TEXT_BYTES + 1)  # characters: a field past it is refused, never held
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter)
        try:
            header = next(reader, None)
            if header is None:
                return
            key = header.index(_pick(header, key_field, KEY_FIELDS, "key", path))
            text = header.index(_pick(header, text_field, TEXT_FIELDS, "text", path))
            for row in reader:
                where = f"{path}, line {reader.line_num}"
                if not row:
                    continue
                if len(row) != len(header):
                    raise InputError(f"{where}: {len(row)} fields, the header has {len(header)}")
                yield where, _key(row[key], where, header[key] == "id"), [_text(row[text], where)]
        except csv.Error as e:
            raise InputError(f"{path}, line {reader.line_num}: not valid CSV ({e})") from None


def _jsonl(path: Path, key_field: str | None, text_field: str | None) -> Iterator[Record]:
    with open(path, "rb") as f:
        for number, line in enumerate(read_records(f), start=1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            yield _from_object(_loads(line, where), where, key_field, text_field)


def _json(path: Path, key_field: str | None, text_field: str | None) -> Iterator[Record]:
    size = os.stat(path).st_size
    if size > MAX_JSON_BYTES:
        raise InputError(f"{path} is {size:,} bytes; a JSON file is read whole, up to {MAX_JSON_BYTES:,}: use JSONL")
    with open(path, "rb") as f:
        data = _loads(f.read(), str(path))
    if isinstance(data, dict) and "annotations" in data and "images" in data:
        yield from _coco(data, path)
        return
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a list of objects, or COCO captions (images and annotations)")
    for number, item in enumerate(data, start=1):
        where = f"{path}, item {number}"
        yield _from_object(item, where, key_field, text_field)


def _coco(data: dict[str, Any], path: Path) -> Iterator[Record]:
    names: dict[Any, str] = {}
    for number, image in enumerate(_list(data, "images", path), start=1):
        if not isinstance(image, dict) or not isinstance(image.get("file_name"), str) or "id" not in image:
            raise InputError(f'{path}, images item {number}: expected an object with "id" and "file_name"')
        names[image["id"]] = image["file_name"]
    for number, note in enumerate(_list(data, "annotations", path), start=1):
        where = f"{path}, annotations item {number}"
        if not isinstance(note, dict) or "image_id" not in note or "caption" not in note:
            raise InputError(f'{where}: expected an object with "image_id" and "caption"')
        name = names.get(note["image_id"])
        if name is None:
            raise InputError(f"{where}: image_id {_shown(note['image_id'])} is not in the file's images")
        yield where, _key(name, where, False), [_text(note["caption"], where)]


def _list(data: dict[str, Any], name: str, path: Path) -> list[Any]:
    value = data[name]
    if not isinstance(value, list):
        raise InputError(f'{path}: "{name}" must be a list')
    return value


def _parquet(path: Path, key_field: str | None, text_field: str | None) -> Iterator[Record]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError("importing texts from Parquet needs pyarrow: pip install 'dlindex[export]'") from None
    try:
        source = pq.ParquetFile(path)
        names = list(source.schema_arrow.names)
        key = _pick(names, key_field, KEY_FIELDS, "key", path)
        text = _pick(names, text_field, TEXT_FIELDS, "text", path)
        row = 0
        for batch in source.iter_batches(batch_size=4096, columns=[key, text]):
            for key_value, text_value in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True):
                row += 1
                where = f"{path}, row {row}"
                yield where, _key(key_value, where, key == "id"), _texts(text_value, where)
    except InputError:
        raise
    except Exception as e:  # pyarrow's own errors on a damaged or foreign file
        raise InputError(f"{path}: not a readable Parquet file ({type(e).__name__}: {str(e)[:200]})") from None


def _loads(raw: bytes, where: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: not valid JSON ({e.msg}, at character {e.pos})") from None
    except RecursionError:
        raise InputError(f"{where}: JSON nested too deeply") from None
    except ValueError as e:  # not UTF-8, or Python's limit on an integer's digits
        raise InputError(f"{where}: not usable JSON ({str(e)[:120]})") from None


def _from_object(obj: Any, where: str, key_field: str | None, text_field: str | None) -> Record:
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, not {type(obj).__name__}")
    fields = list(obj)
    key = _pick(fields, key_field, KEY_FIELDS, "key", where)
    text = _pick(fields, text_field, TEXT_FIELDS, "text", where)
    return where, _key(obj[key], where, key == "id"), _texts(obj[text], where)


def _key(value: Any, where: str, is_id: bool) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip():
        if is_id:
            try:
                return int(value)
            except ValueError:
                raise InputError(f"{where}: id {_shown(value)} is not a whole number") from None
        if "\0" in value:
            raise InputError(f"{where}: the path holds a NUL character, which names no file")
        try:
            os.fsencode(value)
        except UnicodeEncodeError:
            raise InputError(f"{where}: the path {_shown(value)} holds a lone surrogate, which names no file") from None
        return value
    raise InputError(f"{where}: the key must be a sample id or a path, not {_shown(value)}")


def _texts(value: Any, where: str) -> list[str]:
    if isinstance(value, list):
        if len(value) > 1000:
            raise InputError(f"{where}: {len(value):,} texts for one sample; at most 1,000")
        return [_text(v, where) for v in value]
    return [_text(value, where)]


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"{where}: a text must be a string, not {_shown(value)}")
    if "\0" in value:
        raise InputError(f"{where}: the text holds a NUL character")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InputError(f"{where}: the text holds a lone surrogate ({_shown(value)}), which is no character") from None
    if size > MAX_TEXT_BYTES:
        raise InputError(f"{where}: the text is {size:,} bytes; a text is at most {MAX_TEXT_BYTES:,}")
    return value


def _shown(value: Any) -> str:
    shown = ascii(value)
    return shown if len(shown) <= _SHOWN else shown[:_SHOWN] + "..."
