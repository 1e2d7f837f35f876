"""dlindex's SQL, written for SQLite, in PostgreSQL's words.

dlindex's statements are SQLite SQL with ``?`` and ``:name`` parameters. On PostgreSQL each
one is parsed by sqlglot (SQLite's grammar), rewritten as a tree and written out in
PostgreSQL's (``transpile``); once per text (an LRU in the process, and ``sqlcache`` on disk
for the next processes), so neither the hot path nor a short command parses again. The
library keeps one text per statement and the two backends cannot drift apart; a statement the
rules cannot carry registers its PostgreSQL form with ``postgres_form`` next to its SQLite one.

sqlglot itself turns ``?`` and ``:name`` into psycopg's ``%s`` and ``%(name)s``, ``BEGIN
IMMEDIATE`` into ``BEGIN``, ``a IS b`` into ``IS NOT DISTINCT FROM``, SQLite's bare ``JOIN t``
into ``JOIN t ON TRUE``, and SQLite's function names into PostgreSQL's. On the tree, dlindex adds:
- ``temp.t`` -> ``pg_temp.t``; ``main.t`` -> ``t``;
- ``INSERT OR IGNORE`` -> ``ON CONFLICT DO NOTHING``; ``INSERT OR REPLACE`` -> an upsert on
  the table's primary key (dlindex.catalog.postgres.migrations.PRIMARY_KEYS);
- ``json_each(P)`` (a JSON array of ids, names or paths) -> ``unnest(P::T[]) WITH ORDINALITY
  AS alias(value, key)``: P goes over as an array, T is the elements' type;
- ``CURRENT_TIMESTAMP`` -> the same UTC ``YYYY-MM-DD HH:MM:SS`` text SQLite writes;
- ``LIMIT -1`` (SQLite's "no limit", which it needs before an OFFSET) -> ``LIMIT ALL``;
- ``LIKE`` -> ``ILIKE`` (SQLite's LIKE ignores ASCII case; under ``COLLATE "C"`` ILIKE does the same);
- ORDER BY keeps PostgreSQL's own NULL order (no NULLS FIRST that an index could not serve);
- in CREATE statements, SQLite's storage words: ``INTEGER`` -> ``BIGINT``, ``TEXT`` -> ``TEXT
  COLLATE "C"``, no ``STRICT`` or ``WITHOUT ROWID``;
- a literal ``%`` -> ``%%`` (psycopg's escape).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from dlindex.catalog.postgres import sqlcache
from dlindex.catalog.postgres.migrations import PRIMARY_KEYS
from dlindex.catalog.postgres.statement import Translated

_OVERRIDES: dict[str, str] = {}


def postgres_form(sqlite_sql: str, postgres_sql: str) -> str:
    """Register the PostgreSQL text of a statement the rules cannot rewrite; returns sqlite_sql.

    ``postgres_sql`` uses psycopg's ``%s`` / ``%(name)s`` parameters and is used as it is.
    """
    _OVERRIDES[sqlite_sql] = postgres_sql
    return sqlite_sql


@lru_cache(maxsize=4096)
def translate(sql: str) -> Translated:
    """The PostgreSQL form of one dlindex statement (see the module's rules), parsed on its first
    use only: the answer is remembered per text.

    Raises:
        ValueError: text sqlglot cannot parse as SQLite's SQL, or cannot write as PostgreSQL's.
    """
    override = _OVERRIDES.get(sql)
    if override is not None:
        return Translated(override, named="%(" in override)
    remembered = sqlcache.lookup(sql)  # an earlier process on this machine translated it
    if remembered is not None:
        return remembered
    from dlindex.catalog.postgres.transpile import to_postgres  # sqlglot: a server catalog's cost only

    translated = to_postgres(sql)
    sqlcache.remember(sql, translated)
    return translated


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
