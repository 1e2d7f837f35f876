"""How `dlindex index` shows advice, index lists and changes (stdout), and what it asks (stderr)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import typer

from dlindex.advisor import Advice, Changes, Finding, apply_advice, list_indexes, revert_indexes, suggest_indexes
from dlindex.advisor.manage import advice_state
from dlindex.advisor.model import load_advice, save_advice
from dlindex.catalog.connection import Catalog
from dlindex.cli._shared import human_bytes, print_json, stderr_console, stdout_console
from dlindex.querylog.importer import LineSource


def suggest(catalog: Catalog, logs: list[tuple[str, LineSource]], options: dict[str, Any], status: Any, time_limit: float,
            memory_mib: int) -> Advice:  # fmt: skip
    """Compute the advice and keep it for a later --apply on the same state."""
    progress = (lambda line: status.update(line[:100])) if status is not None else None
    key, state = advice_state(catalog, logs, options)
    advice = suggest_indexes(catalog, logs, top=options["top"], progress=progress, time_limit_s=time_limit,
                             memory_limit_bytes=memory_mib * 2**20)  # fmt: skip
    save_advice(key, state, advice)
    return advice


def stored(catalog: Catalog, logs: list[tuple[str, LineSource]], options: dict[str, Any]) -> Advice | None:
    """The advice --suggest printed for this very state, or None after saying why it is recomputed."""
    advice, why = load_advice(*advice_state(catalog, logs, options))
    if advice is not None:
        stderr_console.print("applying the advice `dlindex index --suggest` printed for this state", markup=False)
    else:
        stderr_console.print(f"computing the advice again: {why}", markup=False, highlight=False, soft_wrap=True)
    return advice


def report_skipped(advice: Advice) -> None:
    for s in advice.skipped:
        where = f"{s.source} line {s.line}" if s.line is not None else s.source
        stderr_console.print(f"{where}: skipped: {s.reason}: {s.text}", markup=False, highlight=False, soft_wrap=True)


def print_advice(a: Advice) -> None:
    out = stdout_console
    if not a.reads:
        out.print("the query log holds no reads yet: run the workload (dlindex query, Catalog.read) or pass --log FILE",
                  markup=False)  # fmt: skip
        return
    sample = ""
    if a.sample > 1:  # the times below are the sample's, not the catalog's
        sample = (f" (advised from a sample: every {a.sample}th row of large tables, about "
                  f"{a.sampled_from // a.sample:,} of {a.sampled_from:,} rows; times are the sample's)")  # fmt: skip
    where = f"on the server{sample}" if a.server is not None else f"on a scratch copy{sample}"
    out.print(f"{len(a.suggestions)} suggestion(s) for {len(a.hot)} hot of {a.reads} logged read statements "
              f"({a.read_ms:,.1f} ms logged), verified {where} in {a.seconds:.1f} s", markup=False)  # fmt: skip
    for i, s in enumerate(a.suggestions, 1):
        out.print(f"\n{i}. {s.sql};", markup=False, highlight=False, soft_wrap=True)
        out.print(f"   {s.before_ms:,.3f} -> {s.after_ms:,.3f} ms per call ({s.speedup or '-'}x), {s.saved_ms:,.1f} ms saved "
                  f"over the log; size {human_bytes(s.size_bytes)}; 10,000 rows: insert +{_ms(s.insert_10k_ms)}, "
                  f"update of {', '.join(s.update_columns) or '-'} +{_ms(s.update_10k_ms)}", markup=False, soft_wrap=True)  # fmt: skip
        for fp in s.served:
            line = f"     {fp.fingerprint}  {fp.calls:,} calls  {fp.before_ms:,.3f} -> {fp.after_ms:,.3f} ms  "
            out.print(
                line + _short(fp.sql, max(30, out.width - len(line))), markup=False, highlight=False, soft_wrap=True
            )
    _findings("unused indexes", a.unused)
    _findings("redundant indexes", a.redundant)
    _findings("indexes that make logged statements slower", a.slower)
    _findings("full indexes led by a flag or status column", a.low_cardinality)
    _effects(a)
    if a.hints:
        out.print("\nhints:", markup=False)
        for h in a.hints:
            out.print(f"  {h.fingerprint} ({h.calls:,} calls, {_ms(h.mean_ms)}): {_short(h.sql, 80)}\n    {h.hint}",
                      markup=False, highlight=False, soft_wrap=True)  # fmt: skip
    if a.server is not None:
        _server(a.server)
    if a.rejected:
        out.print("\nnot worth it:", markup=False)
        for r in a.rejected:
            out.print(f"  {r.sql}\n    {r.reason}", markup=False, highlight=False, soft_wrap=True)


def _server(server: Any) -> None:
    """A server catalog: where the workload came from, how it was verified, and what the advice saves."""
    out, w, ms = stdout_console, server["workload"], server["workload_ms"]
    out.print(f"\nworkload: {w['log']} statement(s) from dlindex's query log, {w['pg_stat_statements']} from "
              f"pg_stat_statements, {w['joined']} in both; {server['verified']}", markup=False, soft_wrap=True)  # fmt: skip
    out.print(f"logged reads on the server, calls x ms: {_ms(ms['before'])} now, {_ms(ms['dlindex'])} with dlindex's "
              "advice", markup=False, soft_wrap=True)  # fmt: skip


def _effects(a: Advice) -> None:
    if not a.statements or not a.suggestions:
        return
    out = stdout_console
    out.print("\nevery logged statement, before -> after the suggestions (ms per call):", markup=False)
    for e in a.statements:
        figures = (
            "not timed" if e.before_ms is None or e.after_ms is None else f"{e.before_ms:,.3f} -> {e.after_ms:,.3f}"
        )
        line = f"  {e.fingerprint} {e.kind:5} {e.calls:>7,} calls  {figures}  {e.change}  "
        out.print(line + _short(e.sql, max(30, out.width - len(line))), markup=False, highlight=False, soft_wrap=True)


def _findings(title: str, findings: Sequence[Finding]) -> None:
    if not findings:
        return
    stdout_console.print(f"\n{title}:", markup=False)
    for f in findings:
        owner = "" if f.dlindex else "  (not created by dlindex: --drop-unused leaves it; " + f.drop_sql + ")"
        stdout_console.print(
            f"  {f.name} on {f.table}: {f.reason}{owner}", markup=False, highlight=False, soft_wrap=True
        )


def confirm_drops(drops: Sequence[Finding]) -> bool:
    names = ", ".join(f.name for f in drops)
    return bool(typer.confirm(f"Drop {len(drops)} unused index(es): {names}?", default=False, err=True))


def apply(catalog: Catalog, advice: Advice, *, create: bool, drops: Sequence[Finding]) -> Changes:
    return apply_advice(catalog, advice, create=create, drop=drops)


def print_changes(c: Changes) -> None:
    if not c.changes:
        stdout_console.print("nothing to change: no new index to create, none to drop", markup=False)
        return
    for change in c.changes:
        stdout_console.print(f"{'created' if change.action == 'create' else 'dropped'} {change.name}", markup=False)
    tail = "; ran ANALYZE" if c.analyzed else ""
    stdout_console.print(f"run {c.run}{tail}; undo with: dlindex index --revert", markup=False)


def revert(catalog: Catalog, as_json: bool) -> None:
    changes = revert_indexes(catalog)
    if as_json:
        print_json(changes.as_dict())
    elif changes.run is None:
        stdout_console.print("nothing to revert", markup=False)
    else:
        for change in changes.changes:
            stdout_console.print(
                f"{'recreated' if change.action == 'create' else 'dropped'} {change.name}", markup=False
            )
        stdout_console.print(f"reverted run {changes.run}", markup=False)


def listing(catalog: Catalog, as_json: bool) -> None:
    usages = list_indexes(catalog)
    if as_json:
        print_json({"indexes": [u.as_dict() for u in usages]})
        return
    for u in usages:
        size = human_bytes(u.size_bytes) if u.size_bytes is not None else "size unknown"
        stdout_console.print(
            f"{u.name} on {u.table} ({u.origin}): {u.fingerprints:,} logged statement(s), {u.calls:,} call(s), "
            f"last used {u.last_used or 'never'}, {size}", markup=False, highlight=False, soft_wrap=True,
        )  # fmt: skip


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f} ms"


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
