"""What a logged write changes: its table, the columns an UPDATE sets, and its WHERE as a read."""

from __future__ import annotations

from sqlglot import exp

from dlindex.advisor.sqltext import parse_one

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
