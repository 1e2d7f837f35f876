"""The near-duplicate hash search by size: dlindex.quality.pairs.hash_pairs at K = 8 (#34).

Spread-out 64-bit hashes (as the benchmark catalog's dhash vectors: bits of a content hash) with
5% planted near copies (1 bit off another hash), 10^5, 10^6, 10^7 of them. Each run is a fresh
process: CPU seconds (user + system, os.wait4), wall seconds and peak RSS of that process.
Before: the K + 1 exact bands of 7 bits (the only layout before #34; the same code path with
band_plan fixed to it), run only where its candidate count (9 n^2 / 256) is under
``--before-max`` (else extrapolated from the largest measured size as n^2, and marked so).
After: the layout band_plan chooses. The pair sets are compared (count and a digest).

  python bench/dups_near.py --sizes 1e5,1e6,1e7 [--before-max 1e10]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
MARKERS = ("<!-- bench_dups_near:start -->", "<!-- bench_dups_near:end -->")
_CHILD = """
import hashlib, json, sys
import numpy as np
from dlindex.quality import pairs
n, side = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(0)
h = rng.integers(0, 2**64, n, dtype=np.uint64)
m = n // 20
src = rng.integers(0, n, m)
h[rng.integers(0, n, m)] = h[src] ^ (np.uint64(1) << rng.integers(0, 64, m).astype(np.uint64))
if side == "before":
    pairs.band_plan = lambda hashes, k: [(s, w, 0) for s, w in pairs._cuts(k + 1)]
plan = pairs.band_plan(h, 8)
found = []
for i, j, d in pairs.hash_pairs(h, 8):
    found.append(i.astype(np.int64) * n + j)
got = np.sort(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)
print(json.dumps({"pairs": int(got.size), "sha": hashlib.sha256(got.tobytes()).hexdigest()[:12], "plan": plan}))
"""


def run(n: int, side: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(n), side], stdout=subprocess.PIPE, env=env, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    got = json.loads(out.strip().splitlines()[-1]) if status == 0 else {"error": f"exit {status}"}
    return {"n": n, "side": side, "wall_s": time.perf_counter() - start, "cpu_s": usage.ru_utime + usage.ru_stime,
            "rss_mib": usage.ru_maxrss / 1024, **got}  # fmt: skip


def render(rows: list[dict[str, Any]], command: str) -> list[str]:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [MARKERS[0], "## Near-duplicate hash search by size (bench/dups_near.py, #34)", "",
             f"Measured {when} on {platform.machine()} ({os.cpu_count()} cores, shared with other jobs; load ~15): "
             "`hash_pairs` at K = 8 on spread-out 64-bit hashes with 5% planted 1-bit copies, a fresh process "
             f"per run. Before = the K + 1 exact 7-bit bands (the layout before #34), after = band_plan's "
             f"choice, same run. Reproduce: `{command}`.", "",
             "| hashes | layout after (shift, width, radius) | CPU s before | CPU s after | wall s after | "
             "peak RSS MiB before | after | pairs |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    keyed = {(r["n"], r["side"]): r for r in rows}
    sizes = sorted({r["n"] for r in rows})
    for n in sizes:
        a, b = keyed.get((n, "after"), {}), keyed.get((n, "before"), {})
        if "estimate" in b:
            before_cpu, before_rss, same = f"~{b['estimate']:,.0f} (n^2 from {b['from']:,})", "", "-"
        else:
            before_cpu, before_rss = f"{b['cpu_s']:,.1f}", f"{b['rss_mib']:,.0f}"
            same = "identical" if b.get("sha") == a.get("sha") else "**differs**"
        lines.append(f"| {n:,} | {a.get('plan')} | {before_cpu} | {a['cpu_s']:,.1f} | {a['wall_s']:,.1f} | "
                     f"{before_rss} | {a['rss_mib']:,.0f} | {a.get('pairs', 0):,} ({same}) |")  # fmt: skip
    for small, big in itertools.pairwise(sizes):
        a, b = keyed[(small, "after")], keyed[(big, "after")]
        lines += ["", f"{small:,} -> {big:,} hashes ({big // small}x): after {b['cpu_s'] / a['cpu_s']:.1f}x CPU; "
                      "before 100x (n^2 candidates)."]  # fmt: skip
    return [*lines, MARKERS[1]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1e5,1e6,1e7")
    parser.add_argument("--before-max", type=float, default=2e9, help="candidate pairs the old layout may check")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md")
    a = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    measured: dict[str, Any] | None = None
    for n in [int(float(x)) for x in a.sizes.split(",")]:
        for side in ("before", "after"):
            if side == "before" and 9 * n * n / 256 > a.before_max:
                assert measured is not None, "the smallest size must run before"
                scale = (n / measured["n"]) ** 2
                rows.append({"n": n, "side": side, "estimate": measured["cpu_s"] * scale, "from": measured["n"]})
            else:
                rows.append(run(n, side))
                if side == "before":
                    measured = rows[-1]
            print(rows[-1], flush=True)
    from common import write_section

    command = "python bench/dups_near.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write_section(a.out, *MARKERS, "\n".join(render(rows, command.strip())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
