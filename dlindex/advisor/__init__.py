"""Index advice from the query log: ``dlindex index``.

    from dlindex import Catalog
    from dlindex.advisor import apply_advice, suggest_indexes

    with Catalog("train.db") as catalog:
        advice = suggest_indexes(catalog)            # measured on a scratch copy
        for s in advice.suggestions:
            print(s.sql, s.speedup, s.size_bytes)
        apply_advice(catalog, advice)                # CREATE INDEX ... + ANALYZE, recorded

Modules, bottom-up, one per stage: ``sqltext`` (parsing logged SQL, rendering identifiers and
literals), ``shapes`` (what a read asks of each table and what a write changes, via sqlglot),
``workload`` (the log and captured files), ``replay`` (reads and writes replayed on the copy,
timed and step-counted under time and memory limits; plans), ``scratch`` (the copy: made,
its schema and statistics, indexes built; the leftovers of dead runs), ``candidates``
(derivation, merging, rewrite hints), ``model`` (the results, and the advice ``--suggest``
printed, kept for ``--apply``), ``verification`` (the logged reads planned and timed; one
candidate alone), ``outcome`` (the suggestions together, findings on existing indexes, the
before/after report), ``suggest`` (the steps in order), ``manage`` (apply, revert, list, on
either backend). A PostgreSQL catalog has its own steps: ``server_workload``
(pg_stat_statements joined with the query log), ``server_plans`` (the server's schema,
statistics, hypopg and timed runs) and ``server`` (``suggest_server_indexes``); the library's
entry points pick them through ``workload.on_server``. Comparing the advice with Dexter's
rule is a benchmark: ``bench/bench_index_postgres.py``.
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
