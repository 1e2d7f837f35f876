"""bench_dups' size part: `dups`, `leaks` and `similar` on generated catalogs of N rows (#34).

For each size a catalog is made once by make_catalog.ensure_catalog (dhash vectors for
--features of the ok rows; 0.5% of the rows repeat an earlier row's content) and copied
(the feature matrix is written beside the catalog), and each command runs in a fresh
process under ``/usr/bin/time -v``: CPU seconds (user + system) and peak RSS. The same-run
baseline is the code of ``--baseline`` (a git revision, extracted with ``git archive``) on
the same copy, so every ratio compares two runs on the same machine minutes apart; the
matrix file is removed before each side's first dhash command, so both pay for building it.
Outputs are compared byte for byte.

  python bench/bench_dups.py --parts scale --rows 1e6,1e7 --baseline 4c9a88b
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MARKERS = ("<!-- bench_dups_scale:start -->", "<!-- bench_dups_scale:end -->")
COMMANDS = {
    "dups (exact)": ["dups", "--format", "jsonl"],
    "dups --type dhash": ["dups", "--type", "dhash", "--format", "jsonl"],
    "dups --type dhash --connected": ["dups", "--type", "dhash", "--connected", "--format", "jsonl"],
    "leaks --split (exact)": ["leaks", "--split", "train=0.9,val=0.1", "--format", "jsonl"],
    "leaks --split --type dhash": ["leaks", "--split", "train=0.9,val=0.1", "--type", "dhash", "--format", "jsonl"],
    "similar --type dhash -k 10": ["similar", "{query}", "--type", "dhash", "-k", "10", "--format", "jsonl"],
}


def timed(code: Path, db: Path, args: list[str], timeout: float) -> dict[str, Any]:
    """One command in a fresh process: CPU s, peak RSS MiB, and a digest of its output."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        cmd = ["nice", "-n", "19", "/usr/bin/time", "-v", sys.executable, "-m", "dlindex", *args,
               "--db", str(db), "--no-log"]  # fmt: skip
        try:
            rc = subprocess.run(cmd, stdout=out, stderr=err, env={**os.environ, "PYTHONPATH": str(code)}, cwd=code,
                                timeout=timeout, check=False).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"error": f"over {timeout:.0f} s"}
        out.seek(0)
        err.seek(0)
        digest, lines = hashlib.sha256(), 0
        for chunk in iter(lambda: out.read(1 << 20), b""):
            digest.update(chunk)
            lines += chunk.count(b"\n")
        report = err.read().decode(errors="replace")
    fields = dict(line.strip().rsplit(": ", 1) for line in report.splitlines() if ": " in line)
    cpu = float(fields.get("User time (seconds)", "nan")) + float(fields.get("System time (seconds)", "nan"))
    return {"rc": rc, "cpu_s": cpu, "rss_mib": int(fields.get("Maximum resident set size (kbytes)", "0")) / 1024,
            "lines": lines, "sha": digest.hexdigest()[:12]}  # fmt: skip


def part_scale(a: Any, base: Path) -> dict[str, Any]:
    import make_catalog

    sizes = [int(float(x)) for x in a.rows.split(",")]
    work = base / "dups-scale"
    work.mkdir(parents=True, exist_ok=True)
    baseline = work / f"code-{a.baseline}"
    if not baseline.exists():
        baseline.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", a.baseline, "dlindex"], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive.stdout, check=True)
    rows: list[dict[str, Any]] = []
    for n in sizes:
        source = make_catalog.ensure_catalog(n, work=base)
        copy = work / f"copy-{n}.db"
        shutil.copyfile(source, copy)
        try:
            with sqlite3.connect(f"file:{copy}?mode=ro", uri=True) as conn:
                hashes = conn.execute("SELECT count(*) FROM image_features WHERE feature_type = 'dhash'").fetchone()[0]
                query = conn.execute(
                    "SELECT min(image_id) FROM image_features WHERE feature_type = 'dhash'"
                ).fetchone()[0]
            for side, code in (("before", baseline), ("after", REPO)):
                shutil.rmtree(Path(f"{copy}-features"), ignore_errors=True)
                for name, args in COMMANDS.items():
                    if name not in a.commands.split(",") and a.commands != "all":
                        continue
                    if "dhash" in args and "similar" not in args and near_candidates(hashes) > a.max_candidates:
                        got = {"error": f"not run: ~{near_candidates(hashes):.1e} candidate pairs"}
                    else:
                        got = timed(code, copy, [x.replace("{query}", str(query)) for x in args], a.scale_timeout)
                    rows.append({"rows": n, "hashes": hashes, "command": name, "side": side, **got})
                    print(rows[-1], flush=True)
        finally:
            for leftover in (copy, Path(f"{copy}-wal"), Path(f"{copy}-shm")):
                leftover.unlink(missing_ok=True)
            shutil.rmtree(Path(f"{copy}-features"), ignore_errors=True)
    return {"baseline": a.baseline, "rows": rows}


def near_candidates(hashes: int, k: int = 8) -> float:
    """Candidate pairs hash_pairs checks on uniform hashes: k + 1 bands of 64 / (k + 1) bits,
    each pairing the hashes that agree on it: (k + 1) * n^2 / 2 / 2^(64 / (k + 1)). Quadratic."""
    return (k + 1) * hashes * hashes / 2 / 2 ** (64 / (k + 1))


def render(res: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    lines = [MARKERS[0], "## dups, leaks and similar by catalog size (bench/dups_scale.py, #34)", "",
             f"Measured {meta['when']} on {meta['machine']}, every command niced, other jobs running: CPU seconds "
             f"(user + system) and peak RSS of the process, not wall time. Before: the code of "
             f"`{res['baseline']}` on the same catalog copy in the same run. Reproduce: `{meta['command']}`.", "",
             "| rows | dhash vectors | command | CPU s before | CPU s after | peak RSS MiB before | after | output |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    keyed = {(r["rows"], r["command"], r["side"]): r for r in res["rows"]}
    for (n, name, side), after in keyed.items():
        if side != "after":
            continue
        before = keyed.get((n, name, "before"), {})
        if "error" in after:
            lines.append(f"| {n:,} | {after['hashes']:,} | `{name}` | {after['error']} | | | | |")
            continue
        same = "identical" if before.get("sha") == after.get("sha") else "**differs**"
        if after.get("rc") or before.get("rc"):
            same += f" (exit {before.get('rc')} / {after.get('rc')})"
        lines.append(f"| {n:,} | {after['hashes']:,} | `{name}` | {_cell(before, 'cpu_s')} | {_cell(after, 'cpu_s')} | "
                     f"{_cell(before, 'rss_mib')} | {_cell(after, 'rss_mib')} | {same}, {after.get('lines', 0):,} lines |")  # fmt: skip
    sizes = sorted({r["rows"] for r in res["rows"]})
    for small, big in itertools.pairwise(sizes):
        grew = []
        for name in COMMANDS:
            a, b = keyed.get((small, name, "after"), {}), keyed.get((big, name, "after"), {})
            was_a, was_b = keyed.get((small, name, "before"), {}), keyed.get((big, name, "before"), {})
            if all("cpu_s" in r for r in (a, b, was_a, was_b)):
                grew.append(f"`{name}` {b['cpu_s'] / a['cpu_s']:.1f}x CPU, RSS {was_a['rss_mib']:,.0f} -> "
                            f"{was_b['rss_mib']:,.0f} MiB before, {a['rss_mib']:,.0f} -> {b['rss_mib']:,.0f} after")  # fmt: skip
        if grew:
            lines += ["", f"From {small:,} to {big:,} rows ({big // small}x): " + "; ".join(grew) + "."]
    return [*lines, MARKERS[1]]


def _cell(r: dict[str, Any], key: str) -> str:
    if "error" in r:
        return r["error"]
    return f"{r[key]:,.1f}" if key == "cpu_s" else f"{r[key]:,.0f}"
