"""The ``shard_runs`` table: each ``--part I/N`` run of a job, and the cut it made.

``dlindex merge`` reads it to prove that every part of one job is present once, finished,
and cut alike (dlindex.catalog.merge); see docs/scale-out.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

_START = "INSERT INTO shard_runs (job, subject, part, parts, plan) VALUES (?, ?, ?, ?, ?)"
_FINISH = "UPDATE shard_runs SET state = ?, finished_at = CURRENT_TIMESTAMP WHERE id = ?"
RUN_COLUMNS = "job, subject, part, parts, plan, state, started_at, finished_at"


class ShardRun(NamedTuple):
    job: str  # scan | features
    subject: str  # scan: the root's path; features: the feature type
    part: int
    parts: int
    plan: str  # digest of the cut: equal across the parts of one job
    state: str  # running | completed | interrupted
    started_at: str
    finished_at: str | None


def start_shard_run(catalog: Catalog, job: str, subject: str, part: int, parts: int, plan: str) -> int:
    """Record that part ``part`` (from 0) of ``parts`` of ``job`` on ``subject`` started; its row id."""
    with catalog.write_transaction() as conn:
        run_id = conn.execute(_START, (job, subject, part, parts, plan)).lastrowid
    assert run_id is not None
    return int(run_id)


def finish_shard_run(catalog: Catalog, run_id: int, completed: bool) -> None:
    """Record how part ``run_id`` ended."""
    with catalog.write_transaction() as conn:
        conn.execute(_FINISH, ("completed" if completed else "interrupted", run_id))
