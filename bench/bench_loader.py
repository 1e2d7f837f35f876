"""The loader benchmark: decoded 224x224 batches into a simulated accelerator, six loaders side by side.

Cases (--cases, default all that run here; see loader_cases.CASES), all with the same W workers
(or W threads) and batch size B, all decoding, resizing to 224x224 and yielding uint8 tensors:
  a  torchvision ImageFolder + torch DataLoader on the loose tree
  b  webdataset (WebDataset + split_by_node + shardshuffle, decode("pil"), to_tuple, map, batched,
     WebLoader) on `dlindex export --format wds`
  c  MosaicML Streaming StreamingDataset(local=...) + torch DataLoader on `dlindex export --format mds`
  d  SPDL 0.8.0's thread pipeline (spdl.io demux/decode/resize, W threads) on the loose files
  e  dlindex.torch.DataLoader on the loose files;  f  the same on the wds export
FFCV is reported, not run, when it does not build (loader_cases.FFCV_BUILD).

Each measured epoch runs in a fresh process. The main process sleeps step_s per batch (the
simulated accelerator step; default B / decode limit, so an ideal pipeline is accelerator-bound)
and times how long each next() blocks. Per case: samples/s, epoch seconds, busy fraction
(step time / epoch wall time), the per-sample wait (wait / B) p50/p99, peak RSS of the process
tree (main + workers, psutil every 50 ms). warm: every source file read into the page cache,
then a short warm-up pass (--warmup-batches) and a measured second epoch; cold: every source file
evicted with posix_fadvise(DONTNEED), the resident fraction checked with fincore (or mincore)
before and after, then the first epoch. Also: the decode limit (cores x one core's decode +
resize rate) and the L1 metadata lookup p50/p99 (>= 10k warm lookups). Medians over --reps;
the case order rotates each rep.

  python bench/bench_loader.py                 # 50k-image tree, writes docs/benchmarks.md
  python bench/bench_loader.py --quick         # 2k images, 1 rep, prints only
  python bench/bench_loader.py --cases a,b,f --reps 5 --images 20000
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))
import loader_cases as lc
import make_trees as mt
from common import compile_sources, write_section

PY = sys.executable
# one section per kind of tree: the ImageNet-like one and the tiny images (--small)
MARKERS = {False: ("<!-- bench_loader:start -->", "<!-- bench_loader:end -->"),
           True: ("<!-- bench_loader_small:start -->", "<!-- bench_loader_small:end -->")}  # fmt: skip
LOOKUPS = 20_000


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def cpu_busy(interval: float = 0.5) -> float:
    """Share of all CPU time busy over ``interval``, just before a run (nothing of ours runs then)."""

    def snap() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]

    t0, i0 = snap()
    time.sleep(interval)
    t1, i1 = snap()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def dlindex(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([PY, "-m", "dlindex", *args, "--quiet"], check=True, env=env)


# --------------------------------------------------------------------------- inputs
def prepare(tree: Path, work: Path) -> lc.Source:
    """The tree's catalog and its wds and mds exports (made once, reused while the tree is unchanged)."""
    stamp = (mt._marker(tree).read_text() if mt._marker(tree).exists() else "") + str(tree)
    src = lc.Source(tree, work / f"{tree.name}.db", work / f"{tree.name}-wds", work / f"{tree.name}-mds")
    marker = work / f"{tree.name}.complete"
    if marker.exists() and marker.read_text() == stamp:
        return src
    for path in (src.db, src.wds, src.mds):
        subprocess.run(["rm", "-rf", str(path)], check=True)
    print(f"cataloguing and exporting {tree} ...", file=sys.stderr)
    dlindex("scan", str(tree), "--db", str(src.db))
    dlindex("export", str(src.wds), "--db", str(src.db), "--format", "wds", "--no-log")
    dlindex("export", str(src.mds), "--db", str(src.db), "--format", "mds", "--no-log")
    marker.write_text(stamp)
    return src


def decode_limit(tree: Path) -> tuple[float, float, str]:
    """(cores x one core's rate, one core's rate, how decoded) on 400 files spread over the tree."""
    cores = len(os.sched_getaffinity(0))
    rate, how = lc.one_core_rate(mt.subset_paths(tree, min(400, _count(tree))))
    return cores * rate, rate, how


def _count(tree: Path) -> int:
    return sum(len(fs) for _, _, fs in os.walk(tree))


def l1_lookup(db: Path, batch: int) -> dict[str, Any]:
    """Per-sample L1 (in-memory) metadata lookup times with the cache warm, over >= LOOKUPS lookups."""
    import random

    conn = __import__("sqlite3").connect(db)
    ids = [r[0] for r in conn.execute("SELECT id FROM image_metadata")]
    conn.close()
    rng = random.Random(0)
    asked = [rng.choice(ids) for _ in range(LOOKUPS)]
    times: list[float] = []
    from dlindex import Catalog
    from dlindex.loader.row_cache import RowCache

    cache = RowCache(Catalog(db), len(ids))
    cache.get_many(ids)  # fill
    for start in range(0, len(asked), batch):
        chunk = asked[start : start + batch]
        t0 = time.perf_counter()
        cache.get_many(chunk)
        times += [(time.perf_counter() - t0) / len(chunk)] * len(chunk)
    how = f"dlindex.loader.row_cache.RowCache.get_many, batches of {batch}, per sample"
    return {"p50_ms": pct(times, 0.5) * 1e3, "p99_ms": pct(times, 0.99) * 1e3, "lookups": len(times), "how": how}


# --------------------------------------------------------------------------- one measured epoch (child)
def child(job: dict[str, Any]) -> dict[str, Any]:
    src = lc.Source(*(Path(job[k]) for k in ("tree", "db", "wds", "mds")))
    params = lc.Params(job["workers"], job["batch_size"])
    make = lc.MAKERS[job["case"]]
    step_s = job["step_s"]
    out: dict[str, Any] = {}
    with lc.TreeRss() as rss:
        epoch = 0
        if job["mode"] == "warm":  # warm-up: start workers, fill the loader's own caches
            loader = make(src, params, epoch)
            for k, _ in enumerate(loader):
                if k + 1 >= job["warmup_batches"]:
                    break
            epoch = 1
            del loader
        loader = make(src, params, epoch)
        waits: list[float] = []
        samples, step_total = 0, 0.0
        t_start = time.perf_counter()
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            wait = time.perf_counter() - t0
            n, images = lc.batch_samples(batch)
            if samples == 0:
                out["first_batch"] = f"{tuple(images.shape)} {images.dtype}"
                assert tuple(images.shape[1:]) == (3, *lc.SIZE), out["first_batch"]
            waits.append(wait / n)
            samples += n
            t1 = time.perf_counter()
            time.sleep(step_s * n / params.batch_size)
            step_total += time.perf_counter() - t1
        wall = time.perf_counter() - t_start
        if hasattr(loader, "stats"):
            out["stats"] = loader.stats()
        del it, loader
    out.update(samples=samples, wall_s=wall, per_s=samples / wall, busy=step_total / wall,
               wait_p50_ms=pct(waits, 0.5) * 1e3, wait_p99_ms=pct(waits, 0.99) * 1e3,
               wait_mean_ms=sum(waits) / max(1, len(waits)) * 1e3, peak_rss_mib=rss.peak / 2**20)  # fmt: skip
    return out


def run_case(case: str, mode: str, src: lc.Source, a: argparse.Namespace, step_s: float) -> dict[str, Any]:
    files = lc.source_files(case, src)
    check: dict[str, Any] = {}
    if mode == "warm":
        lc.warm(files)
        check["resident"], check["via"] = lc.resident_fraction(files)
    else:
        check["resident_before"], check["via"] = lc.resident_fraction(files)
        lc.evict(files)
        check["resident_after"], _ = lc.resident_fraction(files)
    job = {"case": case, "mode": mode, "tree": str(src.tree), "db": str(src.db), "wds": str(src.wds),
           "mds": str(src.mds), "workers": a.workers, "batch_size": a.batch_size, "step_s": step_s,
           "warmup_batches": a.warmup_batches}  # fmt: skip
    check["others_busy"] = cpu_busy()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([PY, __file__, "--child", json.dumps(job)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1][:300] if proc.stderr.strip() else f"rc {proc.returncode}",
                "files": len(files), **check}  # fmt: skip
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "files": len(files), **check}


# --------------------------------------------------------------------------- report
def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[0]["error"] if runs else "not run"}
    keys = ("per_s", "wall_s", "busy", "wait_p50_ms", "wait_p99_ms", "peak_rss_mib")
    return {k: median([r[k] for r in ok]) for k in keys} | {"samples": ok[0]["samples"], "runs": len(ok)}


def ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y else None


def targets(s: dict[str, dict[str, dict[str, Any]]], limit: float, l1: dict[str, Any], rss: dict[int, float]) -> list:
    def get(case: str, mode: str, key: str) -> float | None:
        v = s.get(case, {}).get(mode, {}).get(key)
        return float(v) if v is not None else None

    rss_sizes = sorted(rss)
    rows = [
        ("(f) samples/s / (b), warm", ratio(get("f", "warm", "per_s"), get("b", "warm", "per_s")), 1.2),
        ("(f) samples/s / (b), cold", ratio(get("f", "cold", "per_s"), get("b", "cold", "per_s")), 1.2),
        ("(f) samples/s / decode limit, warm", ratio(get("f", "warm", "per_s"), limit), 0.8),
        ("(f) samples/s / SPDL (d), warm", ratio(get("f", "warm", "per_s"), get("d", "warm", "per_s")), 1.0),
        ("(f) busy fraction, cold", get("f", "cold", "busy"), 0.9),
        ("(f) cold busy / (a) cold busy", ratio(get("f", "cold", "busy"), get("a", "cold", "busy")), 3.0),
        ("L1 lookup p99 (ms), at most", l1["p99_ms"], 0.05),
    ]
    if len(rss_sizes) == 2:
        rows.append((f"(f) peak RSS {rss_sizes[1]:,} / {rss_sizes[0]:,} images, at most",
                     ratio(rss[rss_sizes[1]], rss[rss_sizes[0]]), 1.1))  # fmt: skip
    return rows


def _cell(d: dict[str, Any]) -> str:
    if "error" in d:
        return f"not run: {d['error']}"
    return (f"{d['per_s']:,.0f} | {d['wall_s']:.1f} | {d['busy']:.2f} | "
            f"{d['wait_p50_ms']:.2f} / {d['wait_p99_ms']:.2f}")  # fmt: skip


def render(s: dict[str, Any], meta: dict[str, Any]) -> str:
    start, end = MARKERS[meta["small"]]
    kind = "tiny images" if meta["small"] else "ImageNet-like JPEGs"
    lines = [start, f"## Loaders into a simulated accelerator, {kind} (bench/bench_loader.py)", ""]
    lines.append(
        f"Measured {meta['when']} on {meta['machine']} (Python {meta['python']}); tree: {meta['tree']} "
        f"({meta['images']:,} images); W = {meta['workers']} workers, B = {meta['batch_size']}; medians of "
        f"{meta['reps']} reps, case order rotated per rep. Decode limit: {meta['cores']} cores x "
        f"{meta['one_core']:,.0f} samples/s ({meta['decode_how']}) = {meta['limit']:,.0f} samples/s; "
        f"step = {meta['step_ms']:.1f} ms per batch. CPU busy with other processes just before a run: "
        f"{meta['others_busy']}. Reproduce: `{meta['command']}`."
    )
    lines += ["", "| case | warm samples/s | warm epoch s | warm busy | warm wait p50 / p99 ms/sample "
              "| cold samples/s | cold epoch s | cold busy | cold wait p50 / p99 ms/sample | peak RSS MiB |",
              "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for case, desc in lc.CASES.items():
        if case not in s["cases"]:
            continue
        w, c = s["cases"][case].get("warm", {"error": "-"}), s["cases"][case].get("cold", {"error": "-"})
        if "error" in w and "error" in c and w["error"] == c["error"]:
            lines.append(f"| ({case}) {desc} | not run: {w['error']} | | | | | | | | |")
            continue
        w_cells = _cell(w) if "error" not in w else "not run | | |" + " "
        c_cells = _cell(c) if "error" not in c else "not run | | |" + " "
        rss = max(d.get("peak_rss_mib", 0) for d in (w, c))
        lines.append(f"| ({case}) {desc} | {w_cells} | {c_cells} | {rss:,.0f} |")
    lines.append(f"| FFCV | not run: {lc.FFCV_BUILD} | | | | | | | | |")
    lines += ["", "| target | measured | target | |", "|---|---|---|---|"]
    for name, value, goal in s["targets"]:
        at_most = "at most" in name
        ok = "" if value is None else ("pass" if (value <= goal if at_most else value >= goal) else "**FAIL**")
        shown = "n/a (case not run)" if value is None else f"{value:.3f}"
        lines.append(f"| {name} | {shown} | {'≤' if at_most else '≥'} {goal} | {ok} |")
    l1 = s["l1"]
    lines += ["", f"L1 lookup: p50 {l1['p50_ms']:.4f} ms, p99 {l1['p99_ms']:.4f} ms over {l1['lookups']:,} "
              f"warm lookups ({l1['how']}).", f"Cold-run eviction check: {s['eviction']}."]  # fmt: skip
    if s["rss_scaling"]:
        lines.append("Peak RSS of (f) by tree size: "
                     + ", ".join(f"{n:,} images: {v:,.0f} MiB" for n, v in sorted(s["rss_scaling"].items())) + ".")  # fmt: skip
    lines += [
        "",
        "How: each measured epoch is a fresh process whose main thread sleeps one accelerator step per batch and",
        "times each next(); busy = step time / epoch wall time (worker start-up included). Peak RSS sums the RSS",
        "of the main process and every descendant (shared pages count once per process). Warm: every source file",
        "read first (resident fraction checked), a warm-up pass of a few batches, then a new epoch measured. Cold:",
        "posix_fadvise(POSIX_FADV_DONTNEED) on every source file (images, shards, and the catalog for e/f) after",
        "sync, then the first epoch; directory entries and inodes stay cached (fadvise cannot drop them).",
        end,
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- main
def pick_tree(a: argparse.Namespace, base: Path) -> Path:
    if a.tree:
        return Path(a.tree).resolve()
    spec = mt.QUICK if a.quick else mt.FULL
    tree = mt.ensure_small(spec, base) if a.small else mt.ensure_big(spec, base)
    if a.images and a.images < _count(tree):
        tree = mt.ensure_links(tree, a.images)
    return tree


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", help="class-folder image tree (default: bench/make_trees.py's 50k ImageNet-like tree)")
    ap.add_argument("--small", action="store_true", help="the tiny-image tree (~24-64 px) instead")
    ap.add_argument("--quick", action="store_true", help="2k images, 1 rep, no docs (smoke test)")
    ap.add_argument("--images", type=int, help="use a hard-linked prefix of N images of the tree")
    ap.add_argument("--cases", default=",".join(lc.CASES))
    ap.add_argument("--modes", default="warm,cold")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="W (default: cores)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--reps", type=int, help="default 3; --quick 1")
    ap.add_argument("--step-ms", type=float, help="accelerator step per batch (default B / decode limit)")
    ap.add_argument("--warmup-batches", type=int, default=10)
    ap.add_argument("--rss-scaling", action="store_true", help="also run (f) on a quarter-size tree, report both RSS")
    ap.add_argument("--work", help="work dir (default $DLINDEX_BENCH_DIR or /tmp/dlindex-bench)")
    ap.add_argument("--docs", default=str(REPO / "docs" / "benchmarks.md"))
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return 0
    compile_sources()
    base = mt.work_dir(a.work)
    work = base / "loader"
    work.mkdir(parents=True, exist_ok=True)
    reps = a.reps or (1 if a.quick else 3)
    tree = pick_tree(a, base)
    src = prepare(tree, work)
    images = _count(tree)
    limit, one_core, how = decode_limit(tree)
    step_s = a.step_ms / 1e3 if a.step_ms else a.batch_size / limit
    print(f"decode limit {limit:,.0f} samples/s ({one_core:,.0f} on one core, {how}); step {step_s * 1e3:.1f} ms "
          f"per batch of {a.batch_size}", file=sys.stderr)  # fmt: skip
    cases = [c for c in a.cases.split(",") if c]
    skipped = {c: why for c in cases if (why := lc.unavailable(c))}
    if "d" in cases and "d" not in skipped and (why := lc.spdl_decoder_check(next(p for p in src.tree.rglob("*.jpg")))):
        skipped["d"] = why
    print(f"FFCV: {lc.FFCV_BUILD}", file=sys.stderr)
    for c, why in skipped.items():
        print(f"skipping ({c}) {lc.CASES[c]}: {why}", file=sys.stderr)
    runnable = [c for c in cases if c not in skipped]
    modes = a.modes.split(",")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {c: {m: [] for m in modes} for c in runnable}
    evictions: list[str] = []
    for rep in range(reps):
        order = runnable[rep % max(1, len(runnable)) :] + runnable[: rep % max(1, len(runnable))]
        for case in order:
            for mode in modes:
                r = run_case(case, mode, src, a, step_s)
                runs[case][mode].append(r)
                if mode == "cold":
                    evictions.append(f"({case}) {r['resident_before']:.1%} -> {r['resident_after']:.1%}")
                print(f"rep {rep} ({case}) {mode}: {json.dumps(r, default=str)[:600]}", file=sys.stderr)
    rss_scaling: dict[int, float] = {}
    if a.rss_scaling and "f" in runnable:
        small = prepare(mt.ensure_links(tree, images // 4), work)
        rss_scaling = {images // 4: run_case("f", "warm", small, a, step_s).get("peak_rss_mib", float("nan")),
                       images: summary(runs["f"].get("warm", []))["peak_rss_mib"]}  # fmt: skip
    elif a.rss_scaling:
        print("--rss-scaling needs case (f), which is not available", file=sys.stderr)
    l1 = l1_lookup(src.db, a.batch_size)
    summaries = {c: {m: summary(runs[c][m]) for m in modes} for c in runnable}
    summaries |= {c: {m: {"error": skipped[c]} for m in modes} for c in skipped}
    via = next((r.get("via") for c in runs.values() for rs in c.values() for r in rs), "fincore")
    s = {"cases": summaries, "l1": l1, "rss_scaling": rss_scaling,
         "eviction": f"resident fraction before -> after eviction ({via}): " + "; ".join(evictions[:12]) if evictions else "no cold runs"}  # fmt: skip
    s["targets"] = targets(summaries, limit, l1, rss_scaling)
    meta = {"when": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "python": platform.python_version(),
            "machine": f"{os.cpu_count()} cores, {platform.machine()}", "tree": tree.name, "images": images,
            "small": bool(a.small), "workers": a.workers, "batch_size": a.batch_size, "reps": reps, "cores": len(os.sched_getaffinity(0)),
            "one_core": one_core, "decode_how": how, "limit": limit, "step_ms": step_s * 1e3,
            "command": "python bench/bench_loader.py " + " ".join(argv if argv is not None else sys.argv[1:])}  # fmt: skip
    busy = [r["others_busy"] for c in runs.values() for rs in c.values() for r in rs]
    meta["others_busy"] = f"median {median(busy):.0%}, max {max(busy, default=0):.0%}"
    section = render(s, meta)
    print(section)
    raw = base / f"bench_loader-{time.strftime('%Y%m%d-%H%M%S')}.json"
    raw.write_text(json.dumps({"meta": meta, "summary": s, "runs": runs}, indent=1, default=str))
    if not a.quick and not a.no_docs:
        write_section(Path(a.docs), *MARKERS[bool(a.small)], section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
