"""Fingerprints of SQL statements: the template that groups statements differing only in literals.

The query log, its views and the index advisor all name a statement shape by its fingerprint.
"""

from __future__ import annotations

import re

SQL_COMMENT = r"(?s)--[^\n]*|/\*.*?(?:\*/|\Z)"  # unclosed, a comment runs to the end (as in SQLite): linear time
SQL_STRING = r"'(?:[^']|'')*'"
_NUMBER = r"(?i)(?<![\w.])(?:0x[0-9a-f]+|\d+(?:\.\d*)?(?:e[+-]?\d+)?)(?![\w])"
_PARAM = r"(?:\?\d*|[:@$][A-Za-z_]\w*)"
_IN_LIST = r"\(\s*\?(?:\s*,\s*\?)+\s*\)"
_VALUES_LIST = r"(values\s*\(\?\))(?:\s*,\s*\(\?\))+"
_SPACE = r"\s+"


def normalize(sql: str) -> str:
    """The statement with literals and placeholders as ``?``, lists folded, case and space unified."""
    text = re.sub(SQL_COMMENT, " ", sql)
    text = re.sub(SQL_STRING, "?", text)
    text = re.sub(_PARAM, "?", text)
    text = re.sub(_NUMBER, "?", text)
    text = re.sub(_SPACE, " ", text).strip().rstrip(";").strip().lower()
    text = re.sub(_IN_LIST, "(?)", text)
    return re.sub(_VALUES_LIST, r"\1", text)


def fingerprint(sql: str) -> str:
    """16 hex digits grouping statements that differ only in literals, placeholders or spacing."""
    import hashlib  # on first use: opening a catalog stays cheap

    return hashlib.sha1(normalize(sql).encode()).hexdigest()[:16]


_TABLE_OF = (
    r"(?is)^\s*(?:with\b.*?\)\s*)?(?:insert(?:\s+or\s+\w+)?\s+into|replace\s+into|update(?:\s+or\s+\w+)?|delete\s+from)"
    r"\s+([\w.\"`\[\]]+)|\bfrom\s+([\w.\"`\[\]]+)"
)


def table_of(sql: str) -> str | None:
    """The table a write changes, or the first table a read names after FROM."""
    for match in re.finditer(_TABLE_OF, sql):
        name = match.group(1) or match.group(2)
        if name and name.lower() not in ("select", "json_each"):
            return name.split(".")[-1].strip('"`[]')
    return None
