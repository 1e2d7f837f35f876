"""A benchmark catalog of any size, without files: N rows as if ``dlindex scan`` had catalogued them.

Catalogs live where you say (``--db``); nothing is read from disk but the catalog itself.
dlindex makes the schema (``Catalog(path, create=True)`` runs every migration, so the tables,
triggers, page size and version are exactly a scanned catalog's); this script only fills it:

* one root, a pre-split ImageNet-21k-like tree: ``train/<label>/<part>/<label>_<n>.JPEG`` and
  ``val/...`` (``--val`` of each class), ``roots.presplit = 1``, ``split`` train/validation;
* ``--labels`` 1,000 or 21,000 classes (wnid-like names, ~1% with spaces or non-ASCII) with
  Zipf-like sizes (``--zipf`` exponent over a seeded rank order);
* hostile-ish file names (``--hostile`` of the rows): spaces, quotes, commas, ``#``/``%``/``$``,
  a tab, a leading ``-``, NFC and NFD accents, CJK, an emoji, a 200-character name, a literal
  backslash, and names that are not UTF-8 (their ``\\xNN`` stand-in key plus ``file_path_bytes``);
* scan's columns: width, height, format, mode, bytes, mtime_ns, ctime_ns, inode, a 128-bit
  ``xxh3_128`` (``--dups`` of the rows repeat an earlier row's content), EXIF orientation,
  ``path_hash`` exactly as schema 15 computes it, warnings on a few files;
* status ok / corrupt (``--corrupt``; header-less or truncated, with scan's error texts) /
  missing (``--missing``, marked by the last scan); ``mark``'s flags: processed,
  processing_status (queued/completed/failed), excluded;
* ``--scans`` scans a month apart (scans rows with their counters); rows' created_at,
  updated_at, mtime_ns follow them, so times spread over months;
* a ``dhash`` feature type (64 float32 0/1 values, as ``features compute -e dhash`` stores
  them) for ``--features`` of the ok rows: equal content, equal vector; some near-duplicates;
* with ``--attributes F``, a ``source`` attribute (a "video" of 20 consecutive files) on F of the
  rows, as ``scan --labels`` stores extra CSV columns, for ``export --group-by source``;
* the change counter moved once per write transaction a scan would have made, and a token.

Fast and flat: rows are made chunk by chunk (numpy for the columns, one Python loop for the
strings), inserted with executemany in large transactions, journal off and synchronous off
while loading (WAL and the usual settings come back at the end); memory does not grow with N.
The schema has no secondary index to build after the load (migrations create none; ``dlindex
index --apply`` adds them), and the UNIQUE (root_id, file_path) index is fed in key order.

Deterministic: the same arguments, --seed and --chunk give the same rows (each chunk of rows is
drawn from its own seeded stream, so rows do not depend on the machine or on how fast it runs).
The rows come from catalog_rows.py; a PostgreSQL catalog: ``--db postgresql://...`` (COPY, in
make_catalog_pg.py).

Usage:  python bench/make_catalog.py --db /tmp/c1m.db --rows 1000000 [--labels 21000] [--seed 0]
        python bench/make_catalog.py --rows 1e7    # made once: $DLINDEX_BENCH_DIR/catalog-10000000-1000l-s0.db
        (from a benchmark: ``from make_catalog import ensure_catalog; db = ensure_catalog(10**7)``)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sqlite3
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from catalog_rows import (
    FEATURE_COLUMNS,
    SQLITE_INSERT_COLUMNS,
    CatalogSpec,
    Counters,
    ahead,
    generate,
    label_names,
    scan_rows,
    scan_starts,
    state_token,
    times_text,
    transactions,
)

__all__ = ["CatalogSpec", "ensure_catalog", "make_sentinels", "make_sqlite"]

# What dlindex looks at to tell a moved or unmounted tree (dlindex/catalog/reachable.py): a few
# present files from each end of the key range. These few exist; the other rows have no file.
# root_id in the WHERE lets the (root_id, file_path) unique index serve the ORDER BY (without
# it SQLite sorts the whole table: ~10 minutes at 10^8 rows).
FIRST_FILES = (
    "SELECT file_path, file_path_bytes FROM image_metadata WHERE root_id = 1 AND status != 'missing' "
    "ORDER BY file_path LIMIT 3"
)
LAST_FILES = (
    "SELECT file_path, file_path_bytes FROM image_metadata WHERE root_id = 1 AND status != 'missing' "
    "ORDER BY file_path DESC LIMIT 3"
)
# The smallest valid PNG (1x1, grey): what the few real files hold.
TINY_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108000000003a7e9b550000000a49444154789c6368"
    "00000082008177cd72b60000000049454e44ae426082"
)


def make_sentinels(root: str, *ends: Iterable[tuple[str, bytes | None]]) -> list[bytes]:
    """Create the root folder and the files at both ends of its key range (see FIRST_FILES)."""
    made = []
    top = os.fsencode(root)
    os.makedirs(top, exist_ok=True)
    for rows in ends:
        for text, raw in rows:
            path = os.path.join(top, bytes(raw) if raw is not None else os.fsencode(text))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(TINY_PNG)
            made.append(path)
    return made


def create_schema(location: str) -> None:
    """Let dlindex make the catalog: every migration, exactly what a first scan gets."""
    from dlindex.catalog.connection import Catalog

    Catalog(location, create=True, log=False).close()


_INSERT_ROOT = "INSERT INTO roots (id, path, path_bytes, added_at, presplit) VALUES (1, ?, NULL, ?, 1)"
_INSERT_LABEL = "INSERT INTO labels (id, name) VALUES (?, ?)"
_INSERT_SCAN = f"INSERT INTO scans VALUES ({', '.join('?' * 16)})"
_INSERT_IMAGE = f"INSERT INTO image_metadata ({', '.join(SQLITE_INSERT_COLUMNS)}) VALUES ({', '.join('?' * len(SQLITE_INSERT_COLUMNS))})"
_INSERT_ATTRIBUTE = "INSERT INTO sample_attributes (image_id, name, value) VALUES (?, ?, ?)"
_INSERT_FEATURE = f"INSERT INTO image_features ({', '.join(FEATURE_COLUMNS)}) VALUES (?, ?, ?, ?, ?)"
_INSERT_TYPE = "INSERT INTO feature_types (name, dim, dtype, extractor, version, created_at) VALUES (?, 64, 'float32', 'dhash', ?, ?)"
_SET_STATE = "UPDATE catalog_changes SET counter = ?, token = ? WHERE id = 1"


def make_sqlite(path: Path, spec: CatalogSpec, *, chunk: int = 50_000, commit_rows: int = 2_000_000,
                progress: bool = False) -> dict[str, object]:  # fmt: skip
    """Make the catalog file ``path`` (must not exist); return figures (rows/s, bytes)."""
    if path.exists():
        raise FileExistsError(f"{path} exists; remove it first")
    if not spec.root:
        spec = replace(spec, root=os.path.abspath(path) + "-root")
    t0 = time.perf_counter()
    create_schema(os.fspath(path))
    conn = sqlite3.connect(os.fspath(path), isolation_level=None)
    c = Counters()
    try:
        conn.execute("PRAGMA journal_mode = OFF")  # from WAL; a failed load leaves a file to delete
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("PRAGMA cache_size = -131072")  # 128 MiB, whatever N: keys arrive in order
        first = times_text(scan_starts(spec)[:1])[0]
        conn.execute("BEGIN")
        conn.execute(_INSERT_ROOT, (spec.root, first))
        conn.executemany(_INSERT_LABEL, enumerate(label_names(spec), start=1))
        conn.execute(_INSERT_TYPE, ("dhash", 0, first))
        pending = 0
        for rows, feats, attributes in ahead(generate(spec, chunk, c)):
            conn.executemany(_INSERT_IMAGE, rows)
            conn.executemany(_INSERT_FEATURE, feats)
            conn.executemany(_INSERT_ATTRIBUTE, attributes)
            pending += len(rows)
            if pending >= commit_rows:
                conn.execute("COMMIT")
                conn.execute("BEGIN")
                pending = 0
                if progress:
                    rate = (c.chunks * chunk) / (time.perf_counter() - t0)
                    print(f"  {min(c.chunks * chunk, spec.rows):,} rows, {rate:,.0f} rows/s", file=sys.stderr)
        conn.executemany(_INSERT_SCAN, scan_rows(spec, c))
        conn.execute("UPDATE feature_types SET version = ? WHERE name = 'dhash'", (-(-c.features // 1000),))
        conn.execute(_SET_STATE, (transactions(spec, c), state_token(spec)))
        conn.execute("COMMIT")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        make_sentinels(spec.root, conn.execute(FIRST_FILES), conn.execute(LAST_FILES))
    finally:
        conn.close()
    seconds = time.perf_counter() - t0
    size = path.stat().st_size
    return {"rows": spec.rows, "seconds": round(seconds, 2), "rows_per_s": round(spec.rows / seconds),
            "bytes": size, "bytes_per_row": round(size / max(spec.rows, 1), 1), "ok": c.ok,
            "corrupt": c.corrupt, "missing": c.missing, "features": c.features, "attributes": c.attributes, "root": spec.root}  # fmt: skip


GENERATOR_VERSION = 1  # bump when the rows for a given spec change


def _remove(path: Path, root: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(os.fspath(path) + suffix).unlink(missing_ok=True)
    if root and os.path.isdir(root):
        shutil.rmtree(root)


def ensure_catalog(
    rows: int, *, labels: int = 1_000, seed: int = 0, work: str | os.PathLike[str] | None = None,
    force: bool = False, **fractions: Any,
) -> Path:  # fmt: skip
    """``$DLINDEX_BENCH_DIR/catalog-<rows>-<labels>l-s<seed>.db``, made once and then reused while
    its marker (``<file>.complete``, beside it) matches; a benchmark that writes should copy it."""
    folder = Path(work or os.environ.get("DLINDEX_BENCH_DIR") or "/tmp/dlindex-bench")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"catalog-{rows}-{labels}l-s{seed}.db"
    spec = CatalogSpec(rows=rows, labels=labels, seed=seed, root=os.path.abspath(path) + "-root", **fractions)
    marker = path.with_name(path.name + ".complete")
    meta = {"v": GENERATOR_VERSION, **asdict(spec)}
    with contextlib.suppress(OSError, ValueError):
        if not force and path.exists() and json.loads(marker.read_text())["spec"] == meta:
            return path
    marker.unlink(missing_ok=True)
    _remove(path, spec.root)
    figures = make_sqlite(path, spec, progress=rows >= 10_000_000)
    marker.write_text(json.dumps({"spec": meta, "figures": figures}, indent=1))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", help="catalog file to create, or a postgresql:// URL (default: ensure_catalog's file)")
    ap.add_argument("--work", help="where --db defaults to (default $DLINDEX_BENCH_DIR or /tmp/dlindex-bench)")
    ap.add_argument("--rows", type=float, default=1e6, help="rows (1e6, 1e7, 1e8 ...)")
    ap.add_argument("--labels", type=int, default=1000, help="classes (1000, 21000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=50_000, help="rows generated at a time (part of the seed)")
    ap.add_argument("--force", action="store_true", help="replace an existing file")
    ap.add_argument("--root", default="", help="the tree's folder (default: <catalog>-root); made, with 6 tiny files")
    for name, default in asdict(CatalogSpec()).items():
        if name not in ("rows", "labels", "seed") and isinstance(default, float):
            ap.add_argument(f"--{name}", type=float, default=default, help=f"default {default}")
    a = ap.parse_args(argv)
    fractions = {k: getattr(a, k) for k, v in asdict(CatalogSpec()).items() if isinstance(v, float)}
    spec = CatalogSpec(**{**fractions, "rows": int(a.rows), "labels": a.labels, "seed": a.seed, "root": a.root})
    if a.db is None:  # the reusable benchmark catalog
        others = {k: v for k, v in fractions.items() if v != getattr(CatalogSpec, k)}
        path = ensure_catalog(spec.rows, labels=spec.labels, seed=spec.seed, work=a.work, force=a.force, **others)
        print(path.with_name(path.name + ".complete").read_text())
        return 0
    if a.db.startswith(("postgresql://", "postgres://")):
        from make_catalog_pg import make_postgres  # bench/ is on sys.path when run as a script

        figures = make_postgres(a.db, spec, chunk=a.chunk)
    else:
        path = Path(a.db)
        if a.force:
            _remove(path, a.root or os.path.abspath(path) + "-root")
        figures = make_sqlite(path, spec, chunk=a.chunk, progress=True)
    print(json.dumps({**figures, "spec": asdict(spec)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
