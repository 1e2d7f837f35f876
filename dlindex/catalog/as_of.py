"""Reading the catalog as it stood at an earlier state: ``--at VERSION|TAG|EXPORT``.

A connection *pinned* to state S gets two temporary views named like the tables they stand
for, ``image_metadata`` and ``labels``, holding the rows and labels of state S (the live rows
written by then, and the history rows that held then: dlindex.catalog.sqlite.history_schema).
A name without a schema finds the temporary view first, in SQLite and in PostgreSQL, so every
read dlindex makes (query, sampling, stats, export, the loader) answers as of S unchanged, and
a write of rows through a pinned connection fails instead of writing into the past.

Paths are read through today's ``roots``: ``roots move`` moved the files, so an old state's
rows are found where the files are now.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dlindex.catalog.sqlite.history_schema import ROW_COLUMNS
from dlindex.catalog.state import CatalogState
from dlindex.errors import InputError

if TYPE_CHECKING:
    from dlindex.catalog.backend import ReadConnection

_COLUMNS = ", ".join((*ROW_COLUMNS, "valid_from"))
_VERSION = "SELECT id, last_change, finished_at FROM versions WHERE id = :id"
_TAG = "SELECT v.id, v.last_change, v.finished_at FROM version_tags t JOIN versions v ON v.id = t.version WHERE t.name = :name"
_LATEST = "SELECT id, last_change, finished_at FROM versions ORDER BY id DESC LIMIT 1"
# The oldest state history can rebuild (history_schema: where it began, or was pruned).
_OLDEST = "SELECT state FROM version_floor WHERE id = 1"
_NOW = "SELECT counter FROM catalog_changes WHERE id = 1"
_VERSION_AT = "SELECT max(id) FROM versions WHERE last_change <= :state"


@dataclass(frozen=True)
class Pinned:
    """A state the catalog had, and how the user named it."""

    state: int  # the change counter's value
    version: int | None  # the numbered version it is the end of, where it is one
    named: str  # as given: "7", "v7", a tag, an export's folder

    def as_dict(self) -> dict[str, object]:
        return {"state": self.state, "version": self.version, "at": self.named}


def state_of(pinned: Pinned | None) -> int | None:
    """The state a pinned catalog reads (``Catalog.pinned``), or None: the catalog as it is."""
    return pinned.state if pinned is not None else None


def pinned_state(pinned: Pinned) -> CatalogState:
    """The state key of a pinned read: its counter, and a token no write transaction draws (those
    are 32 hex digits), so a cache never mixes a past state's rows with the current one's."""
    return CatalogState(pinned.state, f"at-{pinned.state}")


def present_rows(pinned: Pinned | None, server: bool) -> str:
    """The table of the catalog's rows as they are now, for a question about the present (is
    a root's tree there?) asked by a reader of a past state (``pinned``): the view shadows the
    table, so a file catalog names it in its schema; a ``server`` reads the view, whose filters
    it pushes down."""
    return "main.image_metadata" if pinned is not None and not server else "image_metadata"


def view_statements(state: int, *, qualify: str) -> tuple[str, ...]:
    """The two views of state ``state``; ``qualify`` names the schema holding the tables
    ("main" in SQLite; the catalog's schema, already quoted, in PostgreSQL)."""
    s = int(state)  # an integer made here, never text a user typed: safe inside the view's text
    return (
        f"CREATE TEMP VIEW image_metadata AS SELECT {_COLUMNS} FROM {qualify}.image_metadata "
        f"WHERE valid_from IS NULL OR valid_from <= {s} "
        f"UNION ALL SELECT {_COLUMNS} FROM {qualify}.image_history WHERE valid_from <= {s} AND valid_to > {s}",
        f"CREATE TEMP VIEW labels AS SELECT id, name, valid_from FROM {qualify}.labels "
        f"WHERE valid_from IS NULL OR valid_from <= {s} "
        f"UNION ALL SELECT id, name, valid_from FROM {qualify}.label_history WHERE valid_from <= {s} AND valid_to > {s}",
    )


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit() also takes "²", which int() refuses."""
    return bool(text) and text.isascii() and text.isdigit()


def resolve(conn: ReadConnection, at: str) -> Pinned:
    """The state ``at`` names: a version number (``7`` or ``v7``), a tag, ``latest``, an
    export's folder (the state its index.json recorded), or ``state:N`` (a change counter value,
    as a loader's saved state records it). Refused in one line when it names none."""
    text = at.strip()
    if not text:
        raise InputError("--at needs a version number, a tag or an export folder; dlindex versions lists them")
    number = text[1:] if text[:1] in "vV" and _digits(text[1:]) else text
    if _digits(number) and len(number) > 18:  # past any 64-bit id or counter
        raise InputError(f"no version {number[:40]} in this catalog{_known(conn)}")
    if text.startswith("state:") and _digits(text[6:]) and len(text) > 24:
        raise InputError(f"{text[:40]}: no such state in this catalog")
    if _digits(number):
        row = _one(conn, _VERSION, {"id": int(number)})
        if row is None:
            raise InputError(f"no version {int(number)} in this catalog{_known(conn, int(number))}")
        return _pinned(row, text)
    if text.startswith("state:") and _digits(text[6:]):
        return _state(conn, int(text[6:]), text)
    if text == "latest":
        row = _one(conn, _LATEST, {})
        if row is None:
            raise InputError("this catalog has no versions yet: nothing has been written to it")
        return _pinned(row, text)
    row = _one(conn, _TAG, {"name": text})
    if row is not None:
        return _pinned(row, text)
    if os.path.isdir(text):
        return _from_export(conn, Path(text))
    raise InputError(
        f"no version or tag {text[:80]!r} in this catalog, and no export folder by that name{_known(conn)}"
    )


def _pinned(row: tuple[object, ...], named: str) -> Pinned:
    version, last_change, finished = int(row[0]), int(row[1]), row[2]  # type: ignore[call-overload]
    if finished is None:
        raise InputError(
            f"version {version} is still being written (or its command was killed before it could finish); "
            "give a finished version: dlindex versions lists them"
        )
    return Pinned(last_change, version, named)


def _from_export(conn: ReadConnection, folder: Path) -> Pinned:
    from dlindex.exported.reader import load_index  # on use: only an --at of an export reads one

    recorded = load_index(folder).get("catalog")
    state = recorded.get("changes") if isinstance(recorded, dict) else None
    if not isinstance(state, int) or isinstance(state, bool) or state < 0:
        raise InputError(f"export {folder} does not record the catalog state it read")
    return _state(conn, state, os.fspath(folder))


def _state(conn: ReadConnection, state: int, named: str) -> Pinned:
    """A state by its counter, if history can rebuild it: not before versions were kept, not ahead."""
    (oldest,) = _one(conn, _OLDEST, {}) or (0,)
    (now,) = _one(conn, _NOW, {}) or (0,)
    if state < int(oldest) or state > int(now):  # type: ignore[call-overload]
        when = "older than this catalog's history" if state < int(oldest) else "one this catalog has not reached"  # type: ignore[call-overload]
        raise InputError(f"{named}: state {state} is {when} (it keeps states {oldest}..{now})")
    row = _one(conn, _VERSION_AT, {"state": state})
    return Pinned(state, int(row[0]) if row and row[0] is not None else None, named)  # type: ignore[call-overload]


def _known(conn: ReadConnection, number: int | None = None) -> str:
    row = _one(conn, "SELECT min(id), max(id) FROM versions", {})
    if row is None or row[0] is None:
        return " (it has none yet)"
    pruned = " (pruned, or never made)" if number is not None and number < int(row[0]) else ""  # type: ignore[call-overload]
    return f"{pruned}: it has {row[0]}..{row[1]} (dlindex versions)"


def _one(conn: ReadConnection, sql: str, params: dict[str, object]) -> tuple[object, ...] | None:
    return conn.execute(sql, params).fetchone()  # type: ignore[no-any-return]
