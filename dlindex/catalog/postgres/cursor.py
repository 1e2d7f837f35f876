"""Cursors of a server catalog's connection: rows read the way dlindex reads sqlite3 cursors,
a streamed read (a server-side cursor), rows made by the client, a bulk call's row count."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

STREAM_ROWS = 2000  # rows a streamed read brings over per round trip


class PgCursor:
    """The rows of one statement, read the way dlindex reads sqlite3 cursors."""

    def __init__(self, cursor: Any, lastrowid: int | None = None) -> None:
        self._cursor = cursor
        self.lastrowid = lastrowid

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    @property
    def description(self) -> Any:
        return self._cursor.description

    def fetchone(self) -> tuple[Any, ...] | None:
        if self._cursor.description is None:
            return None
        row: tuple[Any, ...] | None = self._cursor.fetchone()
        return row

    def fetchmany(self, size: int = 256) -> list[tuple[Any, ...]]:
        if self._cursor.description is None:
            return []
        return list(self._cursor.fetchmany(size))

    def fetchall(self) -> list[tuple[Any, ...]]:
        if self._cursor.description is None:
            return []
        return list(self._cursor.fetchall())

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return self

    def __next__(self) -> tuple[Any, ...]:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    def close(self) -> None:
        self._cursor.close()


class Streamed(PgCursor):
    """A server-side cursor read STREAM_ROWS at a time, whatever batch the caller asks for."""

    def __init__(
        self, cursor: Any, on_close: Callable[[], None], statement: Callable[[bool], AbstractContextManager[None]]
    ) -> None:
        super().__init__(cursor)
        self._buffer: list[tuple[Any, ...]] = []
        self._at = 0
        self._on_close = on_close
        self._statement = statement  # each fetch is a round trip: its errors leave as a statement's

    def close(self) -> None:
        try:
            with self._statement(False):
                self._cursor.close()
        finally:
            self._on_close()

    def fetchmany(self, size: int = 256) -> list[tuple[Any, ...]]:
        if self._at >= len(self._buffer):
            with self._statement(False):
                fetched = list(self._cursor.fetchmany(max(size, STREAM_ROWS)))
            self._buffer, self._at = fetched, 0
        batch = self._buffer[self._at : self._at + size]
        self._at += len(batch)
        return batch

    def fetchone(self) -> tuple[Any, ...] | None:
        batch = self.fetchmany(1)
        return batch[0] if batch else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        with self._statement(False):
            rest = list(self._cursor.fetchall())
        rows = self._buffer[self._at :] + rest
        self._buffer, self._at = [], 0
        return rows


class Rows(PgCursor):
    """Rows made here, read like a cursor's."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self._rows = rows
        self.lastrowid = None

    @property
    def rowcount(self) -> int:
        return -1

    @property
    def description(self) -> Any:
        return None

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows.pop(0) if self._rows else None

    def fetchmany(self, size: int = 256) -> list[tuple[Any, ...]]:
        batch, self._rows = self._rows[:size], self._rows[size:]
        return batch

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.fetchmany(len(self._rows))

    def close(self) -> None:
        self._rows = []


class Counted(PgCursor):
    def __init__(self, cursor: Any, rows: int) -> None:
        super().__init__(cursor)
        self._total = rows

    @property
    def rowcount(self) -> int:
        return self._total
