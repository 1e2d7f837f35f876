"""Index advice from the query log: ``dlindex index``.

    from dlindex import Catalog
    from dlindex.advisor import apply_advice, suggest_indexes

    with Catalog("train.db") as catalog:
        advice = suggest_indexes(catalog)            # measured on a scratch copy
        for s in advice.suggestions:
            print(s.sql, s.speedup, s.size_bytes)
        apply_advice(catalog, advice)                # CREATE INDEX ... + ANALYZE, recorded

Modules: ``shapes`` (what a statement asks of each table, via sqlglot), ``workload`` (the
log and captured files), ``candidates`` (derivation and merging), ``scratch`` (the copy and
the guarded connections), ``replay`` (timed, step-counted replays under time and memory
limits), ``leftovers`` (scratch directories of dead runs), ``suggest`` (verification),
``findings``, ``hints``, ``memo`` (the advice ``--suggest`` printed, for ``--apply``),
``manage`` (apply, revert, list), ``model`` (the results).
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
