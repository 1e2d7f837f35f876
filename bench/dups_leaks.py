"""bench_dups' leak part: distinct generated images, planted cross-split near copies, recall and false pairs.

The trees of make_trees.py draw every file from a pool of a few hundred pictures (made unique
by a metadata tag only), so most of their files are pixel copies of each other: useless for
counting false pairs. This tree renders every image from its own seed (``picture``: 96-256 px,
a two-colour linear gradient, 3-9 random filled shapes, a band of stripes or checks, 0-2 words
of text and a little grain; earlier versions drew 24-64 px colour fields, so alike in grayscale
that different pictures really looked the same), then plants near copies of some: cropped by
up to 5% of each side in total, resized 0.5-2x, re-encoded as JPEG at quality 50-90. A copy is kept only when
the content-hash split of ``export --split train=0.8,val=0.2`` (plan.split_of) puts it in the
other split than its original, until the planted count is reached.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import make_trees as mt
import numpy as np
import xxhash
from PIL import Image, ImageDraw, ImageFont

REPO = Path(__file__).resolve().parent.parent
SPLITS = {"train": 0.8, "val": 0.2}
PER_CLASS = 1_000
VERSION = 2
_FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
_WORDS = ("cat", "dog", "SALE", "2026", "river", "OPEN", "data", "north", "7 km", "blue", "menu", "exit")


@functools.lru_cache(maxsize=64)
def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:
        return ImageFont.truetype(_FONT, size)
    except OSError:
        return ImageFont.load_default()


def picture(rng: np.random.Generator, w: int, h: int) -> Image.Image:
    """One distinct structured picture: gradient + shapes + a texture band + text + grain."""
    c0, c1 = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    angle = rng.uniform(0, 2 * np.pi)
    yy, xx = np.mgrid[0:h, 0:w]
    t = (xx * np.cos(angle) + yy * np.sin(angle)).astype(np.float32)
    t = (t - t.min()) / max(1e-6, float(t.max() - t.min()))
    base = c0[None, None, :] * (1 - t[..., None]) + c1[None, None, :] * t[..., None]
    im = Image.fromarray(base.astype(np.uint8))
    d = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(3, 10))):
        x0, y0 = int(rng.integers(-w // 4, w)), int(rng.integers(-h // 4, h))
        x1, y1 = x0 + int(rng.integers(w // 8, w // 2 + 2)), y0 + int(rng.integers(h // 8, h // 2 + 2))
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        kind = int(rng.integers(0, 4))
        if kind == 0:
            d.ellipse([x0, y0, x1, y1], fill=colour)
        elif kind == 1:
            d.rectangle([x0, y0, x1, y1], fill=colour)
        elif kind == 2:
            d.polygon([(int(rng.integers(0, w)), int(rng.integers(0, h))) for _ in range(3)], fill=colour)
        else:
            d.line([x0, y0, x1, y1], fill=colour, width=int(rng.integers(2, max(3, w // 16))))
    # a band of stripes or checks: texture at a random place, period and colour
    bx, by = int(rng.integers(0, w * 3 // 4)), int(rng.integers(0, h * 3 // 4))
    bw, bh = int(rng.integers(w // 6, w // 2)), int(rng.integers(h // 6, h // 2))
    period = int(rng.integers(3, 12))
    colour = tuple(int(v) for v in rng.integers(0, 256, 3))
    checks = rng.random() < 0.5
    for x in range(bx, bx + bw, period * 2):
        if checks:
            for y in range(by + (x // period) % 2 * period, by + bh, period * 2):
                d.rectangle([x, y, x + period - 1, y + period - 1], fill=colour)
        else:
            d.rectangle([x, by, x + period - 1, by + bh], fill=colour)
    for _ in range(int(rng.integers(0, 3))):
        word = str(rng.choice(_WORDS))
        font = _font(int(rng.integers(max(10, h // 10), max(12, h // 4))))
        xy = (int(rng.integers(0, w * 2 // 3)), int(rng.integers(0, h * 3 // 4)))
        d.text(xy, word, fill=tuple(int(v) for v in rng.integers(0, 256, 3)), font=font)
    grain = float(rng.uniform(0, 6))
    if grain > 0.5:
        a = np.asarray(im, dtype=np.int16) + rng.normal(0, grain, (h, w, 3)).astype(np.int16)
        im = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
    return im


def _write_block(args: tuple[str, int, int, int]) -> int:
    root, start, stop, seed = args
    for idx in range(start, stop):
        rng = np.random.default_rng([seed, idx])
        side = int(rng.integers(96, 257))
        w, h = side, int(side * float(rng.choice([1.0, 0.75, 1.25])))
        im = picture(rng, w, h)
        folder = os.path.join(root, f"c{idx // PER_CLASS:04d}")
        os.makedirs(folder, exist_ok=True)
        if rng.random() < 0.7:
            im.save(os.path.join(folder, f"i{idx:07d}.jpg"), "JPEG", quality=int(rng.integers(60, 96)))
        else:
            im.quantize(int(rng.choice([32, 64, 128]))).save(os.path.join(folder, f"i{idx:07d}.png"), "PNG")
    return stop - start


def ensure_distinct(base: Path, n: int, seed: int = 20261204) -> Path:
    tree = base / f"distinct-{n}"
    marker = tree.with_name(tree.name + ".complete")
    meta = json.dumps({"v": VERSION, "n": n, "seed": seed})
    if marker.exists() and marker.read_text() == meta:
        return tree
    subprocess.run(["rm", "-rf", str(tree)], check=True)
    marker.unlink(missing_ok=True)
    t0 = time.perf_counter()
    blocks = [(str(tree), s, min(n, s + 500), seed) for s in range(0, n, 500)]
    with ProcessPoolExecutor(2) as ex:
        assert sum(ex.map(_write_block, blocks)) == n
    marker.write_text(meta)
    print(f"  {tree.name}: {n} images in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return tree


def near_copy(data: bytes, rng: np.random.Generator) -> bytes:
    """Cropped <= 5% per dimension, resized 0.5-2x, JPEG quality 50-90."""
    with Image.open(io.BytesIO(data)) as im:
        im = im.convert("RGB")
        w, h = im.size
        cw, ch = int(w * rng.uniform(0, 0.05)), int(h * rng.uniform(0, 0.05))
        left, top = int(rng.integers(0, cw + 1)), int(rng.integers(0, ch + 1))
        im = im.crop((left, top, w - (cw - left), h - (ch - top)))
        scale = float(np.exp(rng.uniform(np.log(0.5), np.log(2.0))))
        im = im.resize((max(8, round(im.width * scale)), max(8, round(im.height * scale))), Image.Resampling.BICUBIC)
        out = io.BytesIO()
        im.save(out, "JPEG", quality=int(rng.integers(50, 91)))
    return out.getvalue()


def split_by_hash(digest: str) -> str:
    from dlindex.export.plan import HASH, ID, ROW, split_of

    row: list[Any] = [None] * len(ROW)
    row[ID], row[HASH] = 0, digest
    return str(split_of(SPLITS)(tuple(row)))


def plant(tree: Path, planted: int, seed: int = 7) -> list[tuple[str, str]]:
    """(original, copy) paths relative to the tree; copies under planted/; reused while complete."""
    record = tree / "planted.json"
    if record.exists():
        pairs = [tuple(p) for p in json.loads(record.read_text())]
        if len(pairs) == planted:
            return pairs  # type: ignore[return-value]
    subprocess.run(["rm", "-rf", str(tree / "planted")], check=True)
    (tree / "planted").mkdir()
    rng = np.random.default_rng(seed)
    originals = sorted(str(p.relative_to(tree)) for p in tree.glob("c*/*"))
    order = rng.permutation(len(originals))
    pairs, tried = [], 0
    for at in order:
        if len(pairs) == planted:
            break
        original = originals[at]
        data = (tree / original).read_bytes()
        for _attempt in range(3):  # new crop/scale/quality until the copy lands in the other split
            tried += 1
            copy = near_copy(data, rng)
            if split_by_hash(xxhash.xxh3_128_hexdigest(copy)) != split_by_hash(xxhash.xxh3_128_hexdigest(data)):
                name = f"planted/p{len(pairs):05d}.jpg"
                (tree / name).write_bytes(copy)
                pairs.append((original, name))
                break
    assert len(pairs) == planted, "not enough originals to plant from"
    record.write_text(json.dumps(pairs))
    print(f"  planted {planted} cross-split copies from {tried} tries", file=sys.stderr)
    return pairs


def definition_set(folder: Path, n: int) -> list[str]:
    """n generated images for the hash-definition comparison: n/3 originals with a near copy each, the rest alone."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    files = []
    for k in range(n):
        path = folder / f"d{k:04d}.jpg"
        if not path.exists():
            side = int(rng.integers(96, 257))
            im = mt._render(
                int(rng.integers(0, 2**63)), side, int(side * 0.75), float(rng.uniform(0, 6)), int(rng.integers(0, 6))
            )
            buf = io.BytesIO()
            im.save(buf, "JPEG", quality=90)
            data = near_copy(files_bytes(folder, k - 1), rng) if k % 3 == 1 else buf.getvalue()
            path.write_bytes(data)
        files.append(str(path))
    return files


def files_bytes(folder: Path, k: int) -> bytes:
    return (folder / f"d{k:04d}.jpg").read_bytes()


def dlindex(*args: str) -> float:
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "dlindex", *args, "--quiet"], check=True, env=env)
    return time.perf_counter() - t0


def catalog(tree: Path, work: Path) -> tuple[Path, dict[str, float]]:
    db = work / f"{tree.name}.db"
    stamp = work / f"{tree.name}.db.complete"
    if stamp.exists() and stamp.read_text() == (tree / "planted.json").read_text():
        return db, json.loads((work / f"{tree.name}.db.times").read_text())
    db.unlink(missing_ok=True)
    times = {"scan": dlindex("scan", str(tree), "--db", str(db))}
    for ftype in ("dhash", "colorthumb"):
        times[f"features {ftype}"] = dlindex(
            "features", "compute", "--db", str(db), "--type", ftype, "--extractor", ftype
        )
    (work / f"{tree.name}.db.times").write_text(json.dumps(times))
    stamp.write_text((tree / "planted.json").read_text())
    return db, times


def measure(db: Path, tree: Path, pairs: list[tuple[str, str]], reps: int, thumb_limit: float | None) -> dict[str, Any]:
    """Per type: cross-split pairs at each limit of a sweep; the largest limit is the one run (for
    thumb ``thumb_limit`` where given: at 100k the default gives ~10^8 pairs, too many to list)."""
    from dlindex import Catalog
    from dlindex.quality.duplicate_groups import (
        DEFAULT_MAX_DISTANCE,
        DEFAULT_THRESHOLD,
        duplicate_groups,
        duplicate_pairs,
    )

    cat = Catalog(db)
    rows = list(cat.read("SELECT id, file_path, xxh3_128 FROM image_metadata"))
    id_of = {path: int(i) for i, path, _ in rows}
    path_of = {int(i): path for i, path, _ in rows}
    split = {int(i): split_by_hash(h) for i, _, h in rows}
    planted = {tuple(sorted((id_of[o], id_of[c]))) for o, c in pairs}
    out: dict[str, Any] = {"images": len(rows), "planted": len(planted),
                           "split_sizes": {s: sum(v == s for v in split.values()) for s in SPLITS}}  # fmt: skip
    for ftype, limits, key, default in (("dhash", (4, 6, 8, 10, DEFAULT_MAX_DISTANCE), "max_distance", DEFAULT_MAX_DISTANCE),
                                        ("colorthumb", (0.01, 0.02, 0.03, 0.05, 0.08, 0.1, DEFAULT_THRESHOLD), "threshold", DEFAULT_THRESHOLD)):  # fmt: skip
        limits = tuple(x for x in limits if thumb_limit is None or ftype != "colorthumb" or x <= thumb_limit)
        run_at = max(limits)
        leak_times, dup_times = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            found = [(p.a, p.b, p.distance) for p in duplicate_pairs(cat, feature_type=ftype, **{key: run_at})
                     if split[p.a] != split[p.b]]  # fmt: skip
            leak_times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            groups = duplicate_groups(cat, feature_type=ftype, **{key: run_at})
            dup_times.append(time.perf_counter() - t0)
        sweep = []
        for limit in sorted(set(limits)):
            at = [(a, b) for a, b, d in found if d <= limit]
            hit = sum((a, b) in planted for a, b in at)
            sweep.append({"limit": limit, "cross_pairs": len(at), "recall": hit / len(planted),
                          "false": (len(at) - hit) / max(1, len(at)), "false_n": len(at) - hit})  # fmt: skip
        false = sorted([(d, a, b) for a, b, d in found if (a, b) not in planted])[:200]
        examples = [
            {"a": path_of[a], "b": path_of[b], "distance": d} for d, a, b in false[:: max(1, len(false) // 4)][:4]
        ]
        missed = [path_of[a] + " ~ " + path_of[b] for a, b in sorted(planted - {(a, b) for a, b, _ in found})][:4]
        out[ftype] = {"default": default, "run_at": run_at, "sweep": sweep, "leaks_s": float(np.median(leak_times)),
                      "dups_s": float(np.median(dup_times)), "groups": len(groups),
                      "false_examples": examples, "missed_examples": missed}  # fmt: skip
        print(f"leaks {ftype}: {json.dumps(out[ftype])[:800]}", file=sys.stderr)
    return out


def part_leaks(a: argparse.Namespace, base: Path) -> dict[str, Any]:
    n = a.images or (3_000 if a.quick else 100_000)
    planted = a.planted or (100 if a.quick else 1_000)
    tree = ensure_distinct(base, n)
    pairs = plant(tree, planted)
    work = base / "dups"
    db, times = catalog(tree, work)
    res = measure(db, tree, pairs, 1 if a.quick else max(1, a.reps // 3), None if a.quick else a.thumb_limit)
    res["build_s"] = times
    return res


def render(r: dict[str, Any]) -> list[str]:
    lines = [f"### Leaks: {r['images']:,} images, {r['planted']:,} planted cross-split near copies", "",
             f"Splits by content hash (train=0.8,val=0.2): {r['split_sizes']}. Catalog built in "
             + ", ".join(f"{k} {v:.0f} s" for k, v in r["build_s"].items()) + ".", "",
             "| type | limit | cross-split pairs found | recall (planted found) | false pairs (not planted) |",
             "|---|---|---|---|---|"]  # fmt: skip
    for ftype in ("colorthumb", "dhash"):
        for s in r[ftype]["sweep"]:
            mark = " (default)" if s["limit"] == r[ftype]["default"] else ""
            lines.append(f"| {ftype} | {s['limit']}{mark} | {s['cross_pairs']:,} | {s['recall']:.3f} "
                         f"| {s['false']:.2%} ({s['false_n']:,}) |")  # fmt: skip
    lines.append("")
    for ftype in ("colorthumb", "dhash"):
        x = r[ftype]
        lines.append(f"Runtime at {x['run_at']}, {ftype}: cross-split pairs (duplicate_pairs + split_of) {x['leaks_s']:.1f} s "
                     f"vs duplicate_groups (dups) {x['dups_s']:.1f} s: {x['leaks_s'] / x['dups_s']:.2f}x.")  # fmt: skip
    return lines
