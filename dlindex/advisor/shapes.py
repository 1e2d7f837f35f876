"""What a logged statement asks of each table, and what a logged write changes (sqlglot).

``check_select`` decides whether a statement from a log may be explained at all (one
read-only SELECT, nothing else); ``analyze`` turns it into one ``Access`` per table
reference of every SELECT scope (subqueries, CTEs and derived tables included): the
columns compared for equality, the constants (``processed = 1``), ranges, the ORDER BY,
and every column it touches, which is what candidate indexes are made from. For a write,
``write_columns`` names its table and the columns an UPDATE sets, and ``where_as_select``
turns its WHERE into a read that can be planned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import cast

from sqlglot import exp
from sqlglot.optimizer.scope import Scope, traverse_scope

from dlindex.advisor.sqltext import PARSE_ERRORS, Constant, conjuncts, literal, parse, parse_one

NOT_READ_ONLY = "not a read-only SELECT"
_READS = (exp.Select, exp.Union, exp.Intersect, exp.Except)
# Anything that is not a query; getattr: the names differ between sqlglot releases.
_FORBIDDEN = tuple(t for name in ("Insert", "Update", "Delete", "Merge", "Create", "Drop", "Alter", "Command", "Pragma",
                                  "Attach", "Detach", "Transaction", "Commit", "Rollback", "Set", "Use", "Copy")
                   if isinstance(t := getattr(exp, name, None), type))  # fmt: skip
_DENIED_FUNCTIONS = ("load_extension", "fts3_tokenizer", "readfile", "writefile", "edit")
_ROWID_NAMES = ("rowid", "_rowid_", "oid")

# (table alias, canonical column) of a column reference, None if it names no known table's column
Resolve = Callable[[exp.Expression], tuple[str, str] | None]


@dataclass(frozen=True)
class Access:
    """What one SELECT scope asks of one table."""

    table: str
    equal: tuple[str, ...] = ()  # = a value unknown when planning: a parameter, another table's column
    constants: tuple[Constant, ...] = ()  # = a literal
    in_lists: tuple[str, ...] = ()  # IN (...), IN (SELECT ...)
    ranges: tuple[str, ...] = ()  # <, <=, >, >=, BETWEEN
    bounded: tuple[str, ...] = ()  # range columns with a lower and an upper bound
    order: tuple[str, ...] = ()  # ORDER BY (or GROUP BY) columns of this table, one direction
    order_desc: bool = False
    order_random: bool = False
    order_other: bool = False  # ORDER BY something an index on this table cannot deliver
    columns: frozenset[str] | None = frozenset()  # every column used; None: SELECT *
    notes: tuple[str, ...] = ()  # predicates no index can use, in words

    @property
    def filtered(self) -> bool:
        return bool(self.equal or self.constants or self.in_lists or self.ranges)


@dataclass(frozen=True)
class Shape:
    """Every access of a statement, and what no index can help with, in words."""

    accesses: tuple[Access, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class TableInfo:
    """A table's columns (canonical names) and its rowid alias, for resolving references."""

    name: str
    columns: tuple[str, ...]
    rowid: str | None = None  # the INTEGER PRIMARY KEY column, if any
    lower: Mapping[str, str] = field(default_factory=dict)
    primary_key: tuple[str, ...] = ()  # set only for a WITHOUT ROWID table: what names its rows

    @classmethod
    def make(cls, name: str, columns: Iterable[str], rowid: str | None, primary_key: Iterable[str] = ()) -> TableInfo:
        cols = tuple(columns)
        return cls(name, cols, rowid, {c.lower(): c for c in cols}, tuple(primary_key))

    def canonical(self, column: str) -> str | None:
        low = column.lower()
        if low in _ROWID_NAMES and low not in self.lower:
            return self.rowid or "rowid"
        return self.lower.get(low)


def check_select(sql: str) -> str | None:
    """None if ``sql`` is one read-only SELECT; else why it is refused (``not a read-only SELECT``)."""
    try:
        statements = parse(sql)
    except PARSE_ERRORS:
        return NOT_READ_ONLY + " (cannot be parsed)"
    if len(statements) != 1:
        return NOT_READ_ONLY + (" (several statements)" if statements else " (empty)")
    (statement,) = statements
    if not isinstance(statement, _READS) or any(isinstance(node, _FORBIDDEN) for node in statement.walk()):
        return NOT_READ_ONLY
    for func in statement.find_all(exp.Func):
        if func.sql_name().lower() in _DENIED_FUNCTIONS or (
            isinstance(func, exp.Anonymous) and func.name.lower() in _DENIED_FUNCTIONS
        ):
            return NOT_READ_ONLY + f" (calls {func.name or func.sql_name().lower()})"
    return None


def analyze(sql: str, tables: Mapping[str, TableInfo]) -> Shape:
    """The accesses of a statement that ``check_select`` accepted; tables not in ``tables`` are ignored."""
    try:
        (statement,) = parse(sql)
        scopes = list(traverse_scope(statement))
    except PARSE_ERRORS:
        return Shape((), ("the statement could not be analyzed",))
    accesses: list[Access] = []
    for scope in scopes:
        if isinstance(scope.expression, exp.Select):
            accesses.extend(_scope_accesses(scope, tables))
    return Shape(tuple(accesses), tuple(dict.fromkeys(n for a in accesses for n in a.notes)))


class _Builder:
    def __init__(self, table: str) -> None:
        self.table = table
        self.equal: list[str] = []
        self.constants: list[Constant] = []
        self.in_lists: list[str] = []
        self.ranges: list[str] = []
        self.lower: set[str] = set()
        self.upper: set[str] = set()
        self.columns: set[str] | None = set()
        self.notes: list[str] = []
        self.order: tuple[str, ...] = ()
        self.order_desc = False
        self.order_random = False
        self.order_other = False

    def build(self) -> Access:
        ranges = tuple(dict.fromkeys(self.ranges))
        return Access(
            table=self.table, equal=tuple(dict.fromkeys(self.equal)), constants=tuple(dict.fromkeys(self.constants)),
            in_lists=tuple(dict.fromkeys(self.in_lists)), ranges=ranges,
            bounded=tuple(c for c in ranges if c in self.lower and c in self.upper), order=self.order,
            order_desc=self.order_desc, order_random=self.order_random, order_other=self.order_other,
            columns=None if self.columns is None else frozenset(self.columns), notes=tuple(dict.fromkeys(self.notes)),
        )  # fmt: skip


def _scope_accesses(scope: Scope, tables: Mapping[str, TableInfo]) -> list[Access]:
    select = cast(exp.Select, scope.expression)
    aliases = {alias: tables[src.name] for alias, src in scope.sources.items()
               if isinstance(src, exp.Table) and src.name in tables}  # fmt: skip
    if not aliases:
        return []
    builders = {alias: _Builder(info.name) for alias, info in aliases.items()}

    def resolve(node: exp.Expression) -> tuple[str, str] | None:
        if not isinstance(node, exp.Column) or isinstance(node.this, exp.Star):
            return None
        if node.table:
            info = aliases.get(node.table)
            name = info.canonical(node.name) if info else None
            return (node.table, name) if name else None
        found = [(alias, info.canonical(node.name)) for alias, info in aliases.items() if info.canonical(node.name)]
        if len(found) == 1:
            alias, name = found[0]
            return (alias, name) if name else None
        return None

    for column in scope.columns:
        ref = resolve(column)
        used = builders[ref[0]].columns if ref is not None else None
        if ref is not None and used is not None:
            used.add(ref[1])
    for projection in select.expressions:
        star: exp.Expression | None = projection if isinstance(projection, exp.Star) else None
        if isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star):
            star = projection
        if star is not None:
            qualifier = star.table if isinstance(star, exp.Column) else ""
            for alias, builder in builders.items():
                if not qualifier or qualifier == alias:
                    builder.columns = None

    conditions: list[exp.Expression] = []
    where = select.args.get("where")
    if where is not None:
        conditions.extend(conjuncts(where.this))
    for join in select.args.get("joins") or ():
        on = join.args.get("on")
        if on is not None:
            conditions.extend(conjuncts(on))
    for condition in conditions:
        _predicate(condition, resolve, builders)
    _ordering(select, resolve, builders)
    return [builder.build() for builder in builders.values()]


def _value_like(node: exp.Expression, alias: str, resolve: Resolve) -> bool:
    """A value fixed while one table is searched: literals, parameters, other tables' columns
    (also those of an outer query, as in a correlated subquery's ``t.label_id = outer.id``)."""
    if isinstance(node, (exp.Subquery, exp.Select)):
        return True  # a scalar subquery
    for column in node.find_all(exp.Column):
        ref = resolve(column)
        if ref is None and column.table and column.table != alias:
            continue  # an outer query's column (a correlated subquery) or a derived table's
        if ref is None or ref[0] == alias:
            return False
    return True


def _predicate(node: exp.Expression, resolve: Resolve, builders: dict[str, _Builder]) -> None:
    node = cast(exp.Expression, node.unnest()) if isinstance(node, exp.Paren) else node
    if isinstance(node, (exp.EQ, exp.Is)):
        for left, right in ((node.this, node.expression), (node.expression, node.this)):
            ref = resolve(left)
            if ref is None:
                continue
            alias, column = ref
            builder = builders[alias]
            if isinstance(node, exp.Is):
                if isinstance(right, exp.Null):
                    builder.constants.append(Constant(column, None))
                return
            is_literal, value = literal(right)
            if is_literal:
                builder.constants.append(Constant(column, value))
            elif _value_like(right, alias, resolve):
                builder.equal.append(column)
        _function_note(node, resolve, builders)
        return
    if isinstance(node, exp.In):
        ref = resolve(node.this)
        if ref is None:
            _function_note(node, resolve, builders)
            return
        builder = builders[ref[0]]
        values = node.expressions
        if len(values) == 1 and literal(values[0])[0]:
            builder.constants.append(Constant(ref[1], literal(values[0])[1]))
        else:
            builder.in_lists.append(ref[1])
        return
    if isinstance(node, exp.Between):
        ref = resolve(node.this)
        if ref is not None:
            builders[ref[0]].ranges.append(ref[1])
            builders[ref[0]].lower.add(ref[1])
            builders[ref[0]].upper.add(ref[1])
        return
    if isinstance(node, (exp.GT, exp.GTE, exp.LT, exp.LTE)):
        for left, right, lower in ((node.this, node.expression, isinstance(node, (exp.GT, exp.GTE))),
                                   (node.expression, node.this, isinstance(node, (exp.LT, exp.LTE)))):  # fmt: skip
            ref = resolve(left)
            if ref is not None and _value_like(right, ref[0], resolve):
                builder = builders[ref[0]]
                builder.ranges.append(ref[1])
                (builder.lower if lower else builder.upper).add(ref[1])
                return
        _function_note(node, resolve, builders)
        return
    if isinstance(node, exp.Like):
        ref = resolve(node.this)
        ok, pattern = literal(node.expression)
        if ref is not None and ok and isinstance(pattern, str) and pattern.startswith(("%", "_")):
            builders[ref[0]].notes.append(f"{ref[1]} LIKE '{pattern[:20]}': a leading wildcard cannot use an index")
        return
    if isinstance(node, exp.Or):
        refs = {resolve(c) for c in node.find_all(exp.Column)} - {None}
        for alias, column in sorted(r for r in refs if r is not None):
            builders[alias].notes.append(
                f"OR on {column}: each branch needs its own index; consider UNION ALL or IN (...)"
            )
        return
    _function_note(node, resolve, builders)


def _function_note(node: exp.Expression, resolve: Resolve, builders: dict[str, _Builder]) -> None:
    for func in node.find_all(exp.Func):
        if isinstance(func, (exp.AggFunc, exp.Window)):
            continue
        for column in func.find_all(exp.Column):
            ref = resolve(column)
            if ref is not None:
                name = func.sql_name().lower()
                builders[ref[0]].notes.append(
                    f"{name}({ref[1]}) in a condition hides {ref[1]} from indexes; compare the column itself"
                )
                return


def _ordering(select: exp.Select, resolve: Resolve, builders: dict[str, _Builder]) -> None:
    order = select.args.get("order")
    items: list[tuple[exp.Expression, bool]] = []
    if order is not None:
        items = [(o.this, bool(o.args.get("desc"))) for o in order.expressions]
    elif select.args.get("group") is not None:
        items = [(g, False) for g in select.args["group"].expressions]
    if not items:
        return
    if any(isinstance(e, exp.Rand) or (isinstance(e, exp.Anonymous) and e.name.lower() == "random") for e, _ in items):
        for builder in builders.values():
            builder.order_random = True
        return
    refs = [resolve(e) for e, _ in items]
    directions = {desc for _, desc in items}
    aliases = {r[0] for r in refs if r is not None}
    if None in refs or len(aliases) != 1 or len(directions) != 1:
        for builder in builders.values():
            builder.order_other = True
        return
    (alias,) = aliases
    builder = builders[alias]
    builder.order = tuple(dict.fromkeys(r[1] for r in refs if r is not None))
    builder.order_desc = directions == {True}
    for other, b in builders.items():
        if other != alias:
            b.order_other = True


_WRITES = (exp.Insert, exp.Update, exp.Delete)


def write_columns(sql: str) -> tuple[str | None, tuple[str, ...] | None]:
    """(table, columns an UPDATE sets) of a write statement; columns None for INSERT/DELETE."""
    statement = parse_one(sql)
    if not isinstance(statement, _WRITES):
        return None, None
    target = statement.this
    table = target if isinstance(target, exp.Table) else target.find(exp.Table)
    name = table.name if table is not None else None
    if isinstance(statement, exp.Update):
        cols = tuple(
            e.this.name for e in statement.expressions if isinstance(e, exp.EQ) and isinstance(e.this, exp.Column)
        )
        return name, cols
    return name, None


def where_as_select(sql: str) -> str | None:
    """``SELECT rowid FROM t WHERE ...`` with the WHERE of an UPDATE or DELETE: its plan, read-only."""
    statement = parse_one(sql)
    if not isinstance(statement, (exp.Update, exp.Delete)):
        return None
    table = statement.this if isinstance(statement.this, exp.Table) else statement.find(exp.Table)
    where = statement.args.get("where")
    if table is None or where is None:
        return None
    select = exp.select("rowid").from_(exp.Table(this=exp.to_identifier(table.name))).where(where.this)
    return select.sql(dialect="sqlite")
