"""What index advice returns: suggestions, findings on existing indexes, hints, changes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, asdict, dataclass
from typing import Any, ClassVar

from dlindex.advisor.workload import Skipped


class _Record:
    """A dataclass whose JSON form is its fields as they are."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # what asdict needs; each subclass is a dataclass

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Served:
    """One fingerprint an index serves, timed on the scratch copy (median ms per call)."""

    fingerprint: str
    sql: str
    calls: int
    before_ms: float
    after_ms: float

    @property
    def speedup(self) -> float | None:
        return round(self.before_ms / self.after_ms, 1) if self.after_ms > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "speedup": self.speedup}


@dataclass(frozen=True)
class Suggestion:
    name: str
    table: str
    sql: str  # CREATE INDEX ...
    columns: tuple[str, ...]
    where: str | None  # the partial-index WHERE, if any
    covering: bool  # columns were added so the statements it serves never read the table
    served: tuple[Served, ...]
    before_ms: float  # per call, weighted by the calls of the fingerprints it serves
    after_ms: float
    saved_ms: float  # over the logged workload: sum of calls x (before - after)
    size_bytes: int
    insert_10k_ms: float | None  # time it adds to inserting 10,000 rows
    update_10k_ms: float | None  # ... and to updating update_columns of 10,000 rows
    update_columns: tuple[str, ...]
    write_cost_ms: float  # what it adds to the logged writes

    @property
    def speedup(self) -> float | None:
        return round(self.before_ms / self.after_ms, 1) if self.after_ms > 0 else None

    @property
    def fingerprints(self) -> tuple[str, ...]:
        return tuple(s.fingerprint for s in self.served)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["served"] = [s.as_dict() for s in self.served]
        data["speedup"] = self.speedup
        return data


@dataclass(frozen=True)
class Finding(_Record):
    """An existing index that no logged statement needs."""

    kind: str  # unused | redundant | slower | low_cardinality
    name: str
    table: str
    sql: str
    reason: str
    better: str | None  # the index that makes it redundant
    dlindex: bool  # created by `dlindex index --apply`
    droppable: bool  # `--drop-unused` would drop it
    drop_sql: str


@dataclass(frozen=True)
class Hint(_Record):
    fingerprint: str
    sql: str
    calls: int
    mean_ms: float | None
    hint: str


@dataclass(frozen=True)
class Effect(_Record):
    """One logged statement on the scratch copy: before (the catalog as it is) and after the suggestions.

    Reads: median ms per call. Writes (INSERT, UPDATE): ms per call, from timing WRITE_ROWS rows
    with and without the suggestions on their table.
    """

    fingerprint: str
    kind: str  # read | write
    sql: str
    calls: int
    before_ms: float | None  # None: not timed (see change)
    after_ms: float | None
    change: str  # faster | no faster | same plan | counted against the suggestions | unchanged | why not timed


@dataclass(frozen=True)
class Rejected(_Record):
    sql: str  # the candidate's CREATE INDEX
    fingerprints: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Advice:
    """The result of ``suggest_indexes``."""

    catalog: str
    suggestions: tuple[Suggestion, ...]
    unused: tuple[Finding, ...]
    redundant: tuple[Finding, ...]
    hints: tuple[Hint, ...]
    rejected: tuple[Rejected, ...]
    skipped: tuple[Skipped, ...]
    reads: int  # read fingerprints in the workload
    writes: int
    hot: tuple[str, ...]  # fingerprints that could earn an index
    read_ms: float  # logged read time, all fingerprints
    sample: int  # 1: measured on a full copy; k: on every k-th row of the large tables
    seconds: float
    lock_wait_ms: float = 0.0  # logged time spent waiting for the write lock
    slower: tuple[Finding, ...] = ()  # existing indexes the logged statements that use them are faster without
    statements: tuple[Effect, ...] = ()  # every logged statement, before and after the suggestions
    server: Mapping[str, Any] | None = None  # a PostgreSQL catalog: its workload, verification and Dexter's set
    low_cardinality: tuple[Finding, ...] = ()  # existing full indexes led by a flag or status column

    def droppable(self) -> tuple[Finding, ...]:
        found = {f.name: f for f in (*self.unused, *self.redundant, *self.slower, *self.low_cardinality) if f.droppable}
        return tuple(found.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "catalog": self.catalog,
            "suggestions": [s.as_dict() for s in self.suggestions],
            "unused": [f.as_dict() for f in self.unused],
            "redundant": [f.as_dict() for f in self.redundant],
            "slower": [f.as_dict() for f in self.slower],
            "low_cardinality": [f.as_dict() for f in self.low_cardinality],
            "statements": [e.as_dict() for e in self.statements],
            "hints": [h.as_dict() for h in self.hints],
            "rejected": [r.as_dict() for r in self.rejected],
            "skipped": [s.as_dict() for s in self.skipped],
            "workload": {
                "reads": self.reads,
                "writes": self.writes,
                "hot": list(self.hot),
                "read_ms": self.read_ms,
                "lock_wait_ms": self.lock_wait_ms,
            },
            "sample": self.sample,
            "seconds": self.seconds,
            **({"postgresql": dict(self.server)} if self.server is not None else {}),
        }


@dataclass(frozen=True)
class IndexChange(_Record):
    action: str  # create | drop
    name: str
    table: str
    sql: str


@dataclass(frozen=True)
class Changes:
    """What ``apply_advice`` or ``revert_indexes`` did, in one transaction."""

    run: int | None  # the recorded run (``--revert`` undoes the latest one)
    changes: tuple[IndexChange, ...]
    analyzed: bool

    @property
    def created(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.changes if c.action == "create")

    @property
    def dropped(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.changes if c.action == "drop")

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.run, "created": list(self.created), "dropped": list(self.dropped),
                "changes": [c.as_dict() for c in self.changes], "analyzed": self.analyzed}  # fmt: skip


@dataclass(frozen=True)
class IndexUsage(_Record):
    """One line of ``dlindex index --list``."""

    name: str
    table: str
    sql: str | None
    origin: str  # dlindex | manual | constraint
    fingerprints: int  # logged statements whose plan uses it
    calls: int
    last_used: str | None
    size_bytes: int | None
