"""The rows of make_catalog.py's catalogs: what a scan of an ImageNet-21k-like tree would have written.

``generate(spec)`` yields image_metadata, image_features and sample_attributes rows chunk by
chunk (numpy per column, one Python loop for the strings), ids from 1 in key order, each chunk
from its own seeded stream; ``scan_rows`` the scans table that goes with them. make_catalog.py
writes them into a catalog file, make_catalog_pg.py into a server catalog.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")
Row = tuple[Any, ...]
Array = np.ndarray[Any, Any]
SQLITE_INSERT_COLUMNS = (
    "id", "root_id", "file_path", "file_path_bytes", "label_id", "width", "height", "format", "mode", "bytes",
    "mtime_ns", "xxh3_128", "status", "error", "warning", "processed", "processing_status", "created_at",
    "updated_at", "split", "pixel_limit", "orientation", "excluded", "inode", "ctime_ns", "path_hash",
)  # fmt: skip
FEATURE_COLUMNS = ("image_id", "feature_type", "vector", "created_at", "updated_at")
DAY = 86_400
EPOCH = 1_767_571_200  # 2026-01-05 00:00:00 UTC: the first scan
SPLIT_FOLDERS = (("train", "train"), ("val", "validation"))  # folder, canonical split (dlindex.catalog.classes)
FORMATS = ("JPEG", "PNG", "WEBP")
EXTENSIONS = (".JPEG", ".png", ".webp")
MODES = (("RGB", "L", "CMYK"), ("RGB", "RGBA", "P", "L"), ("RGB", "RGBA"))
MODE_P = ((0.975, 0.02, 0.005), (0.5, 0.35, 0.1, 0.05), (0.8, 0.2))
CORRUPT_ERRORS = (
    "UnidentifiedImageError: cannot identify image file",
    "OSError: image file is truncated (23 bytes not processed)",
    "SyntaxError: broken PNG file",
)
WARNINGS = (
    "UserWarning: Possibly corrupt EXIF data.  Expecting to read 12 bytes but only got 0. Skipping tag 0",
    "UserWarning: Corrupt EXIF data.  Expecting to read 2 bytes but only got 0. ",
    "libpng warning: iCCP: known incorrect sRGB profile",
    "UserWarning: Palette images with Transparency expressed in bytes should be converted to RGBA images",
)
# File names a user's tree really has; {s} is the ordinary stem. Bytes: a name that is not UTF-8.
HOSTILE: tuple[str | bytes, ...] = (
    "{s} copy (2)", "{s}-caf\u00e9", "{s}-cafe\u0301", "{s}-\u65e5\u672c\u8a9e", "{s}-\U0001f600", "'{s}\"",
    "{s},a;b", "-{s}", "{s} #1 100%", "{s}$HOME", "{s}\tx", "{s}\\x", "{s}_" + "a" * 200,
    b"{s}-\xff\xfe", b"{s}-caf\xe9",
)  # fmt: skip


@dataclass(frozen=True)
class CatalogSpec:
    rows: int = 1_000_000
    labels: int = 1_000
    seed: int = 0
    zipf: float = 0.8  # class size ~ 1 / rank**zipf
    val: float = 0.04  # fraction of each class in val/
    corrupt: float = 0.002
    missing: float = 0.003
    processed: float = 0.3
    queued: float = 0.05  # of the unprocessed rows
    failed: float = 0.002
    excluded: float = 0.01
    features: float = 0.1  # of the ok rows: a dhash vector
    attributes: float = 0.0  # of the rows: a `source` attribute (a video of 20 frames), for export --group-by
    dups: float = 0.005  # rows whose content repeats an earlier row's
    hostile: float = 0.001
    warnings: float = 0.003
    scans: int = 6
    root: str = ""  # the tree's folder; "" = <catalog>-root beside a catalog file
    files_per_part: int = 1000  # files per innermost folder


@dataclass
class Counters:
    ok: int = 0
    corrupt: int = 0
    missing: int = 0
    features: int = 0
    attributes: int = 0
    chunks: int = 0
    per_scan: list[int] = field(default_factory=list)
    corrupt_per_scan: list[int] = field(default_factory=list)


def _path_hash() -> Callable[[str], int]:
    """dlindex's own ``path_hash`` wherever the layout puts it; else schema 15's formula, written out."""
    import importlib

    for module in ("dlindex.catalog.migrations", "dlindex.catalog.sqlite.migrations"):
        with contextlib.suppress(ImportError):
            found: Callable[[str], int] = importlib.import_module(module).path_hash
            return found
    return lambda key: int(hashlib.md5(key.encode(), usedforsecurity=False).hexdigest()[:15], 16)


def label_names(spec: CatalogSpec) -> list[str]:
    """Sorted, unique class folder names: wnid-like, about 1% human names with spaces or accents."""
    rng = np.random.default_rng([spec.seed, 1])
    ids = rng.choice(15_000_000, spec.labels, replace=False) + 1_000_000
    names = [f"n{int(i):08d}" for i in ids]
    human = ("golden retriever", "caf\u00e9 au lait", "\u732b", "jack-o'-lantern", "rock,paper", "na\u00efve art")
    for k in range(0, spec.labels, 97):
        names[k] = f"{human[(k // 97) % len(human)]} {k}"
    return sorted(names)


def class_counts(spec: CatalogSpec) -> Array:
    """Rows per (split, class): shape (2, labels), Zipf-like over a seeded rank order, sum = rows."""
    rng = np.random.default_rng([spec.seed, 2])
    rank = rng.permutation(spec.labels) + 1
    w = 1.0 / rank.astype(np.float64) ** spec.zipf
    exact = spec.rows * w / w.sum()
    counts = np.floor(exact).astype(np.int64)
    if spec.rows >= spec.labels:
        counts = np.maximum(counts, 1)
    short = spec.rows - int(counts.sum())
    order = np.argsort(-(exact - counts), kind="stable")  # largest remainders first (or largest taken back)
    if short >= 0:
        counts[order[:short]] += 1
    else:
        for k in np.argsort(-counts, kind="stable")[:-short]:
            counts[k] -= 1
    val = np.floor(counts * spec.val + 0.5).astype(np.int64)
    return np.stack([counts - val, val])


def times_text(secs: Array) -> list[str]:
    """Seconds since the epoch -> SQLite's CURRENT_TIMESTAMP text, 'YYYY-MM-DD HH:MM:SS'."""
    text = np.datetime_as_string(secs.astype("datetime64[s]"), unit="s")
    return [t.replace("T", " ") for t in text.tolist()]


def scan_starts(spec: CatalogSpec) -> Array:
    return EPOCH + np.arange(spec.scans, dtype=np.int64) * 30 * DAY + 3600 * 2


def generate(
    spec: CatalogSpec, chunk: int = 50_000, counters: Counters | None = None
) -> Iterator[tuple[list[Row], list[Row], list[Row]]]:
    """Yield (image_metadata, image_features, sample_attributes rows) in chunks, in key order, ids from 1.

    Each chunk is drawn from its own seeded stream (``chunk`` is part of the seed)."""
    c = counters or Counters()
    c.per_scan = [0] * spec.scans
    c.corrupt_per_scan = [0] * spec.scans
    names = label_names(spec)
    counts = class_counts(spec)
    seg_rows = counts.reshape(-1)  # segments: train/class0.., val/class0..
    seg_end = np.cumsum(seg_rows)
    seg_start = seg_end - seg_rows
    seg_label = np.tile(np.arange(spec.labels), 2)
    seg_split = np.repeat([0, 1], spec.labels)
    path_hash = _path_hash()
    starts = scan_starts(spec)
    end = int(starts[-1]) + DAY
    scan_p = np.full(spec.scans, 0.45 / max(spec.scans - 1, 1))
    scan_p[0] = 0.55 if spec.scans > 1 else 1.0
    fmt_p = np.array([0.9, 0.08, 0.02])
    for r0 in range(0, spec.rows, chunk):
        n = min(chunk, spec.rows - r0)
        rng = np.random.default_rng([spec.seed, 3, r0 // chunk, chunk])
        r = np.arange(r0, r0 + n, dtype=np.int64)
        seg = np.searchsorted(seg_end, r, side="right")
        idx = r - seg_start[seg]
        label = seg_label[seg]
        split = seg_split[seg]
        # content: format, mode, size, bytes, hash; dups copy an earlier row of the chunk
        fmt = rng.choice(3, n, p=fmt_p)
        u = rng.random(n)
        mode = np.zeros(n, np.int64)
        for f, p in enumerate(MODE_P):
            mode[fmt == f] = np.searchsorted(np.cumsum(p), u[fmt == f] * 0.999999)
        long = np.clip(np.exp(rng.normal(np.log(500), 0.35, n)), 32, 4000).astype(np.int64)
        aspect = rng.choice([1.0, 4 / 3, 3 / 2, 16 / 9, 3 / 4, 2 / 3], n, p=[0.1, 0.5, 0.15, 0.05, 0.15, 0.05])
        width = np.where(aspect >= 1, long, (long * aspect).astype(np.int64))
        height = np.where(aspect >= 1, (long / aspect).astype(np.int64), long)
        per_pixel = np.array([0.3, 1.6, 0.12])[fmt] * np.exp(rng.normal(0, 0.4, n))
        size = (width * height * per_pixel).astype(np.int64) + 200
        digest = rng.integers(0, 256, (n, 16), dtype=np.uint8)
        orient = np.where(fmt == 0, rng.choice([1, 6, 8, 3], n, p=[0.93, 0.04, 0.015, 0.015]), 1)
        dup = np.flatnonzero(rng.random(n) < spec.dups)
        dup = dup[dup > 0]
        src = (rng.random(dup.size) * dup).astype(np.int64)
        for a in (fmt, mode, width, height, size, digest, orient):
            a[dup] = a[src]
        # times: the scan that found the file, the file's own mtime before it
        scan = rng.choice(spec.scans, n, p=scan_p)
        created = starts[scan] + rng.integers(0, 3 * 3600, n)
        mtime_ns = (created - rng.integers(60, 60 * DAY, n)) * 1_000_000_000 + rng.integers(0, 10**9, n)
        ctime_ns = mtime_ns + rng.integers(0, 10**9, n)
        inode = 1_000_003 + r * 7 + rng.integers(0, 7, n)
        # status and flags
        v = rng.random(n)
        status = np.where(v < spec.corrupt, 1, np.where(v < spec.corrupt + spec.missing, 2, 0))
        w = rng.random(n)
        processed = (w < spec.processed) & (status != 1)
        pstat = np.where(
            processed, np.where(rng.random(n) < 0.8, 1, 0),
            np.where(w < spec.processed + spec.queued, 2, np.where(w > 1 - spec.failed, 3, 0)),
        )  # fmt: skip  # 0 none, 1 completed, 2 queued, 3 failed
        excluded = rng.random(n) < spec.excluded
        touched = processed | (pstat > 0) | excluded
        updated = np.where(touched, np.minimum(created + rng.integers(3600, 30 * DAY, n), end), created)
        updated = np.where(status == 2, starts[-1] + 600, updated)
        hostile = np.flatnonzero(rng.random(n) < spec.hostile)
        hostile_kind = rng.integers(0, len(HOSTILE), hostile.size)
        warn = np.flatnonzero((rng.random(n) < spec.warnings) & (status == 0))
        warn_kind = rng.integers(0, len(WARNINGS), warn.size)
        err_kind = rng.integers(0, len(CORRUPT_ERRORS), n)
        feat = (rng.random(n) < spec.features) & (status == 0)
        near = rng.random(n) < 0.05  # of the vectors: a near-duplicate (2 bits off its content's)
        flip = rng.integers(0, 64, (n, 2))

        # strings: paths, hashes, times
        hex_all = digest.tobytes().hex()
        hashes = [hex_all[i : i + 32] for i in range(0, 32 * n, 32)]
        created_s = times_text(created)
        updated_s = times_text(updated)
        labels_l = label.tolist()
        idx_l = idx.tolist()
        paths = [
            f"{SPLIT_FOLDERS[s][0]}/{names[lab]}/{i // spec.files_per_part:04d}/{names[lab]}_{i:08d}{EXTENSIONS[f]}"
            for s, lab, i, f in zip(split.tolist(), labels_l, idx_l, fmt.tolist(), strict=True)
        ]
        raw: list[bytes | None] = [None] * n
        for k, h in zip(hostile.tolist(), hostile_kind.tolist(), strict=True):
            folder, _, name = paths[k].rpartition("/")
            stem, dot, ext = name.rpartition(".")
            pattern = HOSTILE[h]
            if isinstance(pattern, bytes):
                raw_name = pattern.replace(b"{s}", stem.encode()) + b"." + ext.encode()
                raw[k] = folder.encode() + b"/" + raw_name
                paths[k] = folder + "/" + raw_name.replace(b"\\", b"\\x5c").decode("utf-8", "backslashreplace")
            else:
                paths[k] = f"{folder}/{pattern.replace('{s}', stem)}{dot}{ext}"
        fmt_l: list[str | None] = [FORMATS[f] for f in fmt.tolist()]
        mode_l: list[str | None] = [MODES[f][m] for f, m in zip(fmt.tolist(), mode.tolist(), strict=True)]
        width_l: list[int | None] = width.tolist()
        height_l: list[int | None] = height.tolist()
        orient_l: list[int | None] = orient.tolist()
        status_l = [("ok", "corrupt", "missing")[x] for x in status.tolist()]
        error_l: list[str | None] = [None] * n
        warning_l: list[str | None] = [None] * n
        for k, h in zip(warn.tolist(), warn_kind.tolist(), strict=True):
            warning_l[k] = WARNINGS[h]
        for k in np.flatnonzero(status == 1).tolist():
            e = int(err_kind[k])
            error_l[k] = CORRUPT_ERRORS[e]
            orient_l[k] = None
            if e == 0:  # no header could be read: no size, format or mode
                width_l[k] = height_l[k] = fmt_l[k] = mode_l[k] = None
        pstat_l = [(None, "completed", "queued", "failed")[x] for x in pstat.tolist()]
        for k in np.flatnonzero(pstat == 3).tolist():
            error_l[k] = "resize: cannot write output (No space left on device)"
        split_l = [SPLIT_FOLDERS[s][1] for s in split.tolist()]
        ids = (r + 1).tolist()
        rows = list(
            zip(
                ids, [1] * n, paths, raw, [int(x) + 1 for x in labels_l], width_l, height_l, fmt_l, mode_l,
                size.tolist(), mtime_ns.tolist(), hashes, status_l, error_l, warning_l,
                processed.astype(np.int64).tolist(), pstat_l, created_s, updated_s, split_l, [None] * n,
                orient_l, excluded.astype(np.int64).tolist(), inode.tolist(), ctime_ns.tolist(),
                [path_hash(p) for p in paths],
                strict=True,
            )
        )  # fmt: skip
        # dhash vectors: 64 bits of the content hash as float32 0/1 (equal content, equal vector)
        fk = np.flatnonzero(feat)
        bits = np.unpackbits(digest[fk, :8], axis=1)
        nk = np.flatnonzero(near[fk])
        bits[nk, flip[fk[nk], 0]] ^= 1
        bits[nk, flip[fk[nk], 1]] ^= 1
        blob = bits.astype("<f4").tobytes()
        feature_at = times_text(np.minimum(created[fk] + DAY, end))
        features = [("dhash", blob[j * 256 : (j + 1) * 256], t) for j, t in enumerate(feature_at)]
        feature_rows = [(ids[k], name, vec, t, t) for k, (name, vec, t) in zip(fk.tolist(), features, strict=True)]
        c.ok += int((status == 0).sum())
        c.corrupt += int((status == 1).sum())
        c.missing += int((status == 2).sum())
        c.features += len(feature_rows)
        c.chunks += 1
        for s, k in enumerate(np.bincount(scan, minlength=spec.scans).tolist()):
            c.per_scan[s] += k
        for s, k in enumerate(np.bincount(scan[status == 1], minlength=spec.scans).tolist()):
            c.corrupt_per_scan[s] += k
        # drawn last, so the rows above are the same with or without attributes
        attr = np.flatnonzero(rng.random(n) < spec.attributes).tolist()
        attribute_rows = [(ids[k], "source", f"{names[labels_l[k]]}/video{idx_l[k] // 20:07d}") for k in attr]
        c.attributes += len(attribute_rows)
        yield rows, feature_rows, attribute_rows


def scan_rows(spec: CatalogSpec, c: Counters) -> list[Row]:
    """The scans table: one completed scan a month, counters as the rows say."""
    options = {
        "extensions": ["jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"], "hidden": False, "exclude": [],
        "follow_symlinks": True, "split_folders": True, "labels_file": None, "verify": False,
        "max_pixels": 89478485, "workers": 0, "io_threads": 16, "prune": False, "force": False, "shard": None,
    }  # fmt: skip
    out = []
    starts = scan_starts(spec)
    seen = corrupt = 0
    for s in range(spec.scans):
        new = c.per_scan[s]
        last = s == spec.scans - 1
        missing = c.missing if last else 0
        seen_now = seen + new - missing
        corrupt += c.corrupt_per_scan[s]
        seconds = round(seen / 20_000 + new / 2_500 + 1.0, 3)
        t0 = int(starts[s])
        times = times_text(np.array([t0, t0 + int(seconds) + 1]))
        out.append(
            (s + 1, 1, json.dumps(options), 40_000 + s, "completed", times[0], times[1], seen_now, new, 0,
             seen - missing, missing, corrupt, 0, 0, seconds)
        )  # fmt: skip
        seen += new
    return out


def transactions(spec: CatalogSpec, c: Counters) -> int:
    """Write transactions dlindex would have made for this content: scan's 2,000-row batches and
    its bookkeeping (root, start, presplit, labels, finish), marks, features batches."""
    scan_tx = sum(-(-k // 2000) + 5 for k in c.per_scan)
    marks = -(-int(spec.rows * (spec.processed + spec.excluded)) // 10_000)
    return scan_tx + marks + -(-c.features // 1000)


def state_token(spec: CatalogSpec) -> str:
    """The change token: a function of the content (equal content, equal state), not random."""
    return hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:32]


def ahead(items: Iterator[T], depth: int = 2) -> Iterator[T]:
    """``items`` made by a thread, ``depth`` ahead: generation overlaps SQLite's own work,
    which runs without the GIL (memory: ``depth`` + 2 chunks)."""
    q: queue.Queue[tuple[bool, object]] = queue.Queue(depth)
    stop = threading.Event()

    def run() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                q.put((True, item))
            q.put((False, None))
        except BaseException as e:  # handed to the consumer
            q.put((False, e))

    worker = threading.Thread(target=run, name="make-catalog-rows", daemon=True)
    worker.start()
    try:
        while True:
            more, item = q.get()
            if not more:
                if isinstance(item, BaseException):
                    raise item
                return
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        while worker.is_alive():  # unblock a put() so the thread ends
            with contextlib.suppress(queue.Empty):
                q.get_nowait()
            worker.join(0.05)
