"""The `bench_size` section of docs/benchmarks.md, rendered from every result bench/bench_size.py saved
($DLINDEX_BENCH_DIR/scale-results/<rows>/<case>.json), with a line per command on how its time and
memory grow with the rows and what a 10^9-row catalog would need by projection."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

START, END = "<!-- bench_size:start -->", "<!-- bench_size:end -->"
ORDER = ("export-jsonl", "export-jsonl-split", "export-parquet", "export-csv", "loader-plan", "loader-workers", "stats", "stats-exact",
         "per-label", "time-window", "status-filter", "status-filter-id", "index-suggest",
         "query-jsonl", "check", "mark", "mark-contiguous", "mark-spread", "dups", "leaks", "similar", "merge")  # fmt: skip
TITLES = {
    "export-jsonl": "`export --format jsonl` (the tree's train/ and val/ folders)",
    "export-jsonl-split": "`export --format jsonl --split train=0.9,val=0.1`",
    "export-parquet": "`export --format parquet`",
    "export-csv": "`export --format csv`",
    "loader-plan": "loader epoch plan, `CatalogDataset(world_size=8, rank=3)`",
    "loader-workers": "the same plan and a DataLoader of 2 forked workers (process tree)",
    "stats": "`stats`",
    "stats-exact": "`stats --exact`",
    "per-label": "`query --per-label 32 --seed 0` (index applied)",
    "time-window": "`query --since T --until T+10s` (created_at index applied)",
    "status-filter": "`query --status corrupt` (covering partial index applied)",
    "status-filter-id": "`query --status corrupt` (plain partial (id) index, for comparison)",
    "index-suggest": "`index --suggest`",
    "query-jsonl": "`query --format jsonl` (every row)",
    "check": "`check`",
    "mark": "`mark --unprocessed` of up to 10M ids",
    "mark-contiguous": "`mark --processed` of up to 10M contiguous ids",
    "mark-spread": "`mark --processed` of every 10th id, up to 10M",
    "dups": "`dups` (exact)",
    "leaks": "`leaks --split train=0.9,val=0.1`",
    "similar": "`similar ID --type dhash -k 10`",
    "merge": "`merge CATALOG --into NEW`",
}
GOALS = {  # issue #34's "what it should be"
    "export-jsonl": "peak RSS flat, under 1 GB at 10^8; manifests >= 500k rows/s",
    "export-jsonl-split": "peak RSS flat, under 1 GB at 10^8; manifests >= 500k rows/s",
    "export-parquet": "peak RSS flat, under 1 GB at 10^8; manifests >= 500k rows/s",
    "export-csv": "peak RSS flat, under 1 GB at 10^8; manifests >= 500k rows/s",
    "loader-plan": "~16 bytes a sample, shared by workers",
    "loader-workers": "one copy of the plan, shared by the workers",
    "stats": "about a second at 10^8",
    "per-label": "well under a second at 10^8",
    "time-window": "under a second at 10^8 (after index --apply)",
    "status-filter": "under a second at 10^8 (after index --apply)",
    "index-suggest": "under a minute at 10^8",
    "query-jsonl": ">= 0.7x the bare loop",
    "check": "fine; keep it so",
    "mark": ">= 200k ids/s on a 10^8 catalog",
    "mark-contiguous": ">= 200k ids/s on a 10^8 catalog",
    "mark-spread": ">= 200k ids/s on a 10^8 catalog",
    "dups": "peak RSS under 1 GB at 10^8",
    "leaks": "peak RSS under 1 GB at 10^8",
    "similar": "peak RSS under 1 GB at 10^8",
    "merge": "peak RSS under 1 GB at 10^8",
}
BASELINES = {
    "bare-scan": "one full pass (bare sqlite3 `GROUP BY status`)",
    "bare-jsonl": "bare sqlite3 loop writing the same jsonl",
    "bare-export": "bare sqlite3 loop writing the export's jsonl columns",
    "bare-ids": "bare sqlite3 loop: ids + labels into arrays",
    "bare-update": "bare sqlite3 `UPDATE ... FROM` of the same rows (the restore; a scan of the path index)",
    "bare-update-in": "bare sqlite3 `UPDATE ... WHERE id IN (ids)`, same rows and value, one transaction",
    "before-index": "the same query before its index was built",
    "read loop": "one-process read loop",
}


def load(results: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """{case: {rows: record}} of every saved result."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted(results.glob("*/*.json")):
        record = json.loads(path.read_text())
        out.setdefault(record["case"], {})[int(record["rows"])] = record
    return out


def power(rows: int) -> str:
    exp = math.log10(rows)
    return f"10^{exp:.0f}" if exp == int(exp) else f"{rows:,}"


def mb(x: float) -> str:
    return f"{x:,.0f}"


def secs(x: float) -> str:
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def note(record: dict[str, Any]) -> str:
    extra = record.get("extra", {})
    bits = []
    if "rows_per_s" in extra:
        bits.append(f"{extra['rows_per_s']:,} rows/s")
    if extra.get("output_bytes") and extra.get("selected"):
        bits.append(f"{extra['output_bytes'] / extra['selected']:.0f} B/row out")
    if "ids_per_s" in extra:
        bits.append(f"{extra['ids']:,} ids in a span of {extra['id_span']:,}, {extra['ids_per_s']:,} ids/s")
        if "bare_ids_per_s" in extra:
            base = record["baseline"]
            bits.append(f"bare UPDATE {extra['bare_ids_per_s']:,} ids/s; written "
                        f"{record['figures']['write_mb'] * 1e6 / extra['ids']:,.0f} B/id, bare "
                        f"{base['write_mb'] * 1e6 / extra['ids']:,.0f} B/id; restored")  # fmt: skip
        elif "mark --processed (back)" in record.get("parts", {}):
            bits.append(f"back: {secs(record['parts']['mark --processed (back)']['wall_s'])} s; restored")
    warm = record.get("parts", {}).get("warm")
    if extra.get("cold") and warm:
        bits.append(f"cold: page cache evicted first; warm (2nd run): {secs(warm['wall_s'])} s, "
                    f"{secs(warm['cpu_s'])} CPU s")  # fmt: skip
    if "rows_out" in extra:
        bits.append(f"{extra['rows_out']:,} rows out")
    if "index_build_s" in extra:
        size = f", {extra['index_bytes'] / 1e6:,.0f} MB" if extra.get("index_bytes") else ""
        bits.append(f"index built in {extra['index_build_s']} s{size}")
    if "rss_after_import_mb" in extra:
        own = record["figures"]["peak_rss_mb"] - extra["rss_after_import_mb"]
        samples = extra["batches"] * 256 * 8  # every rank's share, about the selection
        bits.append(f"{extra['rss_after_import_mb']:,.0f} MB is python+torch+dlindex imported; the plan's own "
                    f"~{own:,.0f} MB, ~{own * 2**20 / max(samples, 1):,.0f} B a selected sample")  # fmt: skip
    if "worker_plan_mapped_mb" in extra:
        pss = record["figures"].get("peak_pss_mb")
        bits.append(f"tree Pss {mb(pss)} MB (RSS sums count shared pages once per process)" if pss else "")
        bits.append(f"plan file {extra['plan_file_bytes'] / 2**20:,.1f} MB, mapped by each worker "
                    f"({', '.join(f'{x:,.1f}' for x in extra['worker_plan_mapped_mb'])} MB resident), "
                    f"dataset pickled to each: {extra['pickled_bytes'] / 1000:,.1f} kB")  # fmt: skip
    if "suggestions" in extra:
        bits.append(f"{len(extra['suggestions'])} suggestion(s), sample 1/{extra.get('sample')}")
    if "vectors" in extra:
        bits.append(f"{extra['vectors']:,} vectors")
    if record["figures"].get("rc"):
        bits.append(f"exit {record['figures']['rc']}")
    return "; ".join(bit for bit in bits if bit)


def speed(record: dict[str, Any]) -> str:
    base = record.get("baseline")
    if not base:
        return ""
    ratio = base["cpu_s"] / max(record["figures"]["cpu_s"], 0.01)
    return f"{ratio:.2f}x ({secs(base['cpu_s'])} CPU s)"


def grows(case: str, by_rows: dict[int, dict[str, Any]]) -> str | None:
    """How CPU time and peak RSS grow per 10x rows, and the 10^9 projection from the two largest sizes."""
    done = sorted((r, rec) for r, rec in by_rows.items() if "figures" in rec)
    if len(done) < 2:
        return None
    (r1, a), (r2, b) = done[-2], done[-1]
    decades = math.log10(r2 / r1)
    t = (b["figures"]["cpu_s"] / max(a["figures"]["cpu_s"], 0.01)) ** (1 / decades)
    w = (b["figures"]["wall_s"] / max(a["figures"]["wall_s"], 0.01)) ** (1 / decades)
    m = (b["figures"]["peak_rss_mb"] / max(a["figures"]["peak_rss_mb"], 1)) ** (1 / decades)
    ahead = math.log10(1e9 / r2)
    cpu9 = b["figures"]["cpu_s"] * max(t, 1.0) ** ahead
    rss9 = b["figures"]["peak_rss_mb"] * max(m, 1.0) ** ahead
    disk = b["catalog_bytes"] / r2  # bytes a row of catalog
    extra = b.get("extra", {})
    more = ""
    if extra.get("output_bytes") and extra.get("selected"):
        more = f" + {extra['output_bytes'] / extra['selected'] * 1e9 / 1e9:,.0f} GB of output"
    if case == "merge" and extra.get("target_bytes"):
        more = f" + {extra['target_bytes'] / r2 * 1e9 / 1e9:,.0f} GB for the merged copy"
    if case.startswith("mark") and extra.get("ids"):
        more = " + the WAL: every changed page, up to the catalog's size"
    return (
        f"- {TITLES.get(case, case)}: {power(r1)} -> {power(r2)}: 10x rows -> {t:.1f}x CPU time "
        f"({secs(a['figures']['cpu_s'])} -> {secs(b['figures']['cpu_s'])} s), {w:.1f}x wall, {m:.2f}x peak RSS "
        f"({mb(a['figures']['peak_rss_mb'])} -> {mb(b['figures']['peak_rss_mb'])} MB). 10^9 rows by projection: "
        f"~{human(cpu9)} of CPU, ~{mb(rss9)} MB peak RSS, {disk * 1e9 / 1e9:,.0f} GB of catalog "
        f"({disk:.0f} B/row){more}." + (f" Goal: {GOALS[case]}." if case in GOALS else "")
    )


def human(s: float) -> str:
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def render(results: Path) -> str:
    data = load(results)
    lines = [
        START, "## Every command at size (`bench/bench_size.py`, #34)", "",
        "Each cell is a fresh process on bench/make_catalog.py's catalog of that many rows (1,000 labels): "
        "wall seconds, CPU seconds (user + system of the process and its children, `os.wait4`), peak RSS "
        "of the whole process tree (VmRSS summed over the tree from /proc every 0.1 s, or the largest "
        "process's own peak if higher; cgroup v1's figure would count the page cache). *vs baseline*: the "
        "baseline's CPU seconds over the command's, both measured in the same run on the same catalog "
        "(> 1: faster than the baseline). The machine has 2 cores shared with other jobs: compare CPU "
        "seconds; wall times vary with the load. `code` is the dlindex commit measured. Results "
        "accumulate in `$DLINDEX_BENCH_DIR/scale-results/`; a run refreshes the cells it measures.", "",
        "| command | rows | wall s | CPU s | peak RSS MB | baseline | vs baseline (its CPU s) | note | code, when |",
        "|---|---:|---:|---:|---:|---|---:|---|---|",
    ]  # fmt: skip
    for case in [*ORDER, *sorted(set(data) - set(ORDER) - {"scan"})]:
        for rows, rec in sorted(data.get(case, {}).items()):
            head = f"| {TITLES.get(case, case)} | {power(rows)} |"
            if "figures" not in rec:
                lines.append(
                    f"{head} | | | | | | {rec.get('skipped') or rec.get('failed')} | {rec['code']}, {rec['when']} |"
                )
                continue
            f = rec["figures"]
            base = BASELINES.get(rec.get("baseline", {}).get("name", ""), "")
            lines.append(f"{head} {secs(f['wall_s'])} | {secs(f['cpu_s'])} | {mb(f['peak_rss_mb'])} | {base} | "
                         f"{speed(rec)} | {note(rec)} | {rec['code']}, {rec['when']} |")  # fmt: skip
    scan = data.get("scan", {}).get(2_000_000)
    if scan and "figures" in scan:
        f, p = scan["figures"], scan["parts"]
        read, find, rescan = (
            p["read loop (bench/baselines/read_all.py)"],
            p["find -type f -printf"],
            p["unchanged rescan"],
        )
        lines += [
            "", f"The 2,000,000-file tree (`{scan['command']}`; code {scan['code']}, {scan['when']}, load "
            f"{scan['load'][0]}):", "",
            "| run | wall s | CPU s | peak RSS MB | vs baseline (wall) |", "|---|---:|---:|---:|---:|",
            f"| first scan | {secs(f['wall_s'])} | {secs(f['cpu_s'])} | {mb(f['peak_rss_mb'])} | "
            f"{read['wall_s'] / f['wall_s']:.2f}x the read loop's speed |",
            f"| one-process read loop (baseline) | {secs(read['wall_s'])} | {secs(read['cpu_s'])} | {mb(read['peak_rss_mb'])} | |",
            f"| unchanged rescan | {secs(rescan['wall_s'])} | {secs(rescan['cpu_s'])} | {mb(rescan['peak_rss_mb'])} | "
            f"{rescan['wall_s'] / find['wall_s']:.2f}x `find`'s time |",
            f"| `find -type f -printf` (baseline) | {secs(find['wall_s'])} | {secs(find['cpu_s'])} | {mb(find['peak_rss_mb'])} | |",
        ]  # fmt: skip
    growth = [
        g for case in [*ORDER, *sorted(set(data) - set(ORDER) - {"scan"})] if (g := grows(case, data.get(case, {})))
    ]
    if growth:
        lines += ["", "How each grows (CPU time, less load-sensitive than wall; the two largest sizes measured) and "
                  "what 10^9 rows would need, projecting that growth (never below flat) one or two decades on:", "",
                  *growth]  # fmt: skip
    lines += ["", "```sh", "nice -n 19 python bench/bench_size.py --rows 1e6,1e7            # every case but scan",
              "flock /tmp/dlindex-1e8.lock nice -n 19 python bench/bench_size.py --rows 1e8 --only stats,check",
              "nice -n 19 python bench/bench_size.py --only scan                 # the 2M-file tree",
              "python bench/bench_size.py --render                               # this section from saved results",
              "```", END]  # fmt: skip
    return "\n".join(lines)


def expect_table(results: Path) -> str:
    """docs/scale.md's table: CPU s and peak RSS per command at each size; 10^8 projected (marked)
    from the two largest sizes where it was not measured."""
    data = load(results)
    sizes = (10**6, 10**7, 10**8)
    lines = ["| command | " + " | ".join(f"{power(n)} rows: CPU s, peak RSS" for n in sizes) + " |",
             "|---|" + "---:|" * len(sizes)]  # fmt: skip
    for case in ORDER:
        by_rows = {r: rec for r, rec in data.get(case, {}).items() if "figures" in rec}
        if not by_rows:
            continue
        cells = []
        for n in sizes:
            rec = by_rows.get(n)
            if rec:
                f = rec["figures"]
                cells.append(f"{secs(f['cpu_s'])} s, {mb(f['peak_rss_mb'])} MB")
                continue
            done = sorted(r for r in by_rows if r < n)
            if len(done) < 2:
                cells.append("")
                continue
            a, b = by_rows[done[-2]]["figures"], by_rows[done[-1]]["figures"]
            if case.startswith("mark"):  # it marks up to 10M ids: project by ids, not rows
                last = by_rows[done[-1]]["extra"]
                ids = min(10_000_000, n * last["ids"] // done[-1])
                cells.append(f"~{human(b['cpu_s'] * ids / last['ids'])} for {ids / 1e6:.0f}M ids (projected)")
                continue
            decades, ahead = math.log10(done[-1] / done[-2]), math.log10(n / done[-1])
            t = max((b["cpu_s"] / max(a["cpu_s"], 0.01)) ** (1 / decades), 1.0)
            m = max((b["peak_rss_mb"] / max(a["peak_rss_mb"], 1)) ** (1 / decades), 1.0)
            cells.append(f"~{human(b['cpu_s'] * t**ahead)}, ~{mb(b['peak_rss_mb'] * m**ahead)} MB (projected)")
        lines.append(f"| {TITLES[case]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    import os
    import sys

    default = Path(os.environ.get("DLINDEX_BENCH_DIR") or "/tmp/dlindex-bench") / "scale-results"
    print(expect_table(Path(sys.argv[1]) if len(sys.argv) > 1 else default))
