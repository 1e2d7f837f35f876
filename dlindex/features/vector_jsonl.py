"""JSONL files of vectors for ``features import``: checked line by line as they stream.

Each line is an object with ``"id"`` (a 64-bit integer) or ``"file_path"`` (a file name:
JSON can spell lone surrogates, which no file name holds) and the vector column; lines,
rows and the memory they take are bounded before each is kept.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from dlindex.catalog.sqlite.connect import INT64_MAX, INT64_MIN
from dlindex.errors import InputError
from dlindex.features.loaded import Loaded, check_rows, one_line

_ROW_OVERHEAD = 160  # bytes a parsed JSONL row costs beyond its values


def read_jsonl(path: Path, column: str, max_bytes: int, max_rows: int | None) -> Loaded:
    """Keys and vectors of a JSONL file, one object a line, checked as it streams."""
    keys: list[Any] = []
    rows: list[npt.NDArray[np.float64]] = []
    by_path: bool | None = None
    held = 0
    with open(path, "rb") as f:
        for number, line in enumerate(_lines(f, max_bytes, path), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as e:
                raise InputError(f"{path}, line {number}: not valid JSON ({one_line(e)})") from None
            if not isinstance(obj, dict) or column not in obj or ("id" not in obj and "file_path" not in obj):
                raise InputError(f'{path}, line {number}: expected an object with "id" or "file_path" and {column!r}')
            this_by_path = "id" not in obj
            if by_path is not None and this_by_path != by_path:
                raise InputError(f'{path}, line {number}: mixes "id" and "file_path" keys')
            by_path = this_by_path
            key = obj["file_path"] if by_path else obj["id"]
            if by_path and (not isinstance(key, str) or not key):
                raise InputError(f'{path}, line {number}: "file_path" must be a non-empty string')
            if by_path and not _encodable(key):
                raise InputError(f'{path}, line {number}: "file_path" {key!r} is no file name (a lone surrogate)')
            if not by_path and (not isinstance(key, int) or isinstance(key, bool) or not INT64_MIN <= key <= INT64_MAX):
                raise InputError(f'{path}, line {number}: "id" must be a 64-bit integer, not {str(key)[:40]}')
            vector = obj[column]
            if not isinstance(vector, list) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in vector
            ):
                raise InputError(f"{path}, line {number}: {column!r} must be a list of numbers")
            if rows and len(vector) != len(rows[0]):
                raise InputError(f"{path}, line {number}: {len(vector)} values, line 1 has {len(rows[0])}")
            try:
                row = np.array(vector, dtype=np.float64)
            except OverflowError:  # an integer too large for a float
                raise InputError(f"{path}, line {number}: a value of {column!r} is too large") from None
            held += row.nbytes + _ROW_OVERHEAD
            if held > max_bytes:
                raise InputError(f"{path}: decodes to more than the import limit of {max_bytes:,} bytes")
            check_rows(len(rows) + 1, max_rows, str(path))
            keys.append(key)
            rows.append(row)
    if not rows or not rows[0].size:
        raise InputError(f"{path} holds no vectors")
    return Loaded(keys if by_path else np.asarray(keys, dtype=np.int64), np.stack(rows))


def _encodable(text: str) -> bool:
    """Whether a path read from JSON is a file name: JSON's \\ud800 escapes give lone surrogates,
    which no file name (nor UTF-8) holds, except the ones os.fsdecode makes of undecodable bytes."""
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return False
    return True


def _lines(f: IO[bytes], max_bytes: int, path: Path) -> Iterator[bytes]:
    """Lines of a binary file, none longer than ``max_bytes`` (a line is held whole)."""
    limit = max(1, min(max_bytes, 1 << 30))
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        if len(line) > limit and not line.endswith(b"\n"):
            raise InputError(f"{path}: a line is longer than {limit:,} bytes")
        yield line
