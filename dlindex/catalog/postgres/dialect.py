"""dlindex's SQL, written for SQLite, in PostgreSQL's words.

dlindex's statements are SQLite SQL with ``?`` and ``:name`` parameters. On PostgreSQL
each one is rewritten once (and remembered) by the few rules below, so the library keeps
one text per statement and the two backends cannot drift apart; a statement no rule covers
registers its PostgreSQL form with ``postgres_form`` next to its SQLite one.

The rules (outside quoted strings and identifiers):
- parameters: ``?`` -> ``%s``, ``:name`` -> ``%(name)s``, a literal ``%`` -> ``%%``;
- ``BEGIN IMMEDIATE`` -> ``BEGIN``; ``temp.t`` -> ``pg_temp.t``; ``main.t`` -> ``t``;
- ``INSERT OR IGNORE`` -> ``... ON CONFLICT DO NOTHING``; ``INSERT OR REPLACE`` -> an upsert
  on the table's primary key;
- ``json_each(P)`` (a JSON array of ids, names or paths) -> ``unnest(P::T[]) WITH
  ORDINALITY AS alias(value, key)``: P goes over as an array, T is the elements' type;
- ``JOIN t`` with no ON (SQLite's cross join) -> ``JOIN t ON true``;
- ``a IS b`` / ``a IS NOT b`` (b not NULL) -> ``IS [NOT] DISTINCT FROM``;
- ``CURRENT_TIMESTAMP`` -> the same UTC ``YYYY-MM-DD HH:MM:SS`` text SQLite writes;
- ``LIMIT -1`` (SQLite's "no limit", which it needs before an OFFSET) -> ``LIMIT ALL``;
- ``LIKE`` -> ``ILIKE`` (SQLite's LIKE ignores ASCII case; under ``COLLATE "C"`` ILIKE does
  the same);
- in CREATE statements, SQLite's storage words: ``BLOB`` -> ``BYTEA``, ``INTEGER`` ->
  ``BIGINT``, ``REAL`` -> ``DOUBLE PRECISION``, no ``STRICT`` or ``WITHOUT ROWID``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from dlindex.catalog.postgres.migrations import NOW_TEXT, PRIMARY_KEYS

_QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")
_PARAM = re.compile(r"\?|(?<![:\w]):([A-Za-z_]\w*)")
_BEGIN = re.compile(r"^\s*BEGIN\s+(?:IMMEDIATE|DEFERRED|EXCLUSIVE)\b", re.IGNORECASE)
_TEMP = re.compile(r"\btemp\.(?=\w)", re.IGNORECASE)
_MAIN = re.compile(r"\bmain\.(?=\w)", re.IGNORECASE)
_OR_IGNORE = re.compile(r"\bINSERT\s+OR\s+IGNORE\s+INTO\b", re.IGNORECASE)
_OR_REPLACE = re.compile(r"\bINSERT\s+OR\s+REPLACE\s+INTO\s+(\w+)\s*\(([^)]*)\)", re.IGNORECASE)
_RETURNING = re.compile(r"\bRETURNING\b", re.IGNORECASE)
_JSON_EACH = re.compile(r"\bjson_each\(\s*(\x01\d+\x01)\s*\)(?:\s+AS\s+(\w+))?", re.IGNORECASE)
_IN_JSON_EACH = re.compile(r"(\w+)\s+IN\s+\(\s*SELECT\s+value\s+FROM\s+json_each\(\s*(\x01\d+\x01)", re.IGNORECASE)
_IS_NOT = re.compile(r"\bIS\s+NOT\s+(?!NULL\b|TRUE\b|FALSE\b|DISTINCT\b)", re.IGNORECASE)
_IS = re.compile(r"\bIS\s+(?!NOT\b|NULL\b|TRUE\b|FALSE\b|DISTINCT\b)", re.IGNORECASE)
_BARE_JOIN = re.compile(
    r"\bJOIN\s+(\w+(?:\.\w+)?(?:\s+AS\s+\w+)?)\s+(?=JOIN\b|WHERE\b|ORDER\b|GROUP\b|LIMIT\b|UNION\b|\))",
    re.IGNORECASE,
)
_NOW = re.compile(r"\bCURRENT_TIMESTAMP\b", re.IGNORECASE)
_LIKE = re.compile(r"\bLIKE\b", re.IGNORECASE)
_NO_LIMIT = re.compile(r"\bLIMIT\s+-\s*1\b", re.IGNORECASE)
_CREATE = re.compile(r"^\s*CREATE\b", re.IGNORECASE)
_DDL_WORDS = (
    (re.compile(r"\bBLOB\b", re.IGNORECASE), "BYTEA"),
    (re.compile(r"\bINTEGER\b", re.IGNORECASE), "BIGINT"),
    (re.compile(r"\bREAL\b", re.IGNORECASE), "DOUBLE PRECISION"),
    (re.compile(r"\)\s*(?:STRICT|WITHOUT\s+ROWID)(?:\s*,\s*(?:STRICT|WITHOUT\s+ROWID))*\s*$", re.IGNORECASE), ")"),
)
_TEXT_COLUMN = re.compile(r"\bTEXT\b(?!\s+COLLATE)", re.IGNORECASE)
_OVERRIDES: dict[str, str] = {}


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


def postgres_form(sqlite_sql: str, postgres_sql: str) -> str:
    """Register the PostgreSQL text of a statement the rules cannot rewrite; returns sqlite_sql.

    ``postgres_sql`` uses psycopg's ``%s`` / ``%(name)s`` parameters and is used as it is.
    """
    _OVERRIDES[sqlite_sql] = postgres_sql
    return sqlite_sql


@lru_cache(maxsize=4096)
def translate(sql: str) -> Translated:
    """The PostgreSQL form of one dlindex statement (see the module's rules)."""
    override = _OVERRIDES.get(sql)
    if override is not None:
        return Translated(override, named="%(" in override)
    quoted: list[str] = []

    def hide(m: re.Match[str]) -> str:
        quoted.append(m.group(0))
        return f"\x00{len(quoted) - 1}\x00"

    text = _QUOTED.sub(hide, sql)
    params: list[str] = []  # each placeholder's PostgreSQL form, by its place
    names: list[str | int] = []

    def param(m: re.Match[str]) -> str:
        name = m.group(1)
        params.append("%s" if name is None else f"%({name})s")
        names.append(len([n for n in names if isinstance(n, int)]) if name is None else name)
        return f"\x01{len(params) - 1}\x01"

    text = _PARAM.sub(param, text)
    named = any(isinstance(n, str) for n in names)
    text = _BEGIN.sub("BEGIN", text)
    text = _TEMP.sub("pg_temp.", text)
    text = _MAIN.sub("", text)
    if _OR_IGNORE.search(text):
        text = _append_conflict(_OR_IGNORE.sub("INSERT INTO", text), "ON CONFLICT DO NOTHING")
    replace = _OR_REPLACE.search(text)
    if replace:
        text = _upsert(text, replace)
    if _CREATE.match(text):
        for pattern, word in _DDL_WORDS:
            text = pattern.sub(word, text)
        text = _TEXT_COLUMN.sub('TEXT COLLATE "C"', text)
    text = _BARE_JOIN.sub(r"JOIN \1 ON true ", text)
    text = _LIKE.sub("ILIKE", text)
    text = _NO_LIMIT.sub("LIMIT ALL", text)
    text = _NOW.sub(NOW_TEXT, text)
    text = _IS_NOT.sub("IS DISTINCT FROM ", text)
    text = _IS.sub("IS NOT DISTINCT FROM ", text)
    json_params: list[JsonParam] = []
    hinted = {m.group(2): m.group(1) for m in _IN_JSON_EACH.finditer(text)}

    def json_each(m: re.Match[str]) -> str:
        token, alias = m.group(1), m.group(2) or "json_each"
        place = int(token.strip("\x01"))
        key = names[place]
        column = hinted.get(token, str(key))
        slot = f"t{len(json_params)}"
        empty = "bigint" if column.lower().endswith(("id", "ids")) else "text"
        json_params.append(JsonParam(key, slot, empty))
        return f"unnest({token}::{{{slot}}}[]) WITH ORDINALITY AS {alias}(value, key)"

    text = _JSON_EACH.sub(json_each, text)
    text = re.sub(r"\x00(\d+)\x00", lambda m: quoted[int(m.group(1))], text)
    if json_params:  # the element types are filled in with str.format: keep other braces
        text = text.replace("{", "{{").replace("}", "}}")
        for p in json_params:
            text = text.replace(f"{{{{{p.slot}}}}}", f"{{{p.slot}}}")
    text = text.replace("%", "%%")
    text = re.sub(r"\x01(\d+)\x01", lambda m: params[int(m.group(1))], text)
    order = tuple(dict.fromkeys(n for n in names if isinstance(n, str)))
    return Translated(text, tuple(json_params), named, order)


def _append_conflict(text: str, clause: str) -> str:
    """Put ``clause`` where PostgreSQL wants it: before RETURNING, else at the end."""
    returning = _RETURNING.search(text)
    if returning:
        return f"{text[: returning.start()]}{clause} {text[returning.start() :]}"
    return f"{text.rstrip().rstrip(';')} {clause}"


def _upsert(text: str, m: re.Match[str]) -> str:
    table = m.group(1)
    columns = [c.strip() for c in m.group(2).split(",") if c.strip()]
    key = PRIMARY_KEYS.get(table.lower())
    if key is None:
        raise ValueError(f"INSERT OR REPLACE into {table}: no primary key known for PostgreSQL")
    text = f"{text[: m.start()]}INSERT INTO {table} ({m.group(2)}){text[m.end() :]}"
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c not in key)
    clause = f"ON CONFLICT ({', '.join(key)}) " + (f"DO UPDATE SET {updates}" if updates else "DO NOTHING")
    return _append_conflict(text, clause)


def element_type(values: list[object], empty_type: str) -> str:
    """The PostgreSQL type of an array of ``values`` (JSON-decoded)."""
    if not values:
        return empty_type
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "bigint"
    if all(isinstance(v, str) for v in values):
        return "text"
    return "jsonb"


_LASTROWID = re.compile(r"^\s*INSERT\s+INTO\s+(\w+)\b(?!.*\b(?:RETURNING|ON\s+CONFLICT|SELECT)\b)", re.I | re.S)
_ID_TABLES = frozenset(t for t, key in PRIMARY_KEYS.items() if key == ("id",) and t != "catalog_changes")


def wants_lastrowid(text: str) -> bool:
    """An INSERT of one row into a table with an id: ask for the id, as sqlite3's lastrowid."""
    m = _LASTROWID.match(text)
    return bool(m and m.group(1).lower() in _ID_TABLES)


def server_statement(
    sql: str, parameters: Sequence[Any] | Mapping[str, Any] = ()
) -> tuple[str, Sequence[Any] | Mapping[str, Any]]:
    """``sql`` in dlindex's SQLite dialect as PostgreSQL runs it, with its psycopg parameters
    (for ``execute_raw``: the index advisor explains and times logged reads this way)."""
    return bind(translate(sql), parameters)


def bind(
    translated: Translated, parameters: Sequence[Any] | Mapping[str, Any]
) -> tuple[str, Sequence[Any] | Mapping[str, Any]]:
    """The statement's text and psycopg parameters; JSON arrays go over as arrays."""
    if translated.named and not isinstance(parameters, Mapping):
        parameters = dict(zip(translated.names, parameters, strict=False))
    if not translated.json_params:
        return translated.text, parameters
    params: Any = dict(parameters) if isinstance(parameters, Mapping) else list(parameters)
    types = {}
    for p in translated.json_params:
        raw = params[p.key]
        values = json.loads(raw) if isinstance(raw, (str, bytes)) else list(raw)
        kind = element_type(values, p.empty_type)
        if kind == "jsonb":
            from psycopg.types.json import Jsonb

            values = [Jsonb(v) for v in values]
        params[p.key] = values
        types[p.slot] = kind
    return translated.text.format(**types), params
