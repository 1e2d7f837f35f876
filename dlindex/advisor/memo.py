"""The advice ``--suggest`` printed, kept outside the catalog, so ``--apply`` builds exactly that.

The advice is stored with a fingerprint of what it was computed from: the schema, the query
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlindex.advisor.model import Advice, Effect, Finding, Hint, Rejected, Served, Suggestion
from dlindex.advisor.workload import Skipped
from dlindex.catalog.sandbox import guarded
from dlindex.querylog.importer import LineSource, iter_lines

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
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "dlindex"


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
    )  # fmt: skip
