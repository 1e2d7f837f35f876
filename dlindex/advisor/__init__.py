"""Index advice from the query log: ``dlindex index``.

    from dlindex import Catalog
    from dlindex.advisor import apply_advice, suggest_indexes

    with Catalog("train.db") as catalog:
        advice = suggest_indexes(catalog)            # measured on a scratch copy
        for s in advice.suggestions:
            print(s.sql, s.speedup, s.size_bytes)
        apply_advice(catalog, advice)                # CREATE INDEX ... + ANALYZE, recorded

Modules, bottom-up: ``sqltext`` (parsing logged SQL, rendering identifiers and literals),
``shapes`` (what a read asks of each table, via sqlglot), ``write_shapes`` (what a write
changes), ``workload`` (the log and captured files), ``sandbox`` (read-only connections for
logged statements), ``replay`` (timed, step-counted replays under time and memory limits),
``plans`` (EXPLAIN QUERY PLAN and what a plan uses), ``leftovers`` (scratch directories of
dead runs), ``scratch`` (the copy: schema, building indexes), ``copy_stats`` (its row and
value statistics), ``write_cost`` (what an index adds to inserts and updates),
``candidates`` (derivation and merging), ``bench`` (the logged reads planned and timed),
``verify`` (one candidate alone), ``regressions`` (the suggestions together, existing indexes
without), ``effects`` (the before/after report), ``findings``, ``hints``, ``suggest`` (the
steps in order), ``memo`` (the advice ``--suggest`` printed, for ``--apply``), ``manage``
(apply, revert, list), ``model`` (the results). A PostgreSQL catalog has its own steps:
``pgworkload`` (pg_stat_statements joined with the query log), ``pgplans`` (the server's schema,
statistics, hypopg and timed runs), ``postgres`` (``suggest_server_indexes``), ``dexter``
(Dexter's rule, for comparison) and ``pgmanage`` (apply, revert, list on the server).
"""

from dlindex.advisor.manage import apply_advice, list_indexes, revert_indexes
from dlindex.advisor.model import (
    Advice,
    Changes,
    Effect,
    Finding,
    Hint,
    IndexChange,
    IndexUsage,
    Rejected,
    Served,
    Suggestion,
)
from dlindex.advisor.suggest import suggest_indexes
from dlindex.advisor.workload import Skipped

__all__ = [
    "Advice",
    "Changes",
    "Effect",
    "Finding",
    "Hint",
    "IndexChange",
    "IndexUsage",
    "Rejected",
    "Served",
    "Skipped",
    "Suggestion",
    "apply_advice",
    "list_indexes",
    "revert_indexes",
    "suggest_indexes",
]
