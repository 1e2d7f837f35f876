"""SQL text both ways: logged statements parsed with sqlglot; identifiers and literals for our DDL.

Everything the advisor writes into a statement of its own (``CREATE INDEX ... WHERE``) is
rendered here from values, never copied from a log.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import cast

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

# sqlglot warns through logging when it falls back to a generic command; the verdict is ours.
logging.getLogger("sqlglot").addHandler(logging.NullHandler())
logging.getLogger("sqlglot").propagate = False

# What sqlglot raises on text it cannot read (deep nesting: RecursionError).
PARSE_ERRORS = (SqlglotError, ValueError, RecursionError)
_TOKENS = re.compile(r"('(?:[^']|'')*')|(\"(?:[^\"]|\"\")*\")|(\?\d+)|([@$][A-Za-z_]\w*)")
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Value = int | float | str | None


@dataclass(frozen=True)
class Constant:
    """``column = literal`` (or ``column IS NULL``): a candidate partial-index predicate."""

    column: str
    value: Value

    def key(self) -> tuple[str, str]:
        return (self.column, repr(self.value))

    def sql(self) -> str:
        if self.value is None:
            return f"{quote_identifier(self.column)} IS NULL"
        return f"{quote_identifier(self.column)} = {sql_literal(self.value)}"


def quote_identifier(name: str) -> str:
    """``name`` as SQLite reads it back: bare when it is a plain name, else double-quoted."""
    return name if _PLAIN_NAME.fullmatch(name) else '"' + name.replace('"', '""') + '"'


def sql_literal(value: Value) -> str:
    """A literal rendered by us (never text copied from a log) for DDL."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + value.replace("'", "''") + "'"


def parse(sql: str) -> list[exp.Expression]:
    """sqlglot expressions of ``sql``; SQLite's ``?NNN``, ``@x`` and ``$x`` parameters become ``?``/``:x``."""

    def fix(m: re.Match[str]) -> str:
        if m.group(3):
            return "?"
        if m.group(4):
            return ":" + m.group(4)[1:]
        return m.group(0)

    return [cast(exp.Expression, e) for e in sqlglot.parse(_TOKENS.sub(fix, sql), read="sqlite") if e is not None]


def parse_one(sql: str) -> exp.Expression | None:
    """The one statement of ``sql``; None if it cannot be parsed or holds none or several."""
    try:
        statements = parse(sql)
    except PARSE_ERRORS:
        return None
    return statements[0] if len(statements) == 1 else None


def conjuncts(node: exp.Expression) -> list[exp.Expression]:
    """The terms of ``a AND b AND ...`` (parentheses undone); one term if it is no AND."""
    node = cast(exp.Expression, node.unnest()) if isinstance(node, exp.Paren) else node
    if isinstance(node, exp.And):
        return conjuncts(cast(exp.Expression, node.left)) + conjuncts(cast(exp.Expression, node.right))
    return [node]


def literal(node: exp.Expression) -> tuple[bool, Value]:
    """(is a literal, its value)."""
    if isinstance(node, exp.Paren):
        return literal(node.this)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return True, str(node.this)
        text = str(node.this)
        try:
            return True, int(text)
        except ValueError:
            try:
                return True, float(text)
            except ValueError:
                return False, None
    if isinstance(node, exp.Neg):
        ok, value = literal(node.this)
        if ok and isinstance(value, (int, float)):
            return True, -value
        return False, None
    if isinstance(node, exp.Boolean):
        return True, int(bool(node.this))
    return False, None


def index_where(sql: str | None) -> tuple[tuple[Constant, ...] | None, bool]:
    """(the WHERE of ``CREATE INDEX ... WHERE`` as constants, whether the index is partial).

    Constants only if the WHERE is nothing but ``col = literal`` and ``col IS NULL`` terms; a
    WHERE we do not model is one constant no candidate matches.
    """
    if not sql:
        return None, False
    try:
        (statement,) = parse(sql)
    except (SqlglotError, ValueError):
        return None, " where " in sql.lower()
    where = statement.find(exp.Where)
    if where is None:
        return None, False
    constants: list[Constant] = []
    for term in conjuncts(where.this):
        is_literal, value = literal(term.expression) if isinstance(term, exp.EQ) else (False, None)
        if isinstance(term, exp.EQ) and isinstance(term.this, exp.Column) and is_literal:
            constants.append(Constant(term.this.name, value))
        elif isinstance(term, exp.Is) and isinstance(term.this, exp.Column) and isinstance(term.expression, exp.Null):
            constants.append(Constant(term.this.name, None))
        else:
            return (Constant("?", "?"),), True
    return tuple(sorted(constants, key=Constant.key)), True
