"""The loader's epoch plan at size: peak RSS (the process, and the process tree's Pss with its
DataLoader workers), wall and CPU seconds and bytes a sample, today's against a previous dlindex
in the same run on the same catalog, and what each DataLoader worker holds of it (#34).

  git archive main dlindex | tar -x -C /tmp/old          # the previous approach
  nice -n 19 python bench/bench_loader_plan.py --db /tmp/c1m.db --db /tmp/c10m.db --before /tmp/old

Each (catalog, dlindex) pair runs in a fresh process under /usr/bin/time -v:
``CatalogDataset(db, world_size=8, rank=3, batch_size=256)`` planned for 2 workers (the query, the
order, the rank's share), then a torch DataLoader of 2 workers (fork, then spawn) whose workers
each map or receive the plan, take their part of the stream and report their memory
(/proc/self/status: RssAnon is private, RssFile + RssShmem shared). Images are not read; the
catalog is opened with DLINDEX_NO_LOG=1 (nothing written to it). A plan that fails with a
DlindexError (too little room for it) is one line on stderr and exit status 1. Writes the
`bench_loader_plan` section of docs/benchmarks.md; ``--render`` rebuilds it from saved runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, write_section
from torch.utils.data import IterableDataset

MARKERS = ("<!-- bench_loader_plan:start -->", "<!-- bench_loader_plan:end -->")
WORLD, RANK, BATCH, WORKERS = 8, 3, 256, 2


def memory() -> dict[str, int]:
    """This process's resident memory: VmHWM (peak), Rss, and from smaps_rollup Pss and Private
    (what no other process shares)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Pss", "Private_Clean", "Private_Dirty"):
                out[key] = int(value.split()[0]) * 1024
    out["Private"] = out.pop("Private_Clean", 0) + out.pop("Private_Dirty", 0)
    return out


class Probe(IterableDataset):  # type: ignore[type-arg]
    """An iterable dataset: in each worker, the worker's stream of the plan, touched, and its memory."""

    def __init__(self, dataset: Any) -> None:
        super().__init__()
        self.dataset = dataset

    def __iter__(self) -> Any:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        plan = self.dataset.plan(workers)
        stream = plan.layout.stream(RANK, worker)
        ids = plan.selection.ids[stream]
        labels = plan.selection.labels[stream]
        yield {"worker": worker, "samples": int(ids.size), "checksum": int(ids.sum() + labels.sum()), **memory()}


def tree(root: int) -> list[int]:
    """``root`` and every process below it (from /proc/*/stat's parent ids)."""
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return out


def tree_memory(root: int) -> tuple[int, int]:
    """(sum of Rss, sum of Pss) over the process tree: Pss counts a shared page once in all."""
    rss = pss = 0
    for pid in tree(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key == "Rss":
                        rss += int(value.split()[0]) * 1024
                    elif key == "Pss":
                        pss += int(value.split()[0]) * 1024
        except (OSError, ValueError):
            continue
    return rss, pss


def child(db: str, workers: str) -> dict[str, Any]:
    from dlindex.errors import DlindexError
    from dlindex.torch import CatalogDataset

    try:
        return _child(db, workers, CatalogDataset)
    except DlindexError as e:  # what a user's script should do: one line, a non-zero exit
        print(f"dlindex: {e}", file=sys.stderr)
        raise SystemExit(1) from None


def _child(db: str, workers: str, CatalogDataset: Any) -> dict[str, Any]:
    import resource

    started = time.perf_counter()
    dataset = CatalogDataset(db, world_size=WORLD, rank=RANK, batch_size=BATCH)
    if workers == "baseline":  # the same process without the plan: python, torch, dlindex
        return {"seconds": 0.0, "batches": 0, "selected": 0, "main": memory(), "plan_file_bytes": None,
                "pickled_bytes": 0}  # fmt: skip
    usage, began = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    plan = dataset.plan(WORKERS)  # planned once, for the workers below too
    after, plan_s = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - began
    batches = plan.layout.batches()  # len(dataset)
    out: dict[str, Any] = {"seconds": round(time.perf_counter() - started, 2), "batches": batches,
                           "plan_s": round(plan_s, 2), "plan_cpu_s": round(after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime, 2),
                           "selected": getattr(plan, "selected", len(plan.selection)),
                           "rank_samples": len(plan.selection), "main": memory()}  # fmt: skip
    shared = getattr(plan, "shared", None)
    out["plan_file_bytes"] = shared.size if shared is not None else None
    import pickle

    out["pickled_bytes"] = len(pickle.dumps(dataset))
    if workers:
        import torch.utils.data as tud

        for context in workers.split(","):
            loader = tud.DataLoader(Probe(dataset), batch_size=None, num_workers=WORKERS,
                                    multiprocessing_context=context)  # fmt: skip
            started = time.perf_counter()
            got = list(loader)
            out[f"workers_{context}"] = {"seconds": round(time.perf_counter() - started, 2), "workers": got}
    return out


def run(db: str, impl: str, workers: str) -> dict[str, Any]:
    """One child under /usr/bin/time -v (peak RSS of the main process, CPU seconds of the whole
    tree), its process tree's Rss and Pss summed every 0.2 s (peaks kept)."""
    env = {**os.environ, "PYTHONPATH": impl, "DLINDEX_NO_LOG": "1"}  # the shared catalogs stay unwritten
    cmd = ["/usr/bin/time", "-v", sys.executable, __file__, "--child", db, "--child-workers", workers]
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks = [0, 0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            rss, pss = tree_memory(proc.pid)
            peaks[0], peaks[1] = max(peaks[0], rss), max(peaks[1], pss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"{impl} on {db} failed:\n{stderr[-3000:]}")
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr)
    result["peak_rss"] = int(peak.group(1)) * 1024 if peak else None
    cpu = [float(m) for m in re.findall(r"(?:User|System) time \(seconds\): ([0-9.]+)", stderr)]
    result["cpu_s"] = round(sum(cpu), 2)
    result["wall_s"] = round(time.perf_counter() - began, 2)
    result["tree_rss"], result["tree_pss"] = peaks
    return result


def mb(n: float | None) -> str:
    return "" if n is None else f"{n / 1e6:,.0f} MB"


def render(rows: list[tuple[str, str, dict[str, Any], dict[str, Any]]], command: str) -> str:
    lines = [MARKERS[0], "## Loader epoch plan at size (`bench/bench_loader_plan.py`, #34)", "",
             f"`CatalogDataset(db, world_size={WORLD}, rank={RANK}, batch_size={BATCH})` planned for a "
             f"DataLoader of {WORKERS} workers (`len()` is its batches): the epoch's query, order and "
             "this rank's share, no image read. A fresh process each; \"before\" is main's dlindex in the "
             "same run on the same catalog. Plan s and CPU s: the plan alone (wall; user+system of the "
             "process). Peak RSS: the main process (`/usr/bin/time -v`); the plan's own: that less the "
             "same process without the plan (python, torch, dlindex: ~620 MB); bytes/sample: the plan's "
             "own over the samples selected. Tree Pss: the process tree's proportional memory summed "
             "(sampled every 0.2 s; a page shared by the workers counted once), main and its 2 workers "
             "(fork, then spawn) each taking their part of the plan. Worker heap: RssAnon (python and "
             "torch are ~300 MB of it); plan mapped: RssShmem, the plan file in /dev/shm as mapped.", "",
             "| catalog | dlindex | plan s | plan CPU s | peak RSS (main) | the plan's own | bytes/sample "
             "| tree Pss peak (main + workers) | plan file | pickled dataset | worker heap, fork / spawn "
             "| worker's plan mapped, fork / spawn |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for db, name, r, base in rows:
        n = max(1, r["selected"])
        own = r["peak_rss"] - base["peak_rss"]
        cells = []
        for key in ("RssAnon", "RssShmem"):
            per = [mb(max(w[key] for w in r[f"workers_{c}"]["workers"])) for c in ("fork", "spawn")
                   if r.get(f"workers_{c}", {}).get("workers")]  # fmt: skip
            cells.append(" / ".join(per))
        lines.append(f"| {Path(db).name} ({r['selected']:,} selected) | {name} | {r.get('plan_s', r['seconds'])} | "
                     f"{r.get('plan_cpu_s', '')} | {mb(r['peak_rss'])} | {mb(own)} | {own / n:,.1f} | "
                     f"{mb(r.get('tree_pss'))} | {mb(r['plan_file_bytes'])} | {r['pickled_bytes']:,} B | "
                     f"{cells[0]} | {cells[1]} |")  # fmt: skip
    lines += ["", f"    {command}", "", MARKERS[1]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", action="append", default=[], help="a catalog (repeat for several sizes)")
    ap.add_argument("--before", help="a previous dlindex source tree (the folder holding dlindex/)")
    ap.add_argument("--workers", default="fork,spawn", help="DataLoader contexts to probe ('' for none)")
    ap.add_argument("--docs", default=str(REPO / "docs" / "benchmarks.md"))
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument(
        "--render",
        action="append",
        default=[],
        help="write the docs from saved runs' output (their JSON lines; repeat for several)",
    )
    ap.add_argument("--command", default="", help="the command(s) to quote under the table with --render")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-workers", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.child_workers)))
        return 0
    impls = ([("before", a.before)] if a.before else []) + [("this", str(REPO))]
    rows: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = []
    for saved in a.render:
        for line in Path(saved).read_text().splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                rows.append((r["db"], r["dlindex"], r, {"peak_rss": r["baseline_rss"]}))
    for db in a.db if not a.render else []:
        for name, impl in impls:
            base = run(db, impl, "baseline")
            r = run(db, impl, a.workers)
            print(json.dumps({"db": db, "dlindex": name, **r, "baseline_rss": base["peak_rss"]}), flush=True)
            rows.append((db, name, r, base))
    if not a.no_docs and rows:
        args = [x for x in (sys.argv[1:] if argv is None else argv) if x != "--render" and x not in a.render]
        command = "python bench/bench_loader_plan.py " + " ".join(args) if args else a.command
        if a.render and a.command:
            command = a.command
        write_section(Path(a.docs), *MARKERS, render(rows, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
