"""A catalog file's rows as Arrow record batches, read in C by the ADBC SQLite driver.

Python's sqlite3 makes a tuple of Python objects a row (~1.5 µs a row of ten columns), and
pyarrow then copies them back into columns (~1.5 µs more): together over half of a parquet
manifest's time. The ADBC driver steps the same statement and fills Arrow arrays directly
(~0.7 µs a row, measured on the 10^6-row benchmark catalog), so a caller that wants columns
(``dlindex export --format parquet``) gets them without a Python object per value.

The driver types each column from its first batch of rows (a column NULL throughout that
batch becomes int64, and a text in a later batch is then an error): so the statement is read
wrapped, each text or blob column as its value with ``''`` for NULL plus a flag, and the NULLs
put back in Arrow. The named parameters are bound by position, each at the index SQLite gave
it (the statement's own ``Variable`` opcodes say which). Anything this reader cannot do --
the driver is not installed, the file cannot be opened read-only, a parameter it cannot bind --
returns None before a row is read, and the caller reads the rows as tuples instead.
"""

from __future__ import annotations

import re
import sqlite3
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Any

#: the kinds of column a caller asks for: how each is read and what Arrow type it becomes
KINDS = ("int", "text", "blob")
_BATCH_ROWS = 65_536  # rows a batch: ~20 MB of a manifest's columns
_EXPLAIN = "EXPLAIN "
_COLUMN_PLACE = re.compile(r"column (\d+)")  # how the driver names a column in its errors


class ArrowReadError(Exception):
    """The driver failed after the first batch: the rows stop here (its message, one line)."""


def open_batches(
    conn: Any, path: Path | str, sql: str, params: Mapping[str, Any], columns: Sequence[tuple[str, str]]
) -> Iterator[Any] | None:
    """The rows of ``sql`` (its columns in ``columns`` order: (name, kind)) as Arrow record
    batches named by ``columns``, or None where they cannot be read this way. ``conn`` (the
    catalog's own connection) only explains the statement; the rows are read by a read-only
    connection of the driver's, in a snapshot of their own."""
    try:
        # the driver's own handles, not its DB-API layer: that one imports pyarrow.dataset (~0.2 s)
        import adbc_driver_manager
        import adbc_driver_sqlite
        import pyarrow as pa
        import pyarrow.compute as pc
    except ImportError:
        return None
    values = _positional(conn, sql, params)
    if values is None:
        return None
    handles: list[Any] = []  # opened in order, closed in reverse (the driver refuses another order)
    try:
        handles.append(adbc_driver_sqlite.connect(_uri(path)))
        handles.append(adbc_driver_manager.AdbcConnection(handles[0]))
        statement = adbc_driver_manager.AdbcStatement(handles[1])
        handles.append(statement)
        statement.set_options(**{"adbc.sqlite.query.batch_rows": str(_BATCH_ROWS)})
        statement.set_sql_query(_wrapped(sql, columns))
        if values:
            statement.bind(pa.record_batch([pa.array([v]) for v in values], names=[str(k) for k in range(len(values))]))
        stream, _ = statement.execute_query()
        reader = pa.RecordBatchReader.from_stream(stream)
        handles.append(reader)
        first = next(reader, None)
    except Exception:  # the driver's errors have no common base: read as tuples, whose errors are dlindex's
        _close(*reversed(handles))
        return None
    return _batches(handles, reader, first, columns, pa, pc)


def _batches(
    handles: list[Any], reader: Any, first: Any, columns: Sequence[tuple[str, str]], pa: Any, pc: Any
) -> Iterator[Any]:
    """The batches, each read (and its NULLs put back) on a thread of its own while the caller
    works on the one before (the driver and Arrow's kernels run without Python's lock); then
    ``handles`` (the driver's database, connection, statement and the stream's reader) closed,
    last first, once no read is in flight."""

    def read() -> Any:
        try:
            batch = next(reader, None)
        except Exception as e:  # the driver's error, as one line
            raise ArrowReadError(_said(e, columns)) from None
        return None if batch is None else _restored(batch, columns, pa, pc)

    pool = ThreadPoolExecutor(1, thread_name_prefix="dlindex-arrow")
    ahead: Future[Any] | None = None
    try:
        batch = _restored(first, columns, pa, pc) if first is not None else None
        while batch is not None:
            ahead = pool.submit(read)
            yield batch
            batch, ahead = ahead.result(), None
    finally:
        if ahead is not None:
            with suppress(Exception):
                ahead.result()  # the reader is the thread's until its read ends
        pool.shutdown()
        _close(*reversed(handles))


def _close(*handles: Any) -> None:
    """Each handle closed, whatever the one before did."""
    for handle in handles:
        with suppress(Exception):
            handle.close()


def _said(error: Exception, columns: Sequence[tuple[str, str]]) -> str:
    """The driver's error in one line, a column it names by its place in the wrapped
    statement named as the caller's column."""
    text = (str(error).splitlines() or [type(error).__name__])[0]
    places = [name for name, kind in columns for name in ((name,) if kind == "int" else (name, name))]

    def named(match: re.Match[str]) -> str:
        k = int(match.group(1))
        return f"column {places[k]!r}" if k < len(places) else match.group(0)

    return _COLUMN_PLACE.sub(named, text)


def _restored(batch: Any, columns: Sequence[tuple[str, str]], pa: Any, pc: Any) -> Any:
    """The wrapped statement's batch as the caller's columns: NULLs put back, text checked."""
    arrays = []
    k = 0
    for name, kind in columns:
        value = batch.column(k)
        k += 1
        if kind == "int":
            if value.type != pa.int64():  # every value NULL here: int64 already; a REAL is not an int
                if value.null_count != len(value):
                    raise ArrowReadError(f"column {name!r} holds a value that is not an integer")
                value = pa.nulls(len(value), pa.int64())
        else:
            is_null = batch.column(k)
            k += 1
            wanted = pa.string() if kind == "text" else pa.binary()
            if value.type != wanted:
                raise ArrowReadError(f"column {name!r} holds a value that is not {kind}")
            if kind == "text":
                try:
                    value.validate(full=True)  # SQLite keeps any bytes as text; Arrow strings are UTF-8
                except pa.ArrowInvalid:
                    raise ArrowReadError(f"column {name!r} holds text that is not UTF-8") from None
            if is_null.type != pa.int64():
                raise ArrowReadError(f"column {name!r}: unexpected NULL flag")
            if pc.max(is_null).as_py():
                value = pc.if_else(pc.cast(is_null, pa.bool_()), pa.scalar(None, wanted), value)
        arrays.append(value)
    return pa.RecordBatch.from_arrays(arrays, names=[name for name, _ in columns])


def _wrapped(sql: str, columns: Sequence[tuple[str, str]]) -> str:
    """``sql`` read by position (a CTE's column list), each text or blob column as its value
    and a NULL flag; the statement's own order is kept, as every wrapper of a query keeps it."""
    names = [f"c{k}" for k in range(len(columns))]
    picked: list[str] = []
    for name, (_, kind) in zip(names, columns, strict=True):
        if kind not in KINDS:
            raise ValueError(f"unknown column kind {kind!r}")
        if kind == "int":
            picked.append(name)
        else:
            empty = "''" if kind == "text" else "x''"
            picked.append(f"coalesce({name}, {empty})")
            picked.append(f"{name} IS NULL")
    return f"WITH selected({', '.join(names)}) AS ({sql}) SELECT {', '.join(picked)} FROM selected"


def _positional(conn: Any, sql: str, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """``params`` in the order of the indexes SQLite gives the statement's named parameters
    (each ``Variable`` opcode names its index and parameter), or None where some index has no
    value here (a positional ``?``, a name missing from ``params``)."""
    if not params:
        return ()
    names: dict[int, str] = {}
    try:
        program = conn.execute(_EXPLAIN + sql, dict(params)).fetchall()
    except sqlite3.Error:  # a parameter without a value here: the tuples path says so
        return None
    for row in program:
        if row[1] == "Variable" and isinstance(row[5], str):
            names[int(row[2])] = row[5]
    if not names:
        return None
    ordered: list[Any] = []
    for index in range(1, max(names) + 1):
        name = names.get(index)
        key = name[1:] if name else None
        if key is None or key not in params or not isinstance(params[key], int | float | str | bytes):
            return None  # a NULL or odd value: its type cannot be bound from Python by the driver
        ordered.append(params[key])
    return tuple(ordered)


def _uri(path: Path | str) -> str:
    """A read-only URI for the file (its name quoted: ``?`` or ``#`` in a path are not a query)."""
    return "file:" + urllib.parse.quote(str(Path(path).resolve())) + "?mode=ro"
