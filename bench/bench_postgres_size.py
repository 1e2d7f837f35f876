"""Every command on a PostgreSQL catalog at size (#34): peak memory of the client's process tree
and of the server, CPU and wall seconds, beside same-run baselines (`bench_postgres_size` section).

The catalog is bench/make_catalog.py's (its rows COPYed into a server database), one database
per size, made once on the server given (--postgres URL of a superuser; `dlindex postgres start
DIR` makes one) and reused while it exists. Each case runs the real CLI in a fresh process,
stdout hashed (bench/pg_measure.py samples the process tree's and the server's memory every
0.1 s). With --old DIR (`git archive <rev> dlindex | tar -x -C DIR`) each case also runs that
code, same catalog, same run. With --sqlite each read-only case also runs on a copy of the
catalog file of the same rows (make_catalog's ensure_catalog, under --work): outputs are compared
byte for byte (paths under the two roots made alike) and its figures shown beside.

Baselines: `psql -c "COPY (the query's SELECT) TO STDOUT"` to /dev/null (the server alone) and
a bare psycopg loop writing `query --format jsonl`'s lines (bench/baselines/query_jsonl_pg.py).

  nice -n 19 python bench/bench_postgres_size.py --postgres postgresql://postgres@127.0.0.1:PORT/postgres \\
      --rows 1e6,1e7 --old /tmp/old [--sqlite]
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from common import write_section
from pg_measure import measure

START, END = "<!-- bench_postgres_size:start -->", "<!-- bench_postgres_size:end -->"
JSONL_SELECT = (
    "SELECT id, root_id, file_path, file_path_bytes, label_id, width, height, status, processed, processing_status, "
    "created_at FROM image_metadata WHERE status = 'ok' AND excluded = 0 ORDER BY id"
)
LOADER = (
    "import sys; from dlindex.loader.catalog_dataset import CatalogDataset; "
    "d = CatalogDataset(sys.argv[1], world_size=8, rank=3, batch_size=256); print(len(d))"
)
SPLIT = "train=0.9,val=0.1"
# name, dlindex arguments (OUT: an export folder), compared with SQLite, writes
CASES: list[tuple[str, tuple[str, ...], bool]] = [
    ("stats", ("stats", "--json"), False),
    ("stats --exact", ("stats", "--exact", "--json"), False),
    ("query jsonl (all rows)", ("query", "--format", "jsonl", "--no-cache"), True),
    ("query | head -1 (first row)", ("query", "--format", "jsonl", "--no-cache"), True),
    ("query --per-label 32 --seed 0", ("query", "--per-label", "32", "--seed", "0", "--no-cache"), True),
    ("query --label (one class)", ("query", "--label", "LABEL", "--no-cache"), True),
    ("query --status corrupt", ("query", "--status", "corrupt", "--no-cache"), True),
    ("query --processed --format paths", ("query", "--processed", "--format", "paths", "--no-cache"), True),
    ("export jsonl --split", ("export", "OUT", "--format", "jsonl", "--split", SPLIT), True),
    ("export parquet", ("export", "OUT", "--format", "parquet"), True),
    ("export jsonl --shuffle --split --world-size 8",
     ("export", "OUT", "--format", "jsonl", "--shuffle", "--split", SPLIT, "--world-size", "8"), True),
    ("loader plan (world 8, rank 3)", (), True),
    ("dups", ("dups", "--format", "jsonl"), True),
    ("leaks --split", ("leaks", "--split", SPLIT, "--format", "jsonl"), True),
    ("mark 1M ids", ("mark", "--processing-status", "STATUS", "IDS", "--json"), False),
    ("index --suggest", ("index", "--suggest"), False),
    ("check", ("check",), False),
]  # fmt: skip


def url_for(server: str, name: str) -> str:
    return urlunsplit(urlsplit(server)._replace(path=f"/{name}"))


def ensure_pg_catalog(server: str, rows: int, root: Path) -> str:
    """Database cat_<rows> on ``server``, made once by make_catalog.py (COPY)."""
    import psycopg

    name = f"cat_{rows}"
    url = url_for(server, name)
    with psycopg.connect(server, autocommit=True) as conn:
        made = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if made:
            with psycopg.connect(url) as c:
                done = c.execute("SELECT to_regclass('image_metadata') IS NOT NULL").fetchone()
                if done and done[0] and (c.execute("SELECT count(*) FROM labels").fetchone() or (0,))[0]:
                    c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")  # index --suggest's workload
                    c.commit()
                    return url
            conn.execute(f"DROP DATABASE {name}")  # a name made here
        conn.execute(f"CREATE DATABASE {name}")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    subprocess.run([sys.executable, str(HERE / "make_catalog.py"), "--db", url, "--rows", str(rows), "--root",
                    str(root)], check=True, cwd=HERE, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    return ensure_pg_catalog(server, rows, root)


def postmaster_of(url: str) -> int | None:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT pg_postmaster_start_time(), current_setting('data_directory')").fetchone()
    try:
        return int(Path(str(row[1]) if row else "", "postmaster.pid").read_text().split()[0])
    except OSError:
        return None  # a server on another host, or one this user cannot read: no server figures


def folder_digest(folder: Path, roots: tuple[bytes, bytes] | None) -> str:
    """Every file but the index (its time and catalog differ), paths made alike."""
    h = hashlib.sha256()
    for p in sorted(q for q in folder.rglob("*") if q.is_file() and not q.name.endswith("index.json")):
        data = p.read_bytes()
        h.update(str(p.relative_to(folder)).encode() + b"\0" + (data.replace(*roots) if roots else data))
    return h.hexdigest()[:16]


def run_case(
    args: tuple[str, ...], name: str, db: str, code: Path, work: Path, postmaster: int | None,
    roots: tuple[bytes, bytes] | None, extra: dict[str, str],
) -> dict[str, Any]:  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(code)}
    out = work / f"export-out-{Path(db).name}"  # runs of other sizes may be exporting at once
    shutil.rmtree(out, ignore_errors=True)
    if name.startswith("loader"):
        cmd = [sys.executable, "-c", LOADER, db]
    else:
        filled = [str(out) if a == "OUT" else extra.get(a, a) for a in args]
        cmd = [sys.executable, "-m", "dlindex", *filled, "--db", db]
    if "head -1" in name:
        cmd = ["sh", "-c", f"{shlex.join(cmd)} | head -1"]
    temp = temp_bytes(db)
    r = measure(cmd, env=env, cwd=str(code), postmaster=postmaster, replace=roots)
    if temp is not None:
        r["server_temp_mb"] = round(((temp_bytes(db) or 0) - temp) / 2**20, 1)
    if out.exists():
        r["sha256"] = folder_digest(out, roots)
        r["out_mb"] = round(sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 2**20, 1)
        shutil.rmtree(out)
    return r


def save(saved: Path, result: dict[str, Any], name: str) -> None:
    """Add case ``name`` (and the baselines) to the saved results: runs of other --only parts may
    be writing the same file."""
    with open(saved.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = json.loads(saved.read_text()) if saved.exists() else {}
        current.setdefault("cases", {})[name] = result["cases"][name]
        current.update({k: v for k, v in result.items() if k != "cases"})
        saved.write_text(json.dumps(current, indent=1))


def temp_bytes(db: str) -> int | None:
    """The bytes of temporary files the server wrote for the catalog's database so far."""
    if not db.startswith("postgresql://"):
        return None
    import psycopg

    with psycopg.connect(db) as conn:
        row = conn.execute("SELECT temp_bytes FROM pg_stat_database WHERE datname = current_database()").fetchone()
    return int(row[0]) if row else None


def baselines(url: str, postmaster: int | None) -> dict[str, Any]:
    psql = shutil.which("psql") or str(next(Path("/usr/lib/postgresql").glob("*/bin/psql")))
    return {
        "psql COPY to /dev/null": measure(
            [psql, url, "-Atqc", f"COPY ({JSONL_SELECT}) TO STDOUT"], postmaster=postmaster
        ),
        "bare psycopg loop (jsonl)": measure(
            [sys.executable, str(HERE / "baselines" / "query_jsonl_pg.py"), url], postmaster=postmaster
        ),
    }


def at_size(rows: int, a: argparse.Namespace) -> dict[str, Any]:
    work = Path(a.work)
    root = work / f"root-{rows}"
    url = ensure_pg_catalog(a.postgres, rows, root)
    pm = postmaster_of(url)
    import psycopg

    with psycopg.connect(url) as conn:  # the catalog's own root (an older run may have made it elsewhere)
        root = Path((conn.execute("SELECT path FROM roots ORDER BY id").fetchone() or (str(root),))[0])
        label = str((conn.execute("SELECT name FROM labels ORDER BY id LIMIT 1 OFFSET 7").fetchone() or ("",))[0])
    codes = {"new": REPO, **({"old": Path(a.old)} if a.old else {})}
    sqlite_db = None
    if a.sqlite:
        from make_catalog import ensure_catalog

        shared = ensure_catalog(rows, work=a.sqlite_dir)
        sqlite_db = work / f"sqlite-{rows}.db"
        shutil.copyfile(shared, sqlite_db)  # commands write their query log: never into the shared file
        sqlite_root = (str(shared) + "-root").encode()
    ids = work / f"ids-{rows}"
    step = max(1, rows // 1_000_000)
    ids.write_text("".join(f"{i}\n" for i in range(1, rows + 1, step)))
    saved = Path(a.work, f"results-{rows}.json")
    result: dict[str, Any] = json.loads(saved.read_text()) if a.only and saved.exists() else {}
    result.update({"rows": rows, "url": url})
    result.setdefault("cases", {})
    if not a.only or "baseline" in a.only.split(","):
        result["baselines"] = baselines(url, pm)
    statuses = iter(("failed", "completed", "failed", "completed"))
    with psycopg.connect(url, autocommit=True) as conn:  # what mark changes, kept once, restored after it
        conn.execute("CREATE SCHEMA IF NOT EXISTS bench")
        conn.execute("CREATE TABLE IF NOT EXISTS bench.saved_status AS SELECT id, processing_status "
                     f"FROM image_metadata WHERE (id - 1) % {int(step)} = 0")  # fmt: skip
    try:
        for name, args, compare in CASES:
            if a.only and not any(o in name for o in a.only.split(",")):
                continue
            row: dict[str, Any] = {}
            for which, code in codes.items():
                if which == "old" and a.old_only and not any(o in name for o in a.old_only.split(",")):
                    continue
                extra = {"IDS": str(ids), "LABEL": label, "STATUS": next(statuses) if name.startswith("mark") else ""}
                row[which] = run_case(args, name, url, code, work, pm, None, extra)
                print(rows, name, which, json.dumps({k: v for k, v in row[which].items() if k != "stderr"}),
                      flush=True)  # fmt: skip
            if sqlite_db is not None and compare:
                row["sqlite"] = run_case(args, name, str(sqlite_db), REPO, work, None,
                                         (sqlite_root, str(root).encode()), {"LABEL": label})  # fmt: skip
                print(rows, name, "sqlite", json.dumps({k: v for k, v in row["sqlite"].items() if k != "stderr"}),
                      flush=True)  # fmt: skip
            result["cases"][name] = row
            save(saved, result, name)
    finally:
        ids.unlink(missing_ok=True)
        with psycopg.connect(url, autocommit=True) as conn:  # the catalog as it was: later runs compare outputs
            conn.execute("UPDATE image_metadata m SET processing_status = s.processing_status FROM bench.saved_status s "
                         "WHERE m.id = s.id AND m.processing_status IS DISTINCT FROM s.processing_status")  # fmt: skip
        if sqlite_db is not None:
            for suffix in ("", "-wal", "-shm"):
                Path(str(sqlite_db) + suffix).unlink(missing_ok=True)
    return result


def _fmt(r: dict[str, Any] | None) -> str:
    if not r:
        return "| | | |"
    if r["rc"] != 0:
        return f"exit {r['rc']}: {r['stderr'].strip().splitlines()[-1][:80] if r['stderr'].strip() else ''} | | |"
    server = f"{r['server_cpu_s']} / {r['server_rss_mb']:,.0f}" if r.get("server_cpu_s") is not None else ""
    if r.get("server_temp_mb"):
        server += f" (temp files {r['server_temp_mb']:,.0f} MB)"
    return f"{r['cpu_s']} / {r['wall_s']} | {r['rss_mb']:,.0f} | {server} |"


def render(results: list[dict[str, Any]], argv: list[str], meta: dict[str, Any]) -> str:
    load = (
        "" if meta.get("rendered") else f"(load {meta['load'][0]:.1f} at the start, {meta['load'][1]:.1f} at the end)"
    )
    lines = [
        START,
        "## PostgreSQL at size (`bench/bench_postgres_size.py`, #34)",
        "",
        f"`python bench/bench_postgres_size.py {' '.join(argv)}`, {meta['when']}, {os.cpu_count()} shared cores "
        f"{load}, {meta['server']}, server "
        "and clients on the same machine over TCP. Each cell: CPU s / wall s of the command's process tree, its "
        "peak RSS (MB, the tree's sum, sampled every 0.1 s), and the server's CPU s over the same time / the largest "
        "server process's peak RSS (MB; stock shared_buffers of 128 MB, counted in each backend that touched it). "
        "`old`: the code before this change (same catalog, same run); `sqlite`: today's code on the catalog file "
        "of the same rows; `same` says whether its stdout (or export files) equal PostgreSQL's byte for byte.",
        *([meta["note"]] if meta.get("note") else []),
        "",
    ]
    for r in results:
        lines += [f"**{r['rows']:,} rows**", "", "| case | new: CPU / wall | new: RSS MB | new: server CPU / RSS |"
                  " old: CPU / wall | old: RSS MB | old: server CPU / RSS | sqlite: CPU / wall | sqlite: RSS MB | same |",
                  "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for name, b in r.get("baselines", {}).items():
            lines.append(f"| baseline: {name} | {_fmt(b)} | | | | | | |")
        for name, row in r["cases"].items():
            sq = row.get("sqlite")
            same = "" if sq is None else ("yes" if sq["sha256"] == row["new"]["sha256"] else "**no**")
            sq_cells = f"{sq['cpu_s']} / {sq['wall_s']} | {sq['rss_mb']:,.0f}" if sq and sq["rc"] == 0 else " | "
            shown = name.replace("|", "\\|")
            lines.append(f"| {shown} | {_fmt(row.get('new'))} {_fmt(row.get('old'))} {sq_cells} | {same} |")
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--postgres", required=True, help="a superuser URL of the server to make the catalogs on")
    ap.add_argument("--rows", default="1e6", help="comma-separated sizes (1e6,1e7)")
    ap.add_argument("--old", help="a folder holding an earlier dlindex package, run beside this one")
    ap.add_argument("--sqlite", action="store_true", help="also run each read-only case on a copy of the file catalog")
    ap.add_argument("--sqlite-dir", default=None, help="where ensure_catalog keeps the file catalogs")
    ap.add_argument("--only", default="", help="comma-separated parts of case names")
    ap.add_argument("--old-only", default="", help="run --old only for the cases named by these parts")
    ap.add_argument("--render", action="store_true", help="write the section from --work's saved results")
    ap.add_argument("--note", default="", help="a paragraph for the section: how the saved results were run")
    ap.add_argument("--work", default="/tmp/dlindex-bench-pg-size")
    ap.add_argument("--no-docs", action="store_true")
    a = ap.parse_args(argv)
    Path(a.work).mkdir(parents=True, exist_ok=True)
    os.chmod(a.work, 0o711)
    import psycopg

    with psycopg.connect(a.postgres) as conn:
        version = (conn.execute("SHOW server_version").fetchone() or ("?",))[0]
    meta = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": [os.getloadavg()[0], 0.0],
            "server": f"PostgreSQL {version}", "note": a.note, "rendered": a.render}  # fmt: skip
    results = []
    for size in a.rows.split(","):
        if a.render:  # the figures of earlier runs (--only runs add to them)
            results.append(json.loads(Path(a.work, f"results-{int(float(size))}.json").read_text()))
        else:
            results.append(at_size(int(float(size)), a))
    meta["load"][1] = os.getloadavg()[0]
    shown = list(sys.argv[1:] if argv is None else argv)
    if "--note" in shown:  # the note is the section's own paragraph
        at = shown.index("--note")
        del shown[at : at + 2]
    text = render(results, shown, meta)
    print(text)
    if not a.no_docs:
        write_section(REPO / "docs" / "benchmarks.md", START, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
