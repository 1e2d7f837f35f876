"""``mark``: set processed flags, processing states and exclusion for many samples at once.

Input records (sample ids, paths, or JSON objects carrying ``id``, ``path`` or
``file_path``) are parsed and staged into temporary tables first, without touching the
catalog, so a malformed record aborts with nothing changed and a slow producer upstream
never holds the write lock. Then one write transaction resolves them with set-based
statements (a join, never one statement per sample) and updates only rows whose values
change; a mark of more than ``BATCH_SAMPLES`` samples commits in batches by id instead
(mark_apply.py).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

from dlindex.catalog.paths import path_key, root_prefixes
from dlindex.catalog.sqlite.connect import INT64_MAX, INT64_MIN, rollback
from dlindex.catalog.versions import command_text, summary_of
from dlindex.errors import InputError, UsageError, did_you_mean
from dlindex.query.mark_apply import BATCH_SAMPLES, apply_marks
from dlindex.query.spec import PROCESSING_FILTERS, STATUSES

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

_CREATE_IDS = "CREATE TEMP TABLE IF NOT EXISTS mark_ids (id INTEGER PRIMARY KEY)"
_CREATE_PATHS = (
    "CREATE TEMP TABLE IF NOT EXISTS mark_paths (root_id INTEGER NOT NULL, file_path TEXT NOT NULL, "
    "PRIMARY KEY (root_id, file_path)) WITHOUT ROWID"
)
_STAGE_IDS = "INSERT OR IGNORE INTO temp.mark_ids (id) SELECT value FROM json_each(:ids)"
_STAGE_PATH = "INSERT OR IGNORE INTO temp.mark_paths (root_id, file_path) VALUES (?, ?)"
_SET = {
    "processed": "processed = :processed",
    "processing_status": "processing_status = :processing_status",
    "error": "error = :error",
    "excluded": "excluded = :excluded",
}
_CHANGED = {
    "processed": "processed IS NOT :processed",
    "processing_status": "processing_status IS NOT :processing_status",
    "error": "error IS NOT :error",
    "excluded": "excluded IS NOT :excluded",
}

_STAGE_BATCH = 100_000
# One record holds one id or path (PATH_MAX is 4 KiB) or a query row as JSON: a line longer
# than this is not a record, and must not be read into memory whole.
MAX_RECORD_BYTES = 1 << 20
_SHOWN = 40  # characters of a bad value quoted in a message
_MAX_NESTING = 32
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DECIMAL = re.compile(rb"\A\s*[+-]?[0-9]+\s*\Z")
BY = ("id", "path")


@dataclass(frozen=True)
class MarkResult:
    """What one ``mark`` did: inputs are non-blank records, the rest count distinct samples."""

    inputs: int
    matched: int
    updated: int
    unknown: int
    seconds: float
    unknown_examples: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["unknown_examples"] = list(self.unknown_examples)
        return data


def mark_samples(
    catalog: Catalog,
    records: Iterable[bytes | str],
    *,
    processed: bool | None = None,
    processing_status: str | None = None,
    error: str | None = None,
    excluded: bool | None = None,
    by: str = "id",
    batch: int | None = None,
) -> MarkResult:
    """Update the samples named by ``records``; see docs/commands/mark.md.

    Up to ``batch`` samples (default ``BATCH_SAMPLES``, 262,144) are one transaction: all
    updated or none. A larger mark commits in batches of ``batch`` samples in id order; one
    stopped part way keeps the batches it committed, and running it again finishes it.

    Args:
        records: one sample per item: an id (``by="id"``), a path (``by="path"``: absolute,
            or relative to its root as ``file_path``), or a JSON object with ``id``, ``path``
            or ``file_path``. Blank records are skipped; a trailing newline is ignored.
        processed: set the processed flag to this value.
        processing_status: set processing_status (queued, completed or failed; none clears it).
            Not scan's ``status`` (ok, corrupt, missing), which only scan sets.
        error: set the error text.
        excluded: True leaves the samples out of every selection (query, export, the loader)
            until marked False again.
        batch: samples per write transaction of a large mark.

    Raises:
        InputError: a malformed record (named by its 1-based line number); nothing changed.
        Interrupted: Ctrl-C after some batches of a large mark were committed (they stay).
    """
    started = time.perf_counter()
    values: dict[str, Any] = {}
    if processed is not None:
        values["processed"] = int(bool(processed))
    if processing_status is not None:
        if processing_status not in PROCESSING_FILTERS:
            raise UsageError(_not_a_processing_status(processing_status))
        values["processing_status"] = None if processing_status == "none" else processing_status
    if excluded is not None:
        values["excluded"] = int(bool(excluded))
    if error is not None:
        values["error"] = error
    if not {"processed", "processing_status", "excluded"} & set(values):
        raise InputError("nothing to set: give --processed, --unprocessed, --processing-status, --exclude or --include")
    if by not in BY:
        raise InputError(f"unknown --by {by!r}; choose id or path")
    conn = catalog.conn
    conn.execute(_CREATE_IDS)
    conn.execute(_CREATE_PATHS)
    try:
        inputs = _stage(catalog, records, by)
        set_sql = ", ".join(_SET[k] for k in values)
        changed_sql = " OR ".join(_CHANGED[k] for k in values)
        with catalog.versioned(command_text("mark", *(f"{k}={values[k]}" for k in sorted(values)))) as version:
            done = apply_marks(catalog, values, set_sql, changed_sql, batch=max(1, batch or BATCH_SAMPLES))
            version.summary = summary_of({"updated": done.updated})
    finally:
        catalog.backend.end_temp_table(conn, "mark_ids")
        catalog.backend.end_temp_table(conn, "mark_paths")
    return MarkResult(
        inputs=inputs, matched=done.matched, updated=done.updated, unknown=done.unknown,
        seconds=round(time.perf_counter() - started, 3), unknown_examples=tuple(done.examples),
    )  # fmt: skip


def _not_a_processing_status(value: str) -> str:
    sets = "mark --processing-status sets queued, completed or failed (none clears it)"
    if value in STATUSES:
        return (
            f"{value!r} is a scan status, which only scan sets; {sets}; mark --exclude leaves samples out of training"
        )
    return f"unknown processing status {value[:40]!r}{did_you_mean(value, PROCESSING_FILTERS)}; {sets}"


def _stage(catalog: Catalog, records: Iterable[bytes | str], by: str) -> int:
    """Parse every record into the temporary tables; return how many were not blank."""
    conn = catalog.conn
    roots = root_prefixes(catalog.conn)
    inputs = 0
    done = 0  # records read before this chunk: line numbers in messages count from here
    stream = iter(records)
    conn.execute("BEGIN")  # temporary tables only: no lock on the catalog is taken
    try:
        while chunk := list(islice(stream, _STAGE_BATCH)):
            ids: list[int] | None = None
            if by == "id":
                try:  # the fast path: int() ignores spaces and the newline (but takes 1_000)
                    if b"_" not in b"".join(chunk):  # type: ignore[arg-type]
                        ids = list(map(int, chunk))
                except (TypeError, ValueError):  # str records, or not all plain ids
                    pass
                if ids and not INT64_MIN <= min(ids) <= max(ids) <= INT64_MAX:
                    ids = None
            if ids is not None:
                inputs += len(ids)
                paths: list[tuple[int, str]] = []
            else:
                ids, paths = [], []
                for number, record in enumerate(chunk, start=done + 1):
                    raw = record.encode("utf-8", "surrogateescape") if isinstance(record, str) else record
                    raw = raw.rstrip(b"\r\n")
                    if not raw.strip():
                        continue
                    inputs += 1
                    target = _parse(raw, number, by, roots)
                    if isinstance(target, int):
                        ids.append(target)
                    else:
                        paths.append(target)
            done += len(chunk)
            if ids:
                # One statement per chunk: SQLite parses the JSON array, no Python loop per id.
                conn.execute(_STAGE_IDS, (json.dumps(ids),))
            if paths:
                conn.executemany(_STAGE_PATH, paths)
    except BaseException:
        rollback(conn)  # never "cannot rollback - no transaction is active" over the real cause
        raise
    conn.execute("COMMIT")
    return inputs


def _parse(raw: bytes, number: int, by: str, roots: list[tuple[bytes, int]]) -> int | tuple[int, str]:
    text = raw.strip()
    if text.startswith(b"{"):
        obj = _json_object(text, number)
        if "id" in obj:
            id_ = obj["id"]
            if not isinstance(id_, int) or isinstance(id_, bool) or not INT64_MIN <= id_ <= INT64_MAX:
                raise InputError(
                    f'line {number}: "id" must be a 64-bit integer, not {_shown(id_)}; nothing was changed'
                )
            return id_
        for key in ("path", "file_path"):
            path = obj.get(key)
            if path is not None:
                if not isinstance(path, str) or not path:
                    raise InputError(
                        f'line {number}: "{key}" must be a non-empty string, not {_shown(path)}; nothing was changed'
                    )
                try:
                    # \udc80-\udcff stand for the bytes of a non-UTF-8 name, as `query --format jsonl` writes them
                    name = os.fsencode(path)
                except UnicodeEncodeError:
                    raise InputError(
                        f'line {number}: "{key}" holds a lone surrogate ({_shown(path)}), which names no file; nothing was changed'
                    ) from None
                if b"\0" in name:
                    raise InputError(
                        f'line {number}: "{key}" holds a NUL character, which names no file; nothing was changed'
                    )
                if key == "file_path":
                    return 0, path  # the catalog key itself, stand-ins included: not a name to key again
                return _resolve(name, roots)
        raise InputError(f'line {number}: a JSON object needs "id", "path" or "file_path"; nothing was changed')
    if by == "id":
        decimal = _DECIMAL.match(text) is not None
        if decimal and len(text) <= 24:  # longer is out of range (and int() limits digits)
            value = int(text)
            if INT64_MIN <= value <= INT64_MAX:
                return value
        what = (
            "is outside the 64-bit range of sample ids" if decimal else "is not a sample id (for paths use --by path)"
        )
        shown = text[:_SHOWN].decode("utf-8", "backslashreplace") + ("..." if len(text) > _SHOWN else "")
        raise InputError(f"line {number}: {shown!r} {what}; nothing was changed")
    return _resolve(raw, roots)


def _json_object(text: bytes, number: int) -> dict[str, Any]:
    if _nesting(text) > _MAX_NESTING:
        raise InputError(f"line {number}: JSON nested more than {_MAX_NESTING} levels deep; nothing was changed")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"line {number}: not valid JSON ({e.msg}); nothing was changed") from None
    except UnicodeDecodeError:
        raise InputError(f"line {number}: a JSON line must be UTF-8; nothing was changed") from None
    except ValueError as e:  # Python's own limit on digits in one integer
        raise InputError(f"line {number}: not a usable JSON value ({e}); nothing was changed") from None
    if not isinstance(obj, dict):
        raise InputError(f"line {number}: expected a JSON object; nothing was changed")
    return obj


def _nesting(text: bytes) -> int:
    """An upper bound on the JSON nesting depth (brackets in strings count too): json.loads
    recurses once per level, and a line of 100,000 '[' would exhaust the stack."""
    if text.count(b"[") + text.count(b"{") <= _MAX_NESTING:
        return 0
    depth = deepest = 0
    for byte in text.translate(None, _NOT_BRACKETS):
        depth += 1 if byte in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _shown(value: Any) -> str:
    shown = repr(value) if not isinstance(value, str) else ascii(value)
    return shown if len(shown) <= _SHOWN else shown[:_SHOWN] + "..."


def _resolve(path: bytes, roots: list[tuple[bytes, int]]) -> tuple[int, str]:
    """(root_id, file_path) for a path: 0 for a relative one (any root), -1 under no known root."""
    root_id, key = path_key(path, roots)
    return (0 if root_id is None else root_id), key


def read_records(stream: Any, null: bool = False, chunk_size: int = 1 << 16) -> Iterator[bytes]:
    """Records from a binary stream: lines (without their newline), or NUL-separated with
    ``null``; streamed in chunks, split in C.

    Raises:
        InputError: a record longer than MAX_RECORD_BYTES (never read whole into memory).
    """
    separator = b"\0" if null else b"\n"
    rest = b""
    number = 0  # records yielded so far
    while chunk := stream.read(chunk_size):
        data = rest + chunk
        parts = data.split(separator)
        rest = parts.pop()
        if len(data) > MAX_RECORD_BYTES:  # only then can a part be too long
            for k, part in enumerate(parts, start=number + 1):
                if len(part) > MAX_RECORD_BYTES:
                    raise _too_long(k)
            if len(rest) > MAX_RECORD_BYTES:
                raise _too_long(number + len(parts) + 1)
        number += len(parts)
        yield from parts
    if rest:
        yield rest


def _too_long(number: int) -> InputError:
    return InputError(
        f"line {number}: longer than {MAX_RECORD_BYTES:,} bytes, not an id, path or JSON line; nothing was changed"
    )
