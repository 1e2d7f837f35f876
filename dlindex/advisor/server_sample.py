"""A server catalog's sample, where index advice runs what it runs: large tables as temporary tables.

Candidates are judged on the catalog itself from its planner's statistics (pg_stats, and
hypopg's hypothetical indexes under EXPLAIN: planned, never run). What the advice *runs* —
each logged read timed before and after, the winners built — runs on a sample once a table
the reads name holds more than ``SAMPLE_ROWS`` rows (``pg_class.reltuples``): a temporary
table of the same name holds every k-th row of it, so that neither the timed reads nor the
index builds grow with the catalog (at 10^6 rows the full-size runs took minutes and made the
server write GBs of temporary files: sorts of every row, repeated per timed run).

* PostgreSQL looks a table name up in the session's ``pg_temp`` first, so the logged text
  reads the sample unchanged; tables the reads name but that are small stay as they are.
* Rows are those whose ``id`` (or, for a table of per-image rows, ``image_id``) is a multiple
  of k: the same images in every sampled table, so joins keep their matches. A large table
  with neither column is sampled with ``TABLESAMPLE BERNOULLI``, seeded.
* The copy has the catalog's indexes (``LIKE ... INCLUDING ALL``) and is VACUUMed and ANALYZEd
  (an index-only scan of it reads no heap page): its plans use the sample's statistics, a table
  k times smaller; the times and buffers reported are the sample's. The temporary tables are
  dropped at the end (and with the session, whatever happens).
* Per-label sampling is timed with N/k rows a label (``scaled``, at least 1): the window reads
  1/k of the catalog's rows on the sample, and so must the seek, or the sample would weigh a
  seek of N rows from labels k times smaller against it (at 10^7 rows and N = 32, a label's
  250 sampled rows against its 10,000).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from dlindex.advisor.server_workload import OWN, Run
from dlindex.advisor.sqltext import quote_identifier

if TYPE_CHECKING:
    from dlindex.advisor.shapes import TableInfo
    from dlindex.catalog.postgres.connect import PgConnection

SAMPLE_ROWS = 250_000  # as the file catalog's scratch copy: larger tables are sampled to about this many rows
_ROWS = "SELECT reltuples::float8 FROM pg_class WHERE oid = to_regclass(%s)"


class ServerSample:
    """Every k-th row of the large tables ``sql_texts`` name, as temporary tables (``make``, ``drop``)."""

    def __init__(self, conn: PgConnection, infos: Mapping[str, TableInfo], sample_rows: int = SAMPLE_ROWS) -> None:
        self.conn, self.infos, self.sample_rows = conn, infos, sample_rows
        self.sample = 1  # k
        self.rows = 0  # rows of the largest sampled table (its planner estimate)
        self.tables: tuple[str, ...] = ()

    def make(self, sql_texts: Iterable[str]) -> None:
        """Sample the tables the statements name when one holds more than ``sample_rows`` rows."""
        named = {t for text in sql_texts for t in self.infos if re.search(rf"\b{re.escape(t)}\b", text)}
        sizes = {t: self._rows(t) for t in sorted(named)}
        large = {t: n for t, n in sizes.items() if n > self.sample_rows}
        if not large:
            return
        self.rows = max(large.values())
        self.sample = -(-self.rows // self.sample_rows)
        made = []
        try:
            for table in large:
                self._copy(table)
                made.append(table)
        finally:
            self.tables = tuple(made)

    def _rows(self, table: str) -> int:
        row = self.conn.execute_raw(_ROWS, (quote_identifier(table),)).fetchone()
        return int(row[0]) if row and row[0] is not None and row[0] > 0 else 0

    def _copy(self, table: str) -> None:
        q, k = quote_identifier(table), int(self.sample)
        columns = self.infos[table].columns
        key = next((c for c in ("id", "image_id") if c in columns), None)
        source = f"{quote_identifier(self._schema())}.{q}"
        picked = f"{source} WHERE {quote_identifier(key)} % {k} = 0" if key else (
            f"{source} TABLESAMPLE BERNOULLI ({100.0 / k}) REPEATABLE (0)")  # fmt: skip
        self.conn.execute_raw(f"{OWN} CREATE TEMPORARY TABLE {q} (LIKE {source} INCLUDING ALL)")
        self.conn.execute_raw(f"{OWN} INSERT INTO pg_temp.{q} OVERRIDING SYSTEM VALUE SELECT * FROM {picked}")
        self.conn.execute_raw(f"{OWN} VACUUM ANALYZE pg_temp.{q}")

    def _schema(self) -> str:
        row = self.conn.execute_raw("SELECT current_schema()").fetchone()
        return str(row[0]) if row else "public"

    def scaled(self, run: Run) -> Run:
        """``run`` as timed on the sample: a per-label read's N divided by k (module docstring)."""
        params = run.params
        if self.sample <= 1 or not isinstance(params, dict):
            return run
        n = params.get("per_label")
        if not isinstance(n, int) or isinstance(n, bool):
            return run
        return Run(run.sql, {**params, "per_label": max(1, n // self.sample)})

    def drop(self) -> None:
        for table in self.tables:
            self.conn.execute_raw(f"{OWN} DROP TABLE IF EXISTS pg_temp.{quote_identifier(table)}")
