"""Texts (issue #36): `text import` of one caption per sample, and `query --text` at size.

On a copy of the benchmark catalog (make_catalog.ensure_catalog, 10^7 rows by default), one
generated caption per sample (6-12 words drawn from a 5,000-word Zipf vocabulary, plus marker
words planted at known rates: `zebra` in 0.01% of the captions, `giraffe` in 1%, `umbrella` in
10%) is written as JSONL keyed by id and imported with `dlindex text import` (a subprocess: its
peak RSS from the process tree). Same-run baseline: a bare python loop reading the same file
with json.loads into a fresh SQLite table with the same FTS5 index and trigger.

Then each search runs through the library (`query_rows(..., text=...)`, result cache off,
warm, median of --reps) beside the bare FTS5 statement that finds the same texts
(`SELECT rowid FROM image_texts_fts(?)`), with the rows each returns.

    python bench/bench_text.py [--rows 10000000] [--reps 5] [--docs docs/benchmarks.md]
    python bench/bench_text.py --db postgresql://.../empty_db --rows 1000000   # a server catalog
    python bench/bench_text.py --sidecars 200000   # scan --texts on a tree of N images, each with a .txt
    python bench/bench_text.py --export --limit 1000000   # manifests with and without --texts

``--sidecars N``: a tree of N tiny images (hard links to make_trees' tiny-200000 files) each
with a one-line ``.txt``; first scans and unchanged rescans with and without ``--texts`` (fresh
catalogs, the tree warm in the page cache), medians of --reps, written under their own markers.

With ``--db`` a PostgreSQL URL (an empty database), the catalog is made there by
make_catalog_pg (the same rows), and the section is written under its own markers.

Written to docs/benchmarks.md between <!-- bench_text:start --> and <!-- bench_text:end -->.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import compile_sources, write_section
from make_catalog import ensure_catalog

MARKS = {False: ("<!-- bench_text:start -->", "<!-- bench_text:end -->"),
         True: ("<!-- bench_text_pg:start -->", "<!-- bench_text_pg:end -->")}  # fmt: skip
MARKERS = (("zebra", 0.0001), ("giraffe", 0.01), ("umbrella", 0.1))
SEARCHES = (
    ("rare word (0.01%)", "zebra", {}),
    ("1% word", "giraffe", {}),
    ("two words", "giraffe zebra", {}),
    ("OR", "zebra OR okapi", {}),
    ("phrase", '"giraffe w1"', {}),
    ("1% word -10% word", "giraffe -umbrella", {}),
    ("1% word, one label", "giraffe", {"labels": ("golden retriever 0",)}),
    ("1% word, --per-label 4", "giraffe", {"per_label": 4}),
    ("1% word, --limit 100", "giraffe", {"limit": 100}),
    ("10% word, --limit 100", "umbrella", {"limit": 100}),
    ("10% word, --limit 100 --offset 1000", "umbrella", {"limit": 100, "offset": 1000}),
)
_BARE_TABLE = """CREATE TABLE image_texts (id INTEGER PRIMARY KEY, image_id INTEGER NOT NULL, source TEXT NOT NULL,
    seq INTEGER NOT NULL, text TEXT NOT NULL, encoding TEXT NOT NULL, UNIQUE (image_id, source, seq))"""


_IMAGE_IDS = "SELECT image_id FROM image_texts_fts(?)"
_BY_IDS = """SELECT id FROM image_metadata WHERE status = 'ok' AND excluded = 0
    AND id IN (SELECT value FROM json_each(?)) ORDER BY id"""


def captions(path: Path, rows: int, seed: int = 0) -> None:
    """One caption per id 1..rows, as JSONL, generated in blocks (bounded memory)."""
    rng = np.random.default_rng(seed)
    vocabulary = np.array([f"w{i}" for i in range(5000)])
    weights = 1.0 / np.arange(1, 5001)
    weights /= weights.sum()
    partial = path.with_name(path.name + ".partial")  # renamed when whole: a killed run leaves no short file
    with open(partial, "w") as f:
        for start in range(1, rows + 1, 100_000):
            n = min(100_000, rows + 1 - start)
            lengths = rng.integers(6, 13, size=n)
            words = rng.choice(vocabulary, size=(n, 12), p=weights)
            marks = [rng.random(n) < rate for _, rate in MARKERS]
            lines = []
            for k in range(n):
                text = " ".join(words[k, : lengths[k]])
                for (word, _), hit in zip(MARKERS, marks, strict=True):
                    if hit[k]:
                        text = f"{word} {text}"
                lines.append(json.dumps({"id": start + k, "caption": f"a photo of {text}"}))
            f.write("\n".join(lines) + "\n")
    os.replace(partial, path)


def import_with_dlindex(db: Path | str, file: Path) -> tuple[float, float]:
    """(seconds, peak RSS MB) of `dlindex text import` in a subprocess, under GNU time: a
    child forked from this (large) process would count this process's pages as its own."""
    started = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-m", "dlindex", "text", "import", str(file),
                           "--source", "bench", "--db", str(db), "--no-log", "-q"],
                          check=True, stderr=subprocess.PIPE, text=True)  # fmt: skip
    return time.perf_counter() - started, int(done.stderr.split()[-1]) / 1024


def import_bare(db: Path, file: Path) -> float:
    """The floor: json.loads per line, executemany into the same table, index and trigger."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(_BARE_TABLE)
    from dlindex.catalog.sqlite.text_schema import SEARCH

    for statement in SEARCH:
        conn.execute(statement)
    started = time.perf_counter()
    conn.execute("BEGIN")
    with open(file, "rb") as f:
        batch = []
        for line in f:
            obj = json.loads(line)
            batch.append((obj["id"], obj["caption"]))
            if len(batch) == 10_000:
                conn.executemany("INSERT INTO image_texts (image_id, source, seq, text, encoding) "
                                 "VALUES (?, 'bench', 0, ?, 'utf-8')", batch)  # fmt: skip
                batch = []
        if batch:
            conn.executemany("INSERT INTO image_texts (image_id, source, seq, text, encoding) "
                             "VALUES (?, 'bench', 0, ?, 'utf-8')", batch)  # fmt: skip
    conn.execute("COMMIT")
    conn.close()
    return time.perf_counter() - started


def sidecar_tree(work: Path, n: int) -> Path:
    """N hard links to tiny-200000's images, each with a caption beside it (made once)."""
    tree = work / f"text-tree-{n}"
    marker = tree.with_name(tree.name + ".complete")
    if marker.exists():
        return tree
    shutil.rmtree(tree, ignore_errors=True)
    source = work / "tiny-200000"
    if not (work / "tiny-200000.complete").exists():
        subprocess.run([sys.executable, str(Path(__file__).parent / "make_trees.py"), "--only", "tiny", "--tiny",
                        "200000", "--work", str(work)], check=True)  # fmt: skip
    images = sorted(p for p in source.rglob("*") if p.is_file())[:n]
    for k, image in enumerate(images):
        target = tree / image.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(image, target)
        target.with_suffix(".txt").write_text(f"a photo of thing {k % 997} in class {image.parent.parent.name}\n")
    marker.write_text(str(n))
    return tree


def bench_sidecars(work: Path, n: int, reps: int, docs: Path) -> None:
    tree = sidecar_tree(work, n)
    subprocess.run(["find", str(tree), "-type", "f"], check=True, stdout=subprocess.DEVNULL)  # warm
    figures = {}
    for texts in (False, True):
        flag = ["--texts"] if texts else []
        first, again = [], []
        for k in range(reps):
            db = work / f"text-tree-{n}-{k}.db"
            for suffix in ("", "-wal", "-shm"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)
            for times in (first, again):
                started = time.perf_counter()
                subprocess.run([sys.executable, "-m", "dlindex", "scan", str(tree), "--db", str(db), "-q", "--no-log",
                                *flag], check=True)  # fmt: skip
                times.append(time.perf_counter() - started)
            for suffix in ("", "-wal", "-shm"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)
        figures[texts] = (statistics.median(first), statistics.median(again))
        print(f"texts={texts}: first {figures[texts][0]:.2f} s, unchanged rescan {figures[texts][1]:.2f} s")
    (plain_first, plain_again), (text_first, text_again) = figures[False], figures[True]
    start, end = "<!-- bench_text_sidecars:start -->", "<!-- bench_text_sidecars:end -->"
    lines = [
        start,
        "## Texts: `scan --texts`",
        "",
        f"`python bench/bench_text.py --sidecars {n}` (this machine: 2 cores, shared; medians of {reps}, each a "
        f"fresh catalog; the tree warm): {n:,} tiny images, each with a one-line `.txt` beside it.",
        "",
        "| | first scan | unchanged rescan |",
        "|---|---|---|",
        f"| `scan` | {plain_first:.2f} s | {plain_again:.2f} s |",
        f"| `scan --texts` | {text_first:.2f} s ({text_first / plain_first:.2f}x) | "
        f"{text_again:.2f} s ({text_again / plain_again:.2f}x) |",
        "",
        "The sidecar pass lists each folder once and, on a rescan, stats only the sidecars it finds",
        "there, reading none whose size and mtime are unchanged.",
        end,
    ]
    write_section(docs, start, end, "\n".join(lines))


def bench_export(work: Path, rows: int, limit: int, reps: int, docs: Path) -> None:
    """Each manifest format with and without --texts, the same selection, medians of ``reps``."""
    db = work / f"text-{rows}.db"
    if not db.exists():
        raise SystemExit(f"{db} is missing: run bench_text.py --rows {rows} first (it imports the captions)")
    lines = []
    for fmt in ("jsonl", "csv", "parquet"):
        seconds = {}
        for texts in (False, True):
            times = []
            for _ in range(reps):
                out = work / "text-export"
                shutil.rmtree(out, ignore_errors=True)
                started = time.perf_counter()
                subprocess.run([sys.executable, "-m", "dlindex", "export", str(out), "--format", fmt,
                                *(["--limit", str(limit)] if limit else []), "--db", str(db), "--no-log", "-q",
                                *(["--texts"] if texts else [])], check=True)  # fmt: skip
                times.append(time.perf_counter() - started)
            seconds[texts] = statistics.median(times)
        shutil.rmtree(work / "text-export", ignore_errors=True)
        ratio = seconds[False] / seconds[True]
        print(f"{fmt}: {seconds[False]:.2f} s, with --texts {seconds[True]:.2f} s ({ratio:.2f}x)")
        lines.append(f"| {fmt} | {seconds[False]:.2f} s | {seconds[True]:.2f} s | **{ratio:.2f}x** |")
    start, end = "<!-- bench_text_export:start -->", "<!-- bench_text_export:end -->"
    section = [
        start,
        "## Texts: `export --texts`",
        "",
        f"`python bench/bench_text.py --export --rows {rows} --limit {limit}` (this machine: 2 cores, shared; "
        f"medians of {reps}): `export{f' --limit {limit}' if limit else ''}` of the {rows:,}-row catalog with one "
        "caption a sample, without and with `--texts` (speed with texts as a share of without).",
        "",
        "| format | without | with `--texts` | speed |",
        "|---|---|---|---|",
        *lines,
        end,
    ]
    write_section(docs, start, end, "\n".join(section))


def timed(run: object, reps: int) -> tuple[float, int]:
    times, count = [], 0
    for _ in range(reps):
        started = time.perf_counter()
        count = run()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return statistics.median(times), count


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=float, default=1e7)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--work", default=os.environ.get("DLINDEX_BENCH_DIR", "/tmp/dlindex-bench"))
    ap.add_argument(
        "--queries-only",
        action="store_true",
        help="reuse the imported copy and its import figures from the last run (the searches only)",
    )
    ap.add_argument("--db", help="a postgresql:// URL of an empty database: the server catalog's figures")
    ap.add_argument("--docs", default=str(Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"))
    ap.add_argument("--sidecars", type=int, help="scan --texts on a tree of N images with sidecars (only that)")
    ap.add_argument("--export", action="store_true", help="manifest exports with and without --texts (only that)")
    ap.add_argument("--limit", type=int, default=1_000_000, help="with --export: the rows exported (0: all)")
    args = ap.parse_args(argv)
    rows = int(args.rows)
    compile_sources()
    if args.sidecars:
        bench_sidecars(Path(args.work), args.sidecars, args.reps, Path(args.docs))
        return 0
    if args.export:
        bench_export(Path(args.work), rows, args.limit, args.reps, Path(args.docs))
        return 0
    from dlindex import Catalog, query_rows
    from dlindex.query.filters import text_match

    work = Path(args.work)
    server = bool(args.db)
    file = work / f"captions-{rows}.jsonl"
    if not file.exists():
        captions(file, rows)
    figures = work / f"text-{rows}{'-pg' if server else ''}.import.json"
    if args.queries_only:
        seconds, rss, bare, grown = json.loads(figures.read_text())
        db: Path | str = args.db if server else work / f"text-{rows}.db"
    else:
        if server:
            from catalog_rows import CatalogSpec
            from make_catalog_pg import make_postgres

            root = work / f"text-pg-{rows}-root"
            root.mkdir(exist_ok=True)
            make_postgres(args.db, CatalogSpec(rows=rows, root=str(root)))
            db = args.db
            size_before = 0
        else:
            source = ensure_catalog(rows, work=work)
            db = work / f"text-{rows}.db"
            for suffix in ("", "-wal", "-shm"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)
            shutil.copyfile(source, db)
            size_before = db.stat().st_size
        seconds, rss = import_with_dlindex(db, file)
        bare = None if server else import_bare(work / "text-bare.db", file)
        grown = 0
        if not server:
            assert isinstance(db, Path)
            wal = Path(f"{db}-wal")
            grown = db.stat().st_size + (wal.stat().st_size if wal.exists() else 0) - size_before
        figures.write_text(json.dumps([seconds, rss, bare, grown]))
    results = []
    with Catalog(db, log=False) as catalog:
        for name, search, options in SEARCHES:

            def ours(search: str = search, options: dict[str, object] = options) -> int:
                return sum(1 for _ in query_rows(catalog, text=search, columns=("id",), cache=False, **options))

            match = text_match(catalog, search)  # the engine's own form of the search

            def floor(match: str = match) -> int:
                return len(list(catalog.read("SELECT rowid FROM image_texts_fts(?)", (match,))))

            ours_s, ours_n = timed(ours, args.reps)
            floor_s, floor_n = timed(floor, args.reps)
            results.append((name, search, options, ours_s, ours_n, floor_s, floor_n))
            print(f"{name}: {ours_s * 1e3:.1f} ms ({ours_n} rows) vs bare FTS5 {floor_s * 1e3:.1f} ms ({floor_n})")
    fetch_note = ""
    if not server:  # what the broad rows cost without any search: reading those samples by id
        with Catalog(db, log=False) as catalog:
            match = text_match(catalog, "giraffe")
            found = sorted({int(r[0]) for r in catalog.read(_IMAGE_IDS, (match,))})
            by_id, n = timed(lambda: len(list(catalog.read(_BY_IDS, (json.dumps(found),)))), args.reps)
        fetch_note = (
            f"Reading the 1% word's {n:,} samples by id alone, with no search (the same status filters, id "
            f"order): {by_id * 1e3:,.1f} ms: a broad search's time is its rows' time."
        )
    start, end = MARKS[server]
    where = "a PostgreSQL 15 catalog (make_catalog_pg: the same rows)" if server else "a copy of the benchmark catalog"
    against = (
        ""
        if bare is None
        else f"; the bare loop (json.loads, executemany into the same table and FTS5 index): {bare:.1f} s, "
        f"{rows / bare:,.0f} texts/s: **{bare / seconds:.2f}x** of it. Catalog growth {grown / 1e6:,.0f} MB "
        f"({grown / rows:.0f} B a text, index included)"
    )
    lines = [
        start,
        "## Texts" + (" on PostgreSQL" if server else ""),
        "",
        f"`python bench/bench_text.py --rows {rows}{' --db URL' if server else ''}` (this machine: 2 cores, shared; "
        f"medians of {args.reps} warm runs): {where} of {rows:,} rows, one generated caption per sample.",
        "",
        f"- `dlindex text import` of {rows:,} captions (JSONL keyed by id): {seconds:.1f} s, "
        f"{rows / seconds:,.0f} texts/s, peak RSS {rss:.0f} MB{against}.",
        "",
        "| search | `query --text` | rows | the index alone (`image_texts_fts(q)`) | its rows |",
        "|---|---|---|---|---|",
    ]
    for name, search, options, ours_s, ours_n, floor_s, floor_n in results:
        shown = search.replace("|", "\\|") + ("" if not options else " " + json.dumps(options))
        lines.append(
            f"| {name}: `{shown}` | {ours_s * 1e3:,.1f} ms | {ours_n:,} | {floor_s * 1e3:,.1f} ms | {floor_n:,} |"
        )
    lines += [
        "",
        "`query --text` runs the whole selection (status ok, not excluded, the filter, id order) and",
        "builds each row; the index alone only lists the matching text ids. " + fetch_note,
        "A `--limit` over a broad search asks each sample in id order and stops at the limit (chosen when",
        "the index's count of matches says listing them all would cost more: dlindex.query.filters.text_form).",
        end,
    ]
    write_section(Path(args.docs), start, end, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
