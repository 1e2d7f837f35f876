"""Deterministic image trees for the dlindex benchmarks (class-per-folder, ImageFolder layout).

Trees live OUTSIDE the repository, in ``$DLINDEX_BENCH_DIR`` (default ``/tmp/dlindex-bench``):

* ``img-<N>``         -- N "ImageNet-like" images in 100 class folders: 85 % JPEG (median ~30 KB,
                         ~5 KB .. a few hundred KB), 10 % PNG, 5 % WebP, various sizes/qualities.
* ``small-<N>``       -- N tiny images (~1-3 KB PNG/JPEG) in many class folders.
* ``img-<N>-copy<M>`` -- a real copy of M files of ``img-<N>`` (cold-scan subset).
* ``small-<N>-links<M>`` -- the first M files of ``small-<N>`` as hard links (RSS growth).
* ``tiny-<N>``        -- N tiny images (~150-700 B PNG/JPEG) nested ``c<class>/<part>/``, 1,000 files
                         a folder: the scan's curve up to millions of files (``--only tiny --tiny N``;
                         2M files in a few minutes, about 8 GiB of 4 KiB blocks).

How it stays fast (a few minutes on 2 cores): a pool of a few hundred distinct images is encoded
once with Pillow in a 2-process pool; every file is one pool entry made unique by a distinct tag
(a JPEG COM segment right after SOI, a PNG tEXt chunk right after IHDR, a same-length rewrite of
a placeholder in a WebP XMP chunk), so every file has a distinct content hash and stays a valid,
properly terminated image (JPEG ends with FFD9, PNG with IEND, WebP's RIFF size is unchanged).

Everything is a function of the seed, so a tree is byte-for-byte reproducible with the same
Pillow/libjpeg/zlib/libwebp versions.  A finished tree gets a marker ``<tree>.complete`` NEXT
to it (not inside, so the tree holds nothing but images); a tree with a matching marker is
reused, anything else at that path is removed and rebuilt.

Usage:  python bench/make_trees.py [--quick] [--work DIR] [--only big,small,subset,links] [--force]
        python bench/make_trees.py --only tiny --tiny 2000000 --work /tmp/dlindex-bench-2m
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import struct
import sys
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

GENERATOR_VERSION = 2
WEBP_PLACEHOLDER = b"<dlindex-bench-uid>" + b"0" * 48 + b"</dlindex-bench-uid>"


# --------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class Spec:
    big: int = 50_000  # ImageNet-like tree
    big_classes: int = 100
    small: int = 200_000  # tiny-image tree
    small_classes: int = 1_000
    subset: int = 5_000  # cold-scan copy of the big tree
    links: tuple[int, ...] = (50_000, 100_000)  # hard-linked prefixes of the small tree
    seed: int = 20240601


FULL = Spec()
QUICK = Spec(big=2_000, big_classes=20, small=6_000, small_classes=30, subset=500, links=(1_500, 3_000))


def work_dir(work: str | os.PathLike[str] | None = None) -> Path:
    p = Path(work or os.environ.get("DLINDEX_BENCH_DIR") or "/tmp/dlindex-bench")
    p.mkdir(parents=True, exist_ok=True)
    return p


# --------------------------------------------------------------------------- rendering
def _render(seed: int, w: int, h: int, detail: float, nshapes: int) -> Image.Image:
    """Smooth colour field (upsampled noise) + a few flat shapes + Gaussian grain."""
    rng = np.random.default_rng(seed)
    g = int(rng.integers(2, 24))
    base = rng.integers(0, 256, (g, max(2, g * w // max(h, 1)), 3), dtype=np.uint8)
    im = Image.fromarray(base).resize((w, h), Image.BICUBIC)
    d = ImageDraw.Draw(im)
    for _ in range(nshapes):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(3, w // 2 + 4)), y0 + int(rng.integers(3, h // 2 + 4))
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        (d.ellipse if rng.random() < 0.5 else d.rectangle)([x0, y0, x1, y1], fill=colour)
    if detail > 0:
        a = np.asarray(im, dtype=np.int16) + rng.normal(0, detail, (h, w, 3)).astype(np.int16)
        im = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
    return im


def _pool_params(kind: str, n: int, seed: int) -> list[tuple]:
    """Deterministic (entry_seed, fmt, w, h, detail, nshapes, quality) for each pool entry."""
    rng = np.random.default_rng([seed, {"big": 1, "small": 2}[kind]])
    out = []
    for _ in range(n):
        u = rng.random()
        if kind == "big":
            fmt = "JPEG" if u < 0.85 else ("PNG" if u < 0.95 else "WEBP")
            long = int(np.exp(rng.uniform(np.log(200), np.log(1000))))
            ar = float(rng.choice([1.0, 4 / 3, 3 / 2, 16 / 9, 3 / 4, 2 / 3]))
            w, h = (long, int(long / ar)) if ar >= 1 else (int(long * ar), long)
            if fmt == "PNG":  # lossless: keep PNGs smooth and smaller, or they get huge
                w, h = max(64, w // 2), max(64, h // 2)
                detail = float(rng.uniform(0, 3))
            else:
                detail = float(np.exp(rng.uniform(np.log(1.5), np.log(35))))
            quality = int(rng.integers(70, 96))
            nshapes = int(rng.integers(0, 12))
        else:
            fmt = "JPEG" if u < 0.7 else "PNG"
            side = int(rng.integers(24, 65))
            w, h = side, int(side * float(rng.choice([1.0, 0.75, 1.25])))
            detail = float(rng.uniform(0, 6)) if fmt == "JPEG" else 0.0
            # for PNG a negative "quality" means: quantize to that many colours (keeps them ~1-3 KB)
            quality = int(rng.integers(60, 96)) if fmt == "JPEG" else -int(rng.choice([16, 32, 64]))
            nshapes = int(rng.integers(0, 4))
        out.append((int(rng.integers(0, 2**63)), fmt, w, h, detail, nshapes, quality))
    return out


def _encode(params: tuple) -> tuple[str, bytes]:
    entry_seed, fmt, w, h, detail, nshapes, quality = params
    im = _render(entry_seed, w, h, detail, nshapes)
    buf = io.BytesIO()
    if fmt == "JPEG":
        im.save(buf, "JPEG", quality=quality, optimize=False)
    elif fmt == "PNG":
        (im.quantize(-quality) if quality < 0 else im).save(buf, "PNG", compress_level=6)
    else:
        im.save(buf, "WEBP", quality=quality, method=2, xmp=WEBP_PLACEHOLDER)
    data = buf.getvalue()
    _check(fmt, data)
    return fmt, data


def _check(fmt: str, data: bytes) -> None:
    if fmt == "JPEG":
        assert data[:2] == b"\xff\xd8" and data[-2:] == b"\xff\xd9", "bad JPEG framing"
    elif fmt == "PNG":
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[-12:-4] == b"\x00\x00\x00\x00IEND", "bad PNG"
    else:
        assert data[:4] == b"RIFF" and data[8:12] == b"WEBP", "bad WebP"
        assert struct.unpack("<I", data[4:8])[0] + 8 == len(data), "bad RIFF size"
        assert data.count(WEBP_PLACEHOLDER) == 1, "WebP XMP placeholder missing"


def make_unique(fmt: str, data: bytes, tag: bytes) -> bytes:
    """Return a still-valid image whose bytes differ from every other tag's."""
    if fmt == "JPEG":  # COM segment right after SOI
        seg = b"\xff\xfe" + struct.pack(">H", len(tag) + 2) + tag
        return data[:2] + seg + data[2:]
    if fmt == "PNG":  # tEXt chunk right after IHDR (8-byte signature + 25-byte IHDR chunk)
        body = b"Comment\x00" + tag
        chunk = struct.pack(">I", len(body)) + b"tEXt" + body + struct.pack(">I", zlib.crc32(b"tEXt" + body))
        return data[:33] + chunk + data[33:]
    # WEBP: same-length rewrite inside the XMP chunk; no checksum, sizes unchanged
    n = len(WEBP_PLACEHOLDER) - len(b"<dlindex-bench-uid></dlindex-bench-uid>")
    uid = tag[:n].ljust(n, b".")
    return data.replace(WEBP_PLACEHOLDER, b"<dlindex-bench-uid>" + uid + b"</dlindex-bench-uid>", 1)


EXT = {"JPEG": ".jpg", "PNG": ".png", "WEBP": ".webp"}

# --------------------------------------------------------------------------- writing
_POOL: list[tuple[str, bytes]] = []


def _init_writer(pool: list[tuple[str, bytes]]) -> None:
    global _POOL
    _POOL = pool


def _write_classes(args: tuple) -> tuple[int, int]:
    """Write the files of some class folders; return (files, bytes)."""
    root, name, jobs = args
    nfiles = nbytes = 0
    for cls_name, entries in jobs:
        d = os.path.join(root, cls_name)
        os.makedirs(d, exist_ok=True)
        for idx, pool_i in entries:
            fmt, data = _POOL[pool_i]
            blob = make_unique(fmt, data, f"dlindex-bench {name} {cls_name} {idx}".encode())
            with open(os.path.join(d, f"{cls_name}_{idx:07d}{EXT[fmt]}"), "wb") as f:
                f.write(blob)
            nfiles += 1
            nbytes += len(blob)
    return nfiles, nbytes


def _marker(tree: Path) -> Path:
    return tree.with_name(tree.name + ".complete")


def _is_complete(tree: Path, meta: dict) -> bool:
    m = _marker(tree)
    if not (m.exists() and tree.is_dir()):
        return False
    try:
        old = json.loads(m.read_text())
    except ValueError:
        return False
    return all(old.get(k) == v for k, v in meta.items())


def _finish(tree: Path, meta: dict, **extra) -> None:
    _marker(tree).write_text(json.dumps({**meta, **extra}, indent=1))


def _reset(tree: Path) -> None:
    _marker(tree).unlink(missing_ok=True)
    if tree.exists():
        shutil.rmtree(tree)


def _generate(tree: Path, kind: str, n: int, n_classes: int, seed: int, pool_size: int, procs: int) -> None:
    t0 = time.perf_counter()
    params = _pool_params(kind, pool_size, seed)
    with ProcessPoolExecutor(procs) as ex:
        pool = list(ex.map(_encode, params, chunksize=8))
    t1 = time.perf_counter()
    rng = np.random.default_rng([seed, {"big": 11, "small": 12}[kind]])
    # class sizes: as even as possible; pool entry per file drawn uniformly
    per = [n // n_classes + (1 if c < n % n_classes else 0) for c in range(n_classes)]
    prefix = "n" if kind == "big" else "c"
    jobs = []
    for c, k in enumerate(per):
        picks = rng.integers(0, len(pool), k)
        jobs.append((f"{prefix}{c:05d}", [(i, int(p)) for i, p in enumerate(picks)]))
    tree.mkdir(parents=True)
    chunks = [jobs[i :: procs * 4] for i in range(procs * 4)]
    with ProcessPoolExecutor(procs, initializer=_init_writer, initargs=(pool,)) as ex:
        res = list(ex.map(_write_classes, [(str(tree), tree.name, ch) for ch in chunks]))
    files, nbytes = sum(r[0] for r in res), sum(r[1] for r in res)
    assert files == n, (files, n)
    sizes = np.array([len(d) for _, d in pool]) / 1024
    print(
        f"  {tree.name}: {files} files, {nbytes / 2**20:.0f} MiB; pool {len(pool)} entries "
        f"(KiB p5/p50/p95 {np.percentile(sizes, 5):.1f}/{np.percentile(sizes, 50):.1f}/"
        f"{np.percentile(sizes, 95):.1f}); encode {t1 - t0:.1f}s, write {time.perf_counter() - t1:.1f}s",
        file=sys.stderr,
    )
    return files, nbytes


def ensure_big(spec: Spec = FULL, work: Path | None = None, force: bool = False, procs: int = 2) -> Path:
    """The ImageNet-like tree (spec.big files in spec.big_classes folders)."""
    tree = work_dir(work) / f"img-{spec.big}"
    meta = {"v": GENERATOR_VERSION, "kind": "big", "n": spec.big, "classes": spec.big_classes, "seed": spec.seed}
    if force or not _is_complete(tree, meta):
        _reset(tree)
        print(f"generating {tree} ...", file=sys.stderr)
        files, nbytes = _generate(tree, "big", spec.big, spec.big_classes, spec.seed, 480, procs)
        _finish(tree, meta, files=files, bytes=nbytes)
    return tree


def ensure_small(spec: Spec = FULL, work: Path | None = None, force: bool = False, procs: int = 2) -> Path:
    """The tiny-image tree (spec.small files in spec.small_classes folders)."""
    tree = work_dir(work) / f"small-{spec.small}"
    meta = {"v": GENERATOR_VERSION, "kind": "small", "n": spec.small, "classes": spec.small_classes, "seed": spec.seed}
    if force or not _is_complete(tree, meta):
        _reset(tree)
        print(f"generating {tree} ...", file=sys.stderr)
        files, nbytes = _generate(tree, "small", spec.small, spec.small_classes, spec.seed, 300, procs)
        _finish(tree, meta, files=files, bytes=nbytes)
    return tree


def _take(src: Path, n: int) -> list[tuple[str, str]]:
    """n (class, file) pairs spread over all classes of src: round-robin in sorted order."""
    classes = sorted(e.name for e in os.scandir(src) if e.is_dir())
    lists = {c: sorted(os.listdir(src / c)) for c in classes}
    out: list[tuple[str, str]] = []
    i = 0
    while len(out) < n:
        added = False
        for c in classes:
            if i < len(lists[c]):
                out.append((c, lists[c][i]))
                added = True
                if len(out) == n:
                    break
        if not added:
            raise ValueError(f"{src} has fewer than {n} files")
        i += 1
    return out


def subset_paths(src: Path, n: int) -> list[Path]:
    """A deterministic n-file subset of a tree, as a list of paths (no copy)."""
    return [src / c / f for c, f in _take(src, n)]


def ensure_subset(src: Path, n: int, force: bool = False) -> Path:
    """A real copy of n files of src (spread over all its classes): the cold-scan tree."""
    tree = src.with_name(f"{src.name}-copy{n}")
    meta = {"v": GENERATOR_VERSION, "src": src.name, "n": n, "src_marker": _marker(src).read_text()}
    if force or not _is_complete(tree, meta):
        _reset(tree)
        t0 = time.perf_counter()
        for c, f in _take(src, n):
            (tree / c).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / c / f, tree / c / f)
        os.sync()
        _finish(tree, meta)
        print(f"  {tree.name}: copied {n} files in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return tree


def ensure_links(src: Path, n: int, force: bool = False) -> Path:
    """The first n files of src (whole class folders first, in sorted order) as hard links."""
    tree = src.with_name(f"{src.name}-links{n}")
    meta = {"v": GENERATOR_VERSION, "src": src.name, "n": n, "src_marker": _marker(src).read_text()}
    if force or not _is_complete(tree, meta):
        _reset(tree)
        t0 = time.perf_counter()
        left = n
        for c in sorted(e.name for e in os.scandir(src) if e.is_dir()):
            if left <= 0:
                break
            files = sorted(os.listdir(src / c))[:left]
            (tree / c).mkdir(parents=True)
            for f in files:
                os.link(src / c / f, tree / c / f)
            left -= len(files)
        if left:
            raise ValueError(f"{src} has fewer than {n} files")
        _finish(tree, meta)
        print(f"  {tree.name}: linked {n} files in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return tree


# --------------------------------------------------------------------------- tiny trees (millions)
def _tiny_pool(seed: int, size: int = 256) -> list[tuple[str, bytes]]:
    """``size`` distinct tiny images (8-24 px): a few hundred bytes each, so millions fit a disk."""
    rng = np.random.default_rng([seed, 3])
    pool = []
    for _ in range(size):
        fmt = "JPEG" if rng.random() < 0.7 else "PNG"
        w, h = int(rng.integers(8, 25)), int(rng.integers(8, 25))
        quality = int(rng.integers(60, 96)) if fmt == "JPEG" else -int(rng.choice([4, 8, 16]))
        pool.append(_encode((int(rng.integers(0, 2**63)), fmt, w, h, 2.0, 1, quality)))
    return pool


def _write_tiny(args: tuple) -> tuple[int, int]:
    """Write classes [first, last) of a tiny tree: files (class, i) for i below its count."""
    root, name, seed, classes, per_class, per_folder = args
    nfiles = nbytes = 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
    for c, count in zip(classes, per_class, strict=True):
        picks = np.random.default_rng([seed, 13, c]).integers(0, len(_POOL), count).tolist()
        for i, p in enumerate(picks):
            folder = os.path.join(root, f"c{c:05d}", f"{i // per_folder:04d}")
            if i % per_folder == 0:
                os.makedirs(folder, exist_ok=True)
            fmt, data = _POOL[p]
            blob = make_unique(fmt, data, f"{name} {c} {i}".encode())
            fd = os.open(os.path.join(folder, f"c{c:05d}_{i:08d}{EXT[fmt]}"), flags, 0o644)
            try:
                os.write(fd, blob)
            finally:
                os.close(fd)
            nfiles += 1
            nbytes += len(blob)
    return nfiles, nbytes


def ensure_tiny(
    n: int,
    work: Path | None = None,
    *,
    classes: int = 1_000,
    per_folder: int = 1_000,
    seed: int = 20240601,
    force: bool = False,
    procs: int = 2,
) -> Path:
    """``tiny-<n>``: n tiny valid images, distinct bytes each, in c<class>/<part>/ folders.

    Streams: no list of n entries; each class draws its pool entries from its own seeded stream.
    """
    tree = work_dir(work) / f"tiny-{n}"
    meta = {"v": GENERATOR_VERSION, "kind": "tiny", "n": n, "classes": classes, "per_folder": per_folder, "seed": seed}
    if not force and _is_complete(tree, meta):
        return tree
    _reset(tree)
    print(f"generating {tree} ...", file=sys.stderr)
    t0 = time.perf_counter()
    pool = _tiny_pool(seed)
    per = [n // classes + (1 if c < n % classes else 0) for c in range(classes)]
    tree.mkdir(parents=True)
    jobs = [
        (str(tree), tree.name, seed, list(range(c, min(c + 10, classes))), per[c : c + 10], per_folder)
        for c in range(0, classes, 10)
    ]
    with ProcessPoolExecutor(procs, initializer=_init_writer, initargs=(pool,)) as ex:
        res = list(ex.map(_write_tiny, jobs))
    files, nbytes = sum(r[0] for r in res), sum(r[1] for r in res)
    assert files == n, (files, n)
    seconds = time.perf_counter() - t0
    print(f"  {tree.name}: {files} files, {nbytes / 2**20:.0f} MiB of bytes in {seconds:.1f}s", file=sys.stderr)
    _finish(tree, meta, files=files, bytes=nbytes, seconds=round(seconds, 1))
    return tree


def ensure_all(
    spec: Spec, work: Path | None = None, only: set[str] | None = None, force: bool = False, tiny: int = 2_000_000
) -> dict:
    only = only or {"big", "small", "subset", "links"}
    out: dict[str, object] = {}
    if only & {"big", "subset"}:
        out["big"] = ensure_big(spec, work, force)
    if "subset" in only:
        out["subset"] = ensure_subset(out["big"], spec.subset, force)
    if only & {"small", "links"}:
        out["small"] = ensure_small(spec, work, force)
    if "links" in only:
        out["links"] = {n: ensure_links(out["small"], n, force) for n in spec.links if n < spec.small}
    if "tiny" in only:
        out["tiny"] = ensure_tiny(tiny, work, force=force)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small trees for smoke tests")
    ap.add_argument("--work", help="work dir (default $DLINDEX_BENCH_DIR or /tmp/dlindex-bench)")
    ap.add_argument("--only", default="big,small,subset,links")
    ap.add_argument("--force", action="store_true", help="regenerate even if complete")
    ap.add_argument("--tiny", type=float, default=2e6, help="files of the tiny tree (--only tiny), default 2e6")
    a = ap.parse_args(argv)
    spec = QUICK if a.quick else FULL
    t0 = time.perf_counter()
    out = ensure_all(spec, Path(a.work) if a.work else None, set(a.only.split(",")), a.force, int(a.tiny))
    print(
        json.dumps(
            {k: str(v) if not isinstance(v, dict) else {n: str(p) for n, p in v.items()} for k, v in out.items()},
            indent=1,
        )
    )
    print(f"done in {time.perf_counter() - t0:.1f}s; spec {asdict(spec)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
