"""dlindex's SQLite SQL parsed by sqlglot, rewritten as a tree and written in PostgreSQL's words.

The rules are listed in ``dlindex.catalog.postgres.dialect``, which calls ``to_postgres`` once
per statement text (and remembers the answer). sqlglot is imported here only: a command on a
catalog file never pays for it.
"""

from __future__ import annotations

import itertools
import logging
import re
from typing import cast

import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel
from sqlglot.tokenizer_core import TokenType

from dlindex.catalog.postgres.migrations import NOW_TEXT, PRIMARY_KEYS
from dlindex.catalog.postgres.statement import JsonParam, Translated

# sqlglot logs what it parses as an opaque command (SAVEPOINT ...): such text goes over as it is,
# and the warning must not reach dlindex's stderr (an application's own handlers still get it)
logging.getLogger("sqlglot").addHandler(logging.NullHandler())

_MARK = re.compile(r"__dlx_p(\d+)__")  # a parameter, while the tree is written out
_POSITIONAL = "__dlx_q"  # ``?`` parameters get these names while parsed: the n-th is __dlx_q<n>
_NOW = cast(exp.Expression, sqlglot.parse_one(NOW_TEXT, read="postgres"))
_WIDE_INTEGERS = frozenset({exp.DataType.Type.INT, exp.DataType.Type.SMALLINT, exp.DataType.Type.TINYINT})


def to_postgres(sql: str) -> Translated:
    """The PostgreSQL form of one dlindex statement (the rules: dlindex.catalog.postgres.dialect).

    Raises:
        ValueError: text sqlglot cannot parse as SQLite's SQL, or cannot write as PostgreSQL's.
    """
    text, source_names = _name_positionals(sql)
    try:
        tree = sqlglot.parse_one(text, read="sqlite")
    except sqlglot.errors.SqlglotError:
        raise ValueError(f"sqlglot cannot parse this as SQLite's SQL: {sql[:80]}") from None
    names: list[str] = []  # every parameter, by its place in the output: its name
    json_slots: list[tuple[str, str, str]] = []  # per json_each: (parameter, alias, element type hint)
    # first the leaves (parameters, json_each, table names), then the statement's shape
    tree = tree.transform(lambda node: _mark(node, names, json_slots)).transform(_rewrite)
    try:
        text = tree.sql(dialect="postgres", unsupported_level=ErrorLevel.RAISE)
    except sqlglot.errors.SqlglotError as e:
        raise ValueError(f"no PostgreSQL form of {sql[:80]} ({e})") from None
    return _finish(text, names, source_names, json_slots)


def _name_positionals(sql: str) -> tuple[str, list[str]]:
    """``?`` -> ``:__dlx_q<n>`` (the n-th ``?``), found by sqlglot's tokenizer (never in a string);
    and every parameter's name in the order sqlite3 binds a sequence to them."""
    tokens = sqlglot.tokenize(sql, read="sqlite")
    spots = [t.start for t in tokens if t.token_type == TokenType.PLACEHOLDER]
    named = [b.text for a, b in itertools.pairwise(tokens) if a.token_type == TokenType.COLON and a.end + 1 == b.start]
    for n, at in reversed(list(enumerate(spots))):
        sql = f"{sql[:at]}:{_POSITIONAL}{n}{sql[at + 1 :]}"
    return sql, [f"{_POSITIONAL}{n}" for n in range(len(spots))] + list(dict.fromkeys(named))


def _mark(node: exp.Expression, names: list[str], json_slots: list[tuple[str, str, str]]) -> exp.Expression:
    if isinstance(node, exp.Placeholder):
        names.append(str(node.name))
        return exp.var(f"__dlx_p{len(names) - 1}__")
    if isinstance(node, exp.Table):
        if node.this is not None and isinstance(node.this, exp.Anonymous) and node.this.name.lower() == "json_each":
            return _json_each(node, names, json_slots)
        if node.db.lower() == "temp":
            node.set("db", exp.to_identifier("pg_temp"))
        elif node.db.lower() == "main":
            node.set("db", None)
    return node


def _rewrite(node: exp.Expression) -> exp.Expression:
    if isinstance(node, exp.Insert) and node.args.get("alternative"):
        return _on_conflict(node)
    if isinstance(node, exp.Like):
        return exp.ILike(**node.args)  # NOT LIKE stays negated
    if isinstance(node, exp.CurrentTimestamp):
        return _NOW.copy()
    if isinstance(node, exp.Limit) and isinstance(node.expression, exp.Neg):
        return exp.Limit(expression=exp.var("ALL"))
    if isinstance(node, exp.Ordered):
        node.set("nulls_first", bool(node.args.get("desc")))  # PostgreSQL's default: no NULLS clause
        return node
    if isinstance(node, exp.Create):
        return _storage_words(node)
    return node


def _json_each(node: exp.Table, names: list[str], json_slots: list[tuple[str, str, str]]) -> exp.Expression:
    (param,) = node.this.expressions
    if not isinstance(param, exp.Placeholder):
        raise ValueError("json_each takes one parameter on PostgreSQL")
    hint = str(param.name)
    subquery = node.find_ancestor(exp.Subquery)
    outer = subquery.parent if subquery is not None else None
    if isinstance(outer, exp.In) and isinstance(outer.this, exp.Column):
        hint = outer.this.name  # ``x IN (SELECT value FROM json_each(?))``: x's type, for an empty array
    names.append(str(param.name))
    json_slots.append((f"__dlx_p{len(names) - 1}__", node.alias or "json_each", hint))
    return exp.to_table(f"__dlx_j{len(json_slots) - 1}__")


def _on_conflict(node: exp.Insert) -> exp.Insert:
    alternative = str(node.args["alternative"]).upper()
    node.set("alternative", None)
    if alternative == "IGNORE":
        node.set("conflict", exp.OnConflict(action=exp.var("DO NOTHING")))
        return node
    if alternative != "REPLACE":
        raise ValueError(f"INSERT OR {alternative}: no PostgreSQL form")
    schema = node.this
    table = schema.this.name if isinstance(schema, exp.Schema) else schema.name
    key = PRIMARY_KEYS.get(table.lower())
    if key is None:
        raise ValueError(f"INSERT OR REPLACE into {table}: no primary key known for PostgreSQL")
    columns = [c.name for c in schema.expressions] if isinstance(schema, exp.Schema) else []
    updates = [exp.EQ(this=exp.column(c), expression=exp.column(c, table="EXCLUDED")) for c in columns if c not in key]
    node.set(
        "conflict",
        exp.OnConflict(
            conflict_keys=[exp.to_identifier(k) for k in key],
            action=exp.var("DO UPDATE" if updates else "DO NOTHING"),
            expressions=updates or None,
        ),
    )
    return node


def _storage_words(node: exp.Create) -> exp.Create:
    for column in node.find_all(exp.ColumnDef):
        kind = column.args.get("kind")
        if isinstance(kind, exp.DataType) and kind.this in _WIDE_INTEGERS:
            column.set("kind", exp.DataType.build("BIGINT"))
        elif (
            isinstance(kind, exp.DataType)
            and kind.this == exp.DataType.Type.TEXT
            and not column.find(exp.CollateColumnConstraint)
        ):
            collate = exp.ColumnConstraint(kind=exp.CollateColumnConstraint(this=exp.to_identifier("C", quoted=True)))
            column.set("constraints", [collate, *column.args.get("constraints", [])])
    properties = node.args.get("properties")
    if properties is not None:  # STRICT, WITHOUT ROWID: SQLite's storage options
        kept = [p for p in properties.expressions if not isinstance(p, (exp.WithoutRowidProperty, exp.StrictProperty))]
        node.set("properties", exp.Properties(expressions=kept) if kept else None)
    return node


def _finish(text: str, names: list[str], source_names: list[str], json_slots: list[tuple[str, str, str]]) -> Translated:
    """Parameters and json_each back in, in psycopg's words; ``%`` escaped. ``?`` parameters stay
    positional while the output keeps their order, else they go by name (``bind`` maps them)."""
    positional = [n for n in names if n.startswith(_POSITIONAL)]
    if positional and len(positional) < len(names):
        raise ValueError("a statement takes ? or :name parameters, not both")
    arrays: list[tuple[str, str, str]] = []  # (parameter, format slot, element type of an empty array)

    def json_each(m: re.Match[str]) -> str:
        marker, alias, hint = json_slots[int(m.group(1))]
        slot = f"t{len(arrays)}"
        empty = "bigint" if hint.lower().endswith(("id", "ids")) else "text"
        arrays.append((names[int(marker.removeprefix("__dlx_p").removesuffix("__"))], slot, empty))
        return f"unnest({marker}::{{{slot}}}[]) WITH ORDINALITY AS {alias}(value, key)"

    text = re.sub(r"__dlx_j(\d+)__(?: AS \w+)?", json_each, text)
    output = [names[int(m.group(1))] for m in _MARK.finditer(text)]
    named = len(positional) < len(names) or output != [f"{_POSITIONAL}{i}" for i in range(len(positional))]
    json_params = tuple(
        JsonParam(name if named else int(name.removeprefix(_POSITIONAL)), slot, empty) for name, slot, empty in arrays
    )
    if json_params:  # the element types are filled in with str.format: keep other braces
        text = text.replace("{", "{{").replace("}", "}}")
        for p in json_params:
            text = text.replace(f"{{{{{p.slot}}}}}", f"{{{p.slot}}}")
    text = text.replace("%", "%%")
    text = _MARK.sub(lambda m: f"%({names[int(m.group(1))]})s" if named else "%s", text)
    return Translated(text, json_params, named, tuple(source_names) if named else ())
