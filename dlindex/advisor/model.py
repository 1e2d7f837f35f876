"""What index advice returns (suggestions, findings on existing indexes, hints, changes), and how it is kept.

The advice ``--suggest`` printed is kept outside the catalog, so ``--apply`` builds exactly
that. It is stored with a fingerprint of what it was computed from: the schema, the query
log (entries, last id, calls, template samples), the ``--log`` texts and the options. When
``--apply`` finds advice stored for the same fingerprint it applies it as printed; otherwise
it says what changed and computes the advice again. The file lives in
``$DLINDEX_CACHE_DIR`` (default ``$XDG_CACHE_HOME/dlindex`` or ``~/.cache/dlindex``), so
``--suggest`` writes nothing into the catalog.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import Field, asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from dlindex.advisor.workload import Skipped
from dlindex.cache_dir import cache_dir
from dlindex.catalog.sandbox import guarded
from dlindex.querylog.importer import LineSource, iter_lines


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
    server: Mapping[str, Any] | None = None  # a PostgreSQL catalog: its workload, verification and timings
    low_cardinality: tuple[Finding, ...] = ()  # existing full indexes led by a flag or status column
    sampled_from: int = 0  # sample > 1: the rows of the largest table the sample was drawn from

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
            "sampled_from": self.sampled_from,
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


_SCHEMA = "SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_master ORDER BY type, name"
_LOG = "SELECT count(*), coalesce(max(id), 0), coalesce(sum(calls), 0) FROM query_log"
_TEMPLATES = "SELECT sql, coalesce(sample_params, '') FROM query_log_templates ORDER BY sql"
FORMAT = 1


@dataclass(frozen=True)
class State:
    """What advice is computed from, as digests; ``key`` combines them."""

    schema: str
    log: tuple[int, int, int]  # entries, last id, calls
    samples: str
    inputs: str  # --log texts and options

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps([self.schema, self.log, self.samples, self.inputs]).encode()).hexdigest()[:16]

    def differs(self, other: Mapping[str, Any]) -> str:
        """Why ``other`` (a stored state) is not this one, in words."""
        reasons = []
        if other.get("schema") != self.schema:
            reasons.append("the schema changed (an index was created or dropped)")
        old = tuple(other.get("log") or (0, 0, 0))
        if old != self.log:
            reasons.append(f"the query log changed ({old[0]:,} -> {self.log[0]:,} entries)")
        elif other.get("samples") != self.samples:
            reasons.append("the logged parameter samples changed")
        if other.get("inputs") != self.inputs:
            reasons.append("the --log files or --top differ")
        return "; ".join(reasons) or "the stored advice is from another version of dlindex"


def current_state(
    path: str | os.PathLike[str], logs: Iterable[tuple[str, LineSource]], options: Mapping[str, Any]
) -> State:
    conn = guarded(path)
    try:
        schema = hashlib.sha256(json.dumps(conn.execute(_SCHEMA).fetchall()).encode()).hexdigest()
        entries, last, calls = conn.execute(_LOG).fetchone()
        samples = hashlib.sha256()
        for sql, params in conn.execute(_TEMPLATES):
            samples.update(f"{len(sql)}:{sql}{len(params)}:{params}".encode())
    finally:
        conn.close()
    inputs = hashlib.sha256(json.dumps(sorted(options.items()), default=str).encode())
    for name, source in logs:
        inputs.update(f"\0{name}\0".encode())
        for line in iter_lines(source):
            inputs.update(line.encode("utf-8", "replace") + b"\n")
    return State(schema, (int(entries), int(last), int(calls)), samples.hexdigest(), inputs.hexdigest())


def memo_dir() -> Path:
    base = os.environ.get("DLINDEX_CACHE_DIR")
    if base:
        return Path(base)
    return cache_dir()


def _file(path: str | os.PathLike[str]) -> Path:
    name = hashlib.sha256(os.fsencode(os.path.realpath(path))).hexdigest()[:16]
    return memo_dir() / f"advice-{name}.json"


def save_advice(path: str | os.PathLike[str], state: State, advice: Advice) -> Path | None:
    """Store ``advice`` for ``state`` (atomically); None when the cache directory is not writable."""
    target = _file(path)
    data = {"format": FORMAT, "catalog": os.path.realpath(path), "state": state.__dict__ | {"log": list(state.log)},
            "key": state.key, "advice": advice.as_dict()}  # fmt: skip
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".advice-", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, target)  # a concurrent --apply never reads half a file
    except OSError:
        return None
    return target


def load_advice(path: str | os.PathLike[str], state: State) -> tuple[Advice | None, str]:
    """(the stored advice for ``state``, "") or (None, why there is none)."""
    try:
        with open(_file(path), encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None, "no `dlindex index --suggest` run is stored for this catalog"
    except (OSError, ValueError):
        return None, "the stored advice cannot be read"
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("state"), dict):
        return None, "the stored advice is from another version of dlindex"
    if data.get("key") != state.key:
        return None, state.differs(data["state"])
    try:
        return advice_from_dict(data["advice"]), ""
    except (KeyError, TypeError, ValueError):
        return None, "the stored advice cannot be read"


def advice_from_dict(d: Mapping[str, Any]) -> Advice:
    """The inverse of ``Advice.as_dict``."""

    def finding(f: Mapping[str, Any]) -> Finding:
        return Finding(**f)

    def suggestion(s: Mapping[str, Any]) -> Suggestion:
        fields = {k: v for k, v in s.items() if k != "speedup"}
        fields["served"] = tuple(Served(**{k: v for k, v in x.items() if k != "speedup"}) for x in s["served"])
        fields["columns"] = tuple(s["columns"])
        fields["update_columns"] = tuple(s["update_columns"])
        return Suggestion(**fields)

    w = d["workload"]
    return Advice(
        catalog=d["catalog"], suggestions=tuple(map(suggestion, d["suggestions"])),
        unused=tuple(map(finding, d["unused"])), redundant=tuple(map(finding, d["redundant"])),
        hints=tuple(Hint(**h) for h in d["hints"]),
        rejected=tuple(Rejected(r["sql"], tuple(r["fingerprints"]), r["reason"]) for r in d["rejected"]),
        skipped=tuple(Skipped(**s) for s in d["skipped"]), reads=w["reads"], writes=w["writes"], hot=tuple(w["hot"]),
        read_ms=w["read_ms"], sample=d["sample"], seconds=d["seconds"], lock_wait_ms=w.get("lock_wait_ms", 0.0),
        slower=tuple(map(finding, d.get("slower", ()))), statements=tuple(Effect(**e) for e in d.get("statements", ())),
        server=d.get("postgresql"), low_cardinality=tuple(map(finding, d.get("low_cardinality", ()))),
        sampled_from=d.get("sampled_from", 0),
    )  # fmt: skip
