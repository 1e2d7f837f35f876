"""A statement in PostgreSQL's words, as ``dlindex.catalog.postgres.dialect`` hands it to the
connection: its text, and how dlindex's parameters bind to it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JsonParam:
    """A parameter that holds a JSON array, sent as a PostgreSQL array of its elements' type."""

    key: str | int  # the name of a :name parameter, or the place of a ? parameter
    slot: str  # the format field in ``Translated.text`` for the array's element type
    empty_type: str  # the element type for an empty array (it has no elements to tell)


@dataclass(frozen=True)
class Translated:
    text: str  # PostgreSQL SQL; when json_params is not empty, ``text.format(**types)`` first
    json_params: tuple[JsonParam, ...] = ()
    named: bool = False  # parameters are :name (a mapping), not ? (a sequence)
    names: tuple[str, ...] = ()  # the :names in order of first use (sqlite3 binds a sequence so)
