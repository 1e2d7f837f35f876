"""The duplicate benchmark: hash pairs at scale, imagededup side by side, planted leaks (issue #17).

Parts (--parts, default all):
  pairs      dlindex.quality.pairs.hash_pairs on synthetic 64-bit hashes (clusters of near copies with
             0-7 bits flipped, near-blank low-weight hashes, uniform background) at 10k, 100k, 1M for
             K = 2, 4 and DEFAULT_MAX_DISTANCE; each run in a fresh process (time with every chunk
             consumed, peak RSS by getrusage); the pair set checked against brute_force_hash_pairs on a
             50k sample.
  imagededup imagededup's search (brute_force_cython, its default on Linux, and pure-Python brute_force)
             on the same hashes, in its own venv ($IDD_PYTHON, default /tmp/idd-venv/bin/python):
             all against all at 10k, a query sample against all 100k (time extrapolated); pair sets
             compared. Then imagededup's DHash().encode_image against dlindex's dhash extractor on
             real and generated images: bit distances and groups at the same K.
  leaks      a catalog of ~100k distinct generated images plus 1,000 planted near copies (resized
             0.5-2x, cropped <= 5%, re-encoded JPEG q 50-90) that the content-hash split of
             `export --split train=0.8,val=0.2` puts in the other split; dhash and thumb computed with
             `dlindex features compute`; recall and false cross-split pairs at the default limits
             (bench/dups_leaks.py).

  python bench/bench_dups.py              # full sizes, writes docs/benchmarks.md
  python bench/bench_dups.py --quick      # small sizes, 1 rep, prints only
  python bench/bench_dups.py --parts scale --rows 1e6,1e7 --baseline REV   # dups_scale.py, its own section
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))
import make_trees as mt
from common import compile_sources, write_section

PY = sys.executable
IDD_PY = os.environ.get("IDD_PYTHON", "/tmp/idd-venv/bin/python")
MARKERS = ("<!-- bench_dups:start -->", "<!-- bench_dups:end -->")
CORES = len(os.sched_getaffinity(0))


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# --------------------------------------------------------------------------- synthetic hashes
def synthetic_hashes(n: int, seed: int = 17) -> np.ndarray:
    """n uint64 hashes: 30% in clusters of 2-8 near copies (0-7 bits flipped from a centre),
    0.5% near-blank (each bit set with p 0.08, as flat images hash), the rest uniform; shuffled."""
    rng = np.random.default_rng([seed, n])
    n_clustered, n_blank = int(0.3 * n), int(0.005 * n)
    sizes = rng.integers(2, 9, n_clustered // 2 + 1)
    sizes = sizes[: int(np.searchsorted(np.cumsum(sizes), n_clustered)) + 1]
    centres = rng.integers(0, 2**63, sizes.size, dtype=np.uint64) * np.uint64(2) + rng.integers(
        0, 2, sizes.size, dtype=np.uint64
    )
    members = np.repeat(centres, sizes)[:n_clustered]
    flips = rng.integers(0, 8, members.size)
    bits = np.uint64(1) << rng.integers(0, 64, (members.size, 7)).astype(np.uint64)
    masks = np.bitwise_or.reduce(np.where(np.arange(7) < flips[:, None], bits, np.uint64(0)), axis=1)
    blank = np.packbits(rng.random((n_blank, 64)) < 0.08, axis=1, bitorder="little").view("<u8").reshape(-1)
    uniform = rng.integers(0, 2**63, n - members.size - n_blank, dtype=np.uint64) * np.uint64(2)
    out = np.concatenate([members ^ masks, blank.astype(np.uint64), uniform])
    return out[rng.permutation(out.size)]


def candidates(hashes: np.ndarray, k: int) -> int:
    """Candidate pairs multi-index hashing checks: pairs with an equal value in some band."""
    from dlindex.quality.pairs import _MOST_BANDS, _bands

    if k + 1 > _MOST_BANDS:
        return hashes.size * (hashes.size - 1) // 2
    total = 0
    for shift, mask in _bands(k + 1):
        _, counts = np.unique((hashes >> np.uint64(shift)) & np.uint64(mask), return_counts=True)
        total += int((counts.astype(np.int64) * (counts - 1) // 2).sum())
    return total


def pair_keys(i: np.ndarray, j: np.ndarray, n: int) -> np.ndarray:
    return np.sort(np.minimum(i, j).astype(np.int64) * n + np.maximum(i, j))


def child_pairs(job: dict[str, Any]) -> dict[str, Any]:
    """One timed hash_pairs (or brute force) run in this fresh process."""
    from dlindex.quality.pairs import brute_force_hash_pairs, hash_pairs

    hashes = synthetic_hashes(job["n"])
    if job.get("sample"):
        hashes = hashes[: job["sample"]]
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    run = brute_force_hash_pairs if job["brute"] else hash_pairs
    keys: list[np.ndarray] = []
    count = 0
    t0 = time.perf_counter()
    for i, j, _ in run(hashes, job["k"]):
        count += i.size
        if job.get("out"):
            keys.append(pair_keys(i, j, hashes.size))
    wall = time.perf_counter() - t0
    if job.get("out"):
        np.save(job["out"], np.sort(np.concatenate(keys)) if keys else np.zeros(0, np.int64))
    return {"wall_s": wall, "pairs": count, "rss_before_mib": rss_before,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # fmt: skip


def in_child(job: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        proc = subprocess.run([PY, __file__, "--child", json.dumps(job)], capture_output=True, text=True, env=env,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"rc {proc.returncode}"])[-1][:300]}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def part_pairs(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    from dlindex.quality.duplicate_groups import DEFAULT_MAX_DISTANCE

    sizes = [2_000, 10_000, 50_000] if a.quick else [10_000, 100_000, 1_000_000]
    ks = sorted({2, 4, DEFAULT_MAX_DISTANCE})
    rows = []
    for n in sizes:
        hashes = synthetic_hashes(n)
        for k in ks:
            cand = candidates(hashes, k)
            if cand > a.max_candidates:  # would run for many minutes: report the count that says why
                rows.append({"n": n, "k": k, "candidates": cand, "error": f"not run: {cand:.2e} candidate pairs"})
                continue
            runs = [in_child({"n": n, "k": k, "brute": False}, timeout=a.pair_timeout) for _ in range(a.reps)]
            ok = [r for r in runs if "error" not in r]
            row: dict[str, Any] = {"n": n, "k": k, "candidates": cand}
            if ok:
                row |= {"wall_s": median([r["wall_s"] for r in ok]), "pairs": ok[0]["pairs"],
                        "peak_rss_mib": max(r["peak_rss_mib"] for r in ok),
                        "rss_before_mib": ok[0]["rss_before_mib"], "runs": len(ok)}  # fmt: skip
            else:
                row["error"] = runs[0]["error"]
            rows.append(row)
            print(f"pairs n={n:,} K={k}: {json.dumps(row)}", file=sys.stderr)
    sample = 5_000 if a.quick else 50_000
    checks = []
    for k in ks:
        fast, slow = work / f"pairs-fast-{k}.npy", work / f"pairs-brute-{k}.npy"
        f = in_child({"n": sizes[-1], "sample": sample, "k": k, "brute": False, "out": str(fast)})
        b = in_child({"n": sizes[-1], "sample": sample, "k": k, "brute": True, "out": str(slow)})
        same = "error" not in f and "error" not in b and np.array_equal(np.load(fast), np.load(slow))
        checks.append({"k": k, "sample": sample, "pairs": f.get("pairs"), "identical": bool(same),
                       "fast_s": f.get("wall_s"), "brute_s": b.get("wall_s")})  # fmt: skip
        print(f"brute-force check K={k}: {checks[-1]}", file=sys.stderr)
    return {"rows": rows, "checks": checks, "default_k": DEFAULT_MAX_DISTANCE}


# --------------------------------------------------------------------------- imagededup
def idd(mode: str, job: dict[str, Any], timeout: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    try:
        proc = subprocess.run([IDD_PY, str(HERE / "dups_idd.py"), mode, f.name], capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    finally:
        os.unlink(f.name)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"rc {proc.returncode}"])[-1][:300]}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def idd_version() -> str | None:
    proc = subprocess.run([IDD_PY, "-c", "import importlib.metadata as m; print(m.version('imagededup'))"],
                          capture_output=True, text=True)  # fmt: skip
    return proc.stdout.strip() if proc.returncode == 0 else None


def part_imagededup(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    from dlindex.quality.pairs import hash_pairs

    version = idd_version()
    if version is None:
        return {"error": f"imagededup not installed at {IDD_PY} (python3 -m venv /tmp/idd-venv && "
                         "/tmp/idd-venv/bin/pip install --no-deps imagededup && /tmp/idd-venv/bin/pip install "
                         "numpy Pillow PyWavelets scipy tqdm scikit-learn)"}  # fmt: skip
    out: dict[str, Any] = {"version": version, "rows": []}
    full_n, big_n = (2_000, 10_000) if a.quick else (10_000, 100_000)
    k = 4
    for n, method, queries in [(full_n, "brute_force_cython", None), (big_n, "brute_force_cython", a.idd_queries),
                               (big_n, "brute_force", max(2, a.idd_queries // 20))]:  # fmt: skip
        hashes = synthetic_hashes(n)
        path, found = work / f"idd-hashes-{n}.npy", work / f"idd-pairs-{n}-{method}.npy"
        np.save(path, hashes)
        picked = (
            None if queries is None else sorted(np.random.default_rng(n).choice(n, queries, replace=False).tolist())
        )
        times = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            pairs = [(i, j) for i, j, _ in hash_pairs(hashes, k)]
            times.append(time.perf_counter() - t0)
        ours = pair_keys(np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs]), n)
        r = idd("search", {"hashes": str(path), "k": k, "method": method, "workers": CORES,
                           "queries": picked, "out": str(found)}, timeout=a.idd_timeout)  # fmt: skip
        row: dict[str, Any] = {"n": n, "k": k, "method": method, "queries": queries or n, "dlindex_s": median(times)}
        if "error" in r:
            row["error"] = r["error"]
        else:
            theirs_pairs = np.load(found)
            theirs = (
                pair_keys(theirs_pairs[:, 0], theirs_pairs[:, 1], n) if theirs_pairs.size else np.zeros(0, np.int64)
            )
            if picked is not None:  # only the pairs that touch a query are comparable
                q = np.zeros(n, bool)
                q[picked] = True
                ours = ours[q[ours // n] | q[ours % n]]
            row |= {"idd_s": r["wall_s"], "idd_full_s": r["wall_s"] * n / r["queries"], "idd_rss_mib": r["peak_rss_mib"],
                    "pairs_dlindex": int(ours.size), "pairs_idd": int(theirs.size),
                    "only_dlindex": int(np.setdiff1d(ours, theirs).size), "only_idd": int(np.setdiff1d(theirs, ours).size)}  # fmt: skip
            row["speedup"] = row["idd_full_s"] / row["dlindex_s"]
        out["rows"].append(row)
        print(f"imagededup {json.dumps(row)}", file=sys.stderr)
    out["definitions"] = hash_definitions(a, work)
    return out


def definition_images(a: argparse.Namespace, work: Path) -> list[tuple[str, str]]:
    """(path, source) of real pictures where the OS ships some, and generated ones with near copies."""
    import dups_leaks

    per = 40 if a.quick else 150
    files: list[tuple[str, str]] = []
    for root, source in (
        (Path("/usr/share/backgrounds"), "backgrounds"),
        (Path("/usr/share/openclipart/png"), "openclipart"),
    ):
        found = (
            sorted(p for p in root.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png")) if root.is_dir() else []
        )
        step = max(1, len(found) // per)
        files += [(str(p), source) for p in found[::step][:per]]
    gen = dups_leaks.definition_set(work / "dhash-defs", per)
    return files + [(p, "generated") for p in gen]


def hash_definitions(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """imagededup DHash vs dlindex dhash on the same files: bit distances, and groups at the same K."""
    from PIL import Image

    from dlindex.features.extractors import dhash
    from dlindex.quality.duplicate_groups import DEFAULT_MAX_DISTANCE
    from dlindex.quality.hashes import pack_bits
    from dlindex.quality.pairs import hash_pairs

    images = definition_images(a, work)
    r = idd("encode", {"files": [p for p, _ in images]}, timeout=a.idd_timeout)
    if "error" in r:
        return {"error": r["error"]}
    keep = [k for k, h in enumerate(r["hashes"]) if h]  # imagededup returns None for files it cannot read
    theirs_bits = np.unpackbits(np.frombuffer(bytes.fromhex("".join(r["hashes"][k] for k in keep)), np.uint8)).reshape(
        -1, 64
    )
    ours_bits = []
    for k in keep:
        with Image.open(images[k][0]) as im:
            ours_bits.append(np.asarray(dhash(im)))
    ours, theirs = pack_bits(np.asarray(ours_bits)), pack_bits(theirs_bits)
    dist = np.bitwise_count(ours ^ theirs)
    sources = np.array([images[k][1] for k in keep])
    by_source = {s: {"n": int((sources == s).sum()), "p50": float(np.median(dist[sources == s])),
                     "p90": float(np.percentile(dist[sources == s], 90)), "max": int(dist[sources == s].max())}
                 for s in sorted(set(sources.tolist()))}  # fmt: skip
    groups = {}
    for k in sorted({4, DEFAULT_MAX_DISTANCE}):
        sets = []
        for h in (ours, theirs):
            pairs = [(i, j) for ci, cj, _ in hash_pairs(h, k) for i, j in zip(ci.tolist(), cj.tolist(), strict=True)]
            sets.append(_components(len(h), pairs))
        same = len(set(sets[0]) & set(sets[1]))
        groups[k] = {"dlindex": len(sets[0]), "imagededup": len(sets[1]), "identical": same}
    return {"images": len(keep), "unreadable": len(images) - len(keep), "by_source": by_source,
            "hist": np.bincount(dist, minlength=8)[:8].tolist(), "groups": groups}  # fmt: skip


def _components(n: int, pairs: list[tuple[int, int]]) -> list[tuple[int, ...]]:
    parent = list(range(n))

    def root(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    for i, j in pairs:
        ri, rj = root(i), root(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    members: dict[int, list[int]] = {}
    for x in range(n):
        members.setdefault(root(x), []).append(x)
    return [tuple(m) for m in members.values() if len(m) > 1]


# --------------------------------------------------------------------------- report
def _s(x: float | None) -> str:
    return "-" if x is None else (f"{x:.2f}" if x < 10 else f"{x:,.0f}")


def render(res: dict[str, Any], meta: dict[str, Any]) -> str:
    import dups_leaks

    lines = [MARKERS[0], "## Duplicates and leaks (bench/bench_dups.py)", "",
             f"Measured {meta['when']} on {meta['machine']} (Python {meta['python']}, numpy {meta['numpy']}); "
             f"medians of {meta['reps']} reps, each timed run in a fresh process. CPU busy with other processes "
             f"at the start: {meta['others_busy']:.0%}. Reproduce: `{meta['command']}`."]  # fmt: skip
    p = res.get("pairs")
    if p:
        lines += ["", "### Hash pairs: dlindex.quality.pairs.hash_pairs", "",
                  "| hashes | K | candidate pairs | pairs | seconds | peak RSS MiB |", "|---|---|---|---|---|---|"]  # fmt: skip
        for r in p["rows"]:
            if "error" in r:
                lines.append(f"| {r['n']:,} | {r['k']} | {r['candidates']:,} | {r['error']} | | |")
            else:
                lines.append(f"| {r['n']:,} | {r['k']} | {r['candidates']:,} | {r['pairs']:,} | {_s(r['wall_s'])} "
                             f"| {r['peak_rss_mib']:,.0f} |")  # fmt: skip
        lines.append("")
        lines.append("Against brute_force_hash_pairs: " + "; ".join(
            f"K={c['k']} on {c['sample']:,}: {c['pairs']:,} pairs, {'identical' if c['identical'] else '**DIFFERENT**'} "
            f"({_s(c['fast_s'])} s vs {_s(c['brute_s'])} s)" for c in p["checks"]) + ".")  # fmt: skip
    d = res.get("imagededup")
    if d and "error" not in d:
        lines += ["", f"### imagededup {d['version']} side by side (K = 4, same hashes as hex strings)", "",
                  "| hashes | imagededup search | queries run | imagededup s (all queries) | dlindex s | dlindex faster "
                  "| pairs dlindex / imagededup | only one side |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in d["rows"]:
            if "error" in r:
                lines.append(
                    f"| {r['n']:,} | {r['method']} | {r['queries']:,} | {r['error']} | {_s(r['dlindex_s'])} | | | |"
                )
                continue
            est = "" if r["queries"] == r["n"] else f" (measured {_s(r['idd_s'])} s, x {r['n'] // r['queries']:,})"
            lines.append(f"| {r['n']:,} | {r['method']} | {r['queries']:,} | {_s(r['idd_full_s'])}{est} | "
                         f"{_s(r['dlindex_s'])} | {r['speedup']:,.0f}x | {r['pairs_dlindex']:,} / {r['pairs_idd']:,} | "
                         f"{r['only_dlindex']} / {r['only_idd']} |")  # fmt: skip
        defs = d["definitions"]
        if "error" not in defs:
            src = "; ".join(f"{s}: {v['n']} images, median {v['p50']:.0f}, p90 {v['p90']:.0f}, max {v['max']}"
                            for s, v in defs["by_source"].items())  # fmt: skip
            grp = "; ".join(f"K={k}: {v['dlindex']} groups (dlindex) / {v['imagededup']} (imagededup), {v['identical']} identical"
                            for k, v in defs["groups"].items())  # fmt: skip
            lines += ["", f"Hash definitions on {defs['images']} images (DHash().encode_image vs dlindex's dhash extractor), "
                      f"bits apart: {src}; images at 0..7 bits: {defs['hist']}. Groups: {grp}."]  # fmt: skip
    elif d:
        lines += ["", f"imagededup: not run: {d['error']}"]
    if res.get("leaks"):
        lines += ["", *dups_leaks.render(res["leaks"])]
    lines += ["", *targets(res), "", *HOW, MARKERS[1]]
    return "\n".join(lines)


def targets(res: dict[str, Any]) -> list[str]:
    """The issue's targets against this run's figures."""
    rows: list[tuple[str, str, bool]] = []
    for r in res.get("pairs", {}).get("rows", []):
        if r["n"] >= 1_000_000 and r["k"] <= 4 and "error" not in r:
            rows.append((f"1M hashes, K={r['k']}: seconds / peak RSS MiB", f"{r['wall_s']:.1f} / {r['peak_rss_mib']:,.0f}",
                         r["wall_s"] <= 60 and r["peak_rss_mib"] <= 1024))  # fmt: skip
    for c in res.get("pairs", {}).get("checks", []):
        rows.append((f"identical to brute force, 50k sample, K={c['k']}", str(c["identical"]), bool(c["identical"])))
    for r in res.get("imagededup", {}).get("rows", []):
        if r["n"] >= 100_000 and r.get("method") == "brute_force_cython" and "speedup" in r:
            rows.append(("vs imagededup brute_force_cython at 100k", f"{r['speedup']:,.0f}x", r["speedup"] >= 10))
    lk = res.get("leaks")
    if lk:
        t = next(s for s in lk["colorthumb"]["sweep"] if s["limit"] == lk["colorthumb"]["default"])
        d = next(s for s in lk["dhash"]["sweep"] if s["limit"] == lk["dhash"]["default"])
        rows.append((f"leak recall, colorthumb at {t['limit']} (default)", f"{t['recall']:.3f}", t["recall"] >= 0.99))
        rows.append((f"false pairs, colorthumb at {t['limit']} (default)", f"{t['false']:.2%}", t["false"] <= 0.01))
        rows.append((f"false pairs, dhash at {d['limit']} (default; recall {d['recall']:.3f})", f"{d['false']:.2%}",
                     d["false"] <= 0.01))  # fmt: skip
        for f in ("colorthumb", "dhash"):
            x = lk[f]
            rows.append(
                (f"leaks / dups runtime, {f}", f"{x['leaks_s'] / x['dups_s']:.2f}", x["leaks_s"] <= 2 * x["dups_s"])
            )
    out = ["| target (issue #17) | measured | |", "|---|---|---|"]
    return out + [f"| {name} | {value} | {'pass' if ok else '**FAIL**'} |" for name, value, ok in rows]


HOW = [
    "How: hashes are synthetic (bench_dups.synthetic_hashes: 30% in clusters of 2-8 copies 0-7 bits from a",
    "centre, 0.5% near-blank, the rest uniform); *candidate pairs* are the pairs with an equal band value that the",
    "exact popcount check looks at, which sets the time: it grows with n^2 / 2^(64/(K+1)), so K = 2, 4 stay",
    "near-linear while wide K (narrow bands) approaches brute force. imagededup gets the same hashes as 16-digit",
    "hex strings, num_dist_workers = the cores here; its brute_force_cython search converts the whole",
    "database from hex for every query, so at 100k only a random sample of queries is run and the time is",
    "scaled by n / queries (each query costs the same); pair sets are compared on the pairs touching those",
    "queries. Leaks: see bench/dups_leaks.py; split = dlindex.export.plan.split_of on the content hash, as",
    "`export --split` assigns it.",
    "Hash definitions: both are a 9x8 grayscale difference hash with the same bit layout; imagededup",
    "resizes the RGB image with LANCZOS and then converts to L, drops alpha (RGBA -> RGB keeps whatever colour",
    "the transparent pixels hold), dlindex composites over white, lets JPEG decode at reduced scale (draft) and",
    "resizes L with BOX. On opaque photos that moves a few bits (median 4); on transparent clip art the",
    "background decides most bits (median 26), so groups differ there.",
    "Leaks tree (bench/dups_leaks.py, version 2): 100,000 pictures of 96-256 px, each from its own seed: a",
    "two-colour linear gradient at a random angle, 3-9 random filled ellipses/rectangles/triangles/thick lines,",
    "a band of stripes or checks, 0-2 words of text (DejaVu Sans) and grain (sd 0-6); 70% JPEG q60-95, 30% PNG",
    "quantised to 32-128 colours. 1,000 of them get a near copy (crop <= 5% per dimension in total, resize",
    "0.5-2x bicubic, JPEG q50-90) kept only where the content-hash split puts it in the other split.",
    "The previous run (24-64 px random colour fields, 16x16 grey `thumb`) found 98.5% false pairs at 0.01;",
    "its embedding_pairs took 119 s (100k x 256, row blocks of CHUNK_PAIRS / n); the tiled version takes",
    "the colorthumb time above (100k x 432, 2048 x 2048 tiles, threshold 0.1).",
    "dhash on this tree: gradients and large flat shapes make many images within K bits of the flat hash",
    "(7,683 of 101,000 at K = 10, left out with a warning), and unrelated pictures whose 9x8 grey layout is",
    "alike reach 0 bits apart: a 64-bit grey hash is not enough to tell 100k structured pictures apart.",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, 1 rep, no docs")
    ap.add_argument("--parts", default="pairs,imagededup,leaks")
    ap.add_argument("--reps", type=int, help="default 3; --quick 1")
    ap.add_argument("--images", type=int, help="leaks: distinct images (default 100,000; --quick 3,000)")
    ap.add_argument("--planted", type=int, help="leaks: planted cross-split copies (default 1,000; --quick 100)")
    ap.add_argument(
        "--thumb-limit", type=float, default=0.1, help="leaks: largest colorthumb threshold run (full size)"
    )
    ap.add_argument("--idd-queries", type=int, default=200, help="imagededup queries run at 100k")
    ap.add_argument("--idd-timeout", type=float, default=900)
    ap.add_argument("--pair-timeout", type=float, default=300)
    ap.add_argument("--max-candidates", type=float, default=3e9, help="skip a size/K with more candidate pairs")
    ap.add_argument("--work", help="work dir (default $DLINDEX_BENCH_DIR or /tmp/dlindex-bench)")
    ap.add_argument("--docs", default=str(REPO / "docs" / "benchmarks.md"))
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--from-json", help="render a saved result file instead of measuring")
    ap.add_argument("--rows", default="1e6", help="scale: catalog sizes (make_catalog.ensure_catalog)")
    ap.add_argument("--baseline", default="HEAD", help="scale: the git revision measured as 'before'")
    ap.add_argument("--commands", default="all", help="scale: commands of dups_scale.COMMANDS, comma-separated")
    ap.add_argument("--scale-timeout", type=float, default=3600, help="scale: seconds per command")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child_pairs(json.loads(a.child))))
        return 0
    a.reps = a.reps or (1 if a.quick else 3)
    compile_sources()
    base = mt.work_dir(a.work)
    work = base / "dups"
    work.mkdir(parents=True, exist_ok=True)
    import bench_loader

    if a.from_json:
        saved = json.loads(Path(a.from_json).read_text())
        res, meta = saved["results"], saved["meta"]
    else:
        meta = {"when": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "python": platform.python_version(),
                "numpy": np.__version__, "machine": f"{CORES} cores ({os.cpu_count()} online), {platform.machine()}",
                "reps": a.reps, "others_busy": bench_loader.cpu_busy(),
                "command": ("python bench/bench_dups.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip()}  # fmt: skip
        res: dict[str, Any] = {}
        parts = a.parts.split(",")
        if "pairs" in parts:
            res["pairs"] = part_pairs(a, work)
        if "imagededup" in parts:
            res["imagededup"] = part_imagededup(a, work)
        if "leaks" in parts:
            import dups_leaks

            res["leaks"] = dups_leaks.part_leaks(a, base)
        if "scale" in parts:  # its own section: sizes from make_catalog, before/after in one run
            import dups_scale

            res["scale"] = dups_scale.part_scale(a, base)
        raw = base / f"bench_dups-{time.strftime('%Y%m%d-%H%M%S')}.json"
        raw.write_text(json.dumps({"meta": meta, "results": res}, indent=1, default=str))
        print(f"raw results: {raw}", file=sys.stderr)
    if res.get("scale"):
        import dups_scale

        scale = "\n".join(dups_scale.render(res.pop("scale"), meta))
        print(scale)
        if not a.quick and not a.no_docs:
            write_section(Path(a.docs), *dups_scale.MARKERS, scale)
        if not res:
            return 0
    section = render(res, meta)
    print(section)
    if not a.quick and not a.no_docs:
        write_section(Path(a.docs), *MARKERS, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
