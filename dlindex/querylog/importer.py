"""Captured SQL: its lines in bounded memory, its statements, and their import into the query log.

``dlindex log import`` stores them (never runs them); ``dlindex index --from`` reads them as a workload.
"""

from __future__ import annotations

import io
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

from dlindex.catalog.backend import Connection
from dlindex.catalog.fingerprint import SQL_COMMENT, SQL_STRING, fingerprint, table_of
from dlindex.errors import InputError

_INSERT_IMPORTED = """INSERT INTO query_log (kind, source, sql, fingerprint, table_name, calls, rows,
        duration_ms, plan, cached) VALUES (?, 'import', ?, ?, ?, 1, NULL, ?, NULL, 0)"""
_WRITE_VERBS = ("insert", "update", "delete", "replace")
_READ_VERBS = ("select", "with", "values")
_SKIP_VERBS = ("begin", "commit", "end", "rollback", "savepoint", "release")


@dataclass(frozen=True)
class ImportSummary:
    imported: int
    skipped: int
    skipped_lines: tuple[tuple[int, str], ...] = field(default=())  # (line, reason), first 20

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["skipped_lines"] = [{"line": n, "reason": r} for n, r in self.skipped_lines]
        return data


@dataclass(frozen=True)
class ParsedStatement:
    sql: str
    line: int  # where the statement starts in the input, 1-based
    duration_ms: float | None
    too_long: bool = False  # over MAX_STATEMENT_CHARS: ``sql`` is only its start


def statement_kind(sql: str) -> str | None:
    """'read', 'write', 'skip' (transaction control) or None (not a statement dlindex stores)."""
    words = re.sub(SQL_COMMENT, " ", sql).split(None, 1)
    verb = words[0].lower() if words else ""
    if verb == "with" and re.search(_WRITE_IN_WITH, sql):
        return "write"
    if verb in _READ_VERBS:
        return "read"
    if verb in _WRITE_VERBS:
        return "write"
    if verb in _SKIP_VERBS:
        return "skip"
    return None


_WRITE_IN_WITH = r"(?i)\b(?:insert\s+(?:or\s+\w+\s+)?into|replace\s+into|update\s+\S+\s+set|delete\s+from)\b"
_DURATION = r"(?i)--\s*duration_ms\s*=\s*([0-9]+(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?)"


def _duration(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None  # 1e999 is no duration


MAX_STATEMENT_CHARS = 1_000_000  # a longer statement is skipped (reported), never held whole
LineSource = str | Callable[[], Iterable[str]]  # text, or what opens its lines anew on each call


def iter_lines(source: LineSource) -> Iterator[str]:
    """The lines of ``source`` without their ends; a line longer than MAX_STATEMENT_CHARS is cut just past it."""
    if isinstance(source, str):
        # as a file read with universal newlines splits: \n, \r\n, \r (not str.splitlines' \x1e, \u2028 ...)
        lines = re.split(r"\r\n|\r|\n", source)
        yield from lines[:-1] if lines[-1] == "" else lines
        return
    for line in source():
        yield line.rstrip("\r\n")


def file_lines(path: str | os.PathLike[str]) -> LineSource:
    """A ``LineSource`` reading a file (UTF-8, bad bytes replaced) in bounded pieces, each time it is called.

    Raises:
        InputError: the file cannot be read.
    """
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise InputError(f"cannot read {os.fspath(path)}: {e.strerror or e}") from None

    def lines() -> Iterator[str]:
        try:
            with open(path, encoding="utf-8", errors="replace", newline=None) as f:
                yield from _bounded(f)
        except OSError as e:
            raise InputError(f"cannot read {os.fspath(path)}: {e.strerror or e}") from None

    return lines


def spooled_lines(stream: BinaryIO) -> LineSource:
    """A ``LineSource`` over a stream read once (stdin), kept in a temporary file rather than in memory."""
    # removed when closed or when the process ends; it outlives this call: each pass reads it
    spool = tempfile.TemporaryFile()  # noqa: SIM115
    try:
        shutil.copyfileobj(stream, spool, 1 << 20)
    except OSError as e:
        spool.close()
        raise InputError(f"cannot read stdin: {e.strerror or e}") from None

    def lines() -> Iterator[str]:
        spool.seek(0)
        text = io.TextIOWrapper(spool, encoding="utf-8", errors="replace", newline=None)
        try:
            yield from _bounded(text)
        finally:
            text.detach()  # the spool stays open for the next pass

    return lines


def _bounded(f: Any) -> Iterator[str]:
    limit = MAX_STATEMENT_CHARS + 1
    while True:
        line = f.readline(limit)
        if not line:
            return
        if len(line) == limit and not line.endswith("\n"):
            while (rest := f.readline(limit)) and not rest.endswith("\n"):
                pass  # the rest of an over-long line: it is skipped as too long anyway
        yield line


def parse_statements(source: LineSource) -> Iterator[ParsedStatement]:
    """Split captured SQL into statements: ``;``-separated, or one per line when no ``;`` ends any.

    Without semicolons, a line that does not begin (at its first column, outside parentheses)
    with a statement keyword continues the statement before it, so a multi-line statement
    dumped by ``set_trace_callback(print)`` stays whole. A ``-- duration_ms=N`` comment after a
    statement on its last line, or on its own line just before it, gives that statement's duration.
    ``source`` is read twice (is any line ended by ``;``?), in bounded memory: a statement
    longer than MAX_STATEMENT_CHARS comes back with ``too_long`` set and only its start.
    """
    has_semicolons = any(_ends_statement(line) for line in iter_lines(source))
    current: list[str] = []
    size = depth = 0
    start = 0
    duration: float | None = None
    pending: float | None = None  # from a comment line before the next statement
    for number, line in enumerate(iter_lines(source), start=1):
        code, comment = _split_comment(line)
        found = re.search(_DURATION, comment) if comment else None
        if not code.strip():
            if found:
                pending = _duration(found.group(1))
            continue
        # Open parentheses continue a statement only into a subquery right after "(": a
        # garbage line with an unclosed "(" must not swallow the rest of the file.
        if (
            current
            and not has_semicolons
            and re.match(_STATEMENT_START, code)
            and (depth <= 0 or not current[-1].rstrip().endswith("("))
        ):
            yield _statement(current, start, duration, size > MAX_STATEMENT_CHARS)
            current, size, depth = [], 0, 0
        if not current:
            start, duration, pending = number, pending, None
        size += len(code) + 1
        depth += _depth(code)
        if size <= MAX_STATEMENT_CHARS:
            current.append(code)
        else:  # its start for the report; its last character says whether a subquery follows
            current = [(current[0] if current else code)[:200], code[-1:]]
        if found:
            duration = _duration(found.group(1))
        if has_semicolons and code.rstrip().endswith(";"):
            yield _statement(current, start, duration, size > MAX_STATEMENT_CHARS)
            current, size, depth = [], 0, 0
    if current:
        yield _statement(current, start, duration, size > MAX_STATEMENT_CHARS)


_STATEMENT_START = (
    r"(?i)(?:select|with|values|insert|update|delete|replace|begin|commit|end|rollback|savepoint|release|pragma"
    r"|create|drop|alter|attach|detach|analyze|vacuum|reindex|explain)\b"
)


def _statement(lines: list[str], start: int, duration: float | None, too_long: bool) -> ParsedStatement:
    if too_long:
        return ParsedStatement(lines[0].strip()[:200], start, duration, too_long=True)
    return ParsedStatement(" ".join(part.strip() for part in lines).strip().rstrip(";").strip(), start, duration)


def _depth(line: str) -> int:
    """Parentheses this line opens (strings on the line left out; counted line by line, in linear time)."""
    text = re.sub(SQL_STRING, "", line)
    return text.count("(") - text.count(")")


def _split_comment(line: str) -> tuple[str, str]:
    """(code, trailing -- comment) of one line, with quotes respected."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in ("'", '"'):
            quote = ch
        elif ch == "-" and line.startswith("--", i):
            return line[:i], line[i:]
    return line, ""


def _ends_statement(line: str) -> bool:
    return _split_comment(line)[0].rstrip().endswith(";")


def import_statements(conn: Connection, statements: Iterable[ParsedStatement]) -> ImportSummary:
    """Store captured statements as ``source = 'import'`` log entries; nothing is executed.

    ``conn`` must be inside a write transaction.
    """
    skipped: list[tuple[int, str]] = []
    counts = [0, 0]  # imported, skipped

    def rows() -> Iterator[tuple[Any, ...]]:
        for statement in statements:
            kind = statement_kind(statement.sql)
            if statement.too_long:
                reason = f"longer than {MAX_STATEMENT_CHARS:,} characters"
            elif kind is None or kind == "skip" or ";" in re.sub(SQL_STRING, "", statement.sql):
                reason = "not a single SELECT, INSERT, UPDATE or DELETE statement"
            else:
                counts[0] += 1
                yield (kind, statement.sql, fingerprint(statement.sql), table_of(statement.sql), statement.duration_ms)
                continue
            counts[1] += 1
            if (kind != "skip" or statement.too_long) and len(skipped) < 20:
                skipped.append((statement.line, reason))

    conn.executemany(_INSERT_IMPORTED, rows())  # streamed: a long trace is never held whole
    return ImportSummary(imported=counts[0], skipped=counts[1], skipped_lines=tuple(skipped))
