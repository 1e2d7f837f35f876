"""The same commands on both backends give the same answers: a file catalog and a PostgreSQL one.

One scenario (scan, rescan after edits, query in every shape, mark by id and by path, features
compute/show/similar/list, dups, export in each format, stats, the query log) runs through the
CLI against SQLite and against a real PostgreSQL server (tests/servers.py); every output is
compared after taking out what must differ (timings, timestamps, the catalog's own location
and size, the text of index definitions). Skips, with the reason, where PostgreSQL is absent.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from .conftest import invoke, make_jpeg, make_png

_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?")
_SECONDS = re.compile(
    r'("?(?:seconds|duration_ms|mean_ms|total_ms|p95_ms|per_s|files_per_s|ms|lock_wait_ms)"?: )[-0-9.e]+'
)


def make_tree(root: Path) -> Path:
    """Uneven classes, a nested folder, files under ROOT, a corrupt file, a non-ASCII name."""
    for i in range(5):
        make_png(root / "cat" / f"{i:03d}.png", (16 + i, 16), (30 * i, 10, 0))
    for i in range(3):
        make_jpeg(root / "dog" / f"{i:03d}.jpg", (20, 12 + i), (0, 40 * i, 90))
    make_png(root / "dog" / "deep" / "x.png", (9, 9), (1, 2, 3))
    make_png(root / "bird" / "été.png", (10, 11), (200, 100, 0))
    make_png(root / "bird" / "copy.png", (16, 16), (0, 10, 0))  # the same pixels as cat/000.png
    make_png(root / "loose.png", (8, 8), (5, 5, 5))
    (root / "dog" / "broken.jpg").write_bytes(b"not a jpeg")
    return root


def normalise(text: str, location: str) -> str:
    text = text.replace(location, "CATALOG")
    text = _TIMESTAMP.sub("TIME", text)
    text = _SECONDS.sub(r"\g<1>0", text)
    text = re.sub(r"\(\d+(?:\.\d+)? s, [\d,.]+/s\)", "(N s, N/s)", text)
    return text


def scenario(tmp: Path, db: str) -> dict[str, Any]:
    """Every command's output on a catalog at ``db`` (a file or a URL), by step name."""
    root = make_tree(tmp / "images")
    out: dict[str, Any] = {}

    def cli(name: str, *args: str, stdin: str | None = None, keep: Callable[[str], Any] | None = None) -> str:
        result = invoke(CliRunner(), *args, "--db", db, input=stdin)
        assert result.exit_code == 0, (name, result.output)
        text = normalise(result.stdout, db)
        out[name] = keep(text) if keep else text
        return text

    def scan_json(text: str) -> dict[str, Any]:
        data = json.loads(text)
        for key in ("seconds", "files_per_s", "scan_id"):
            data.pop(key, None)
        return dict(data)

    cli("scan", "scan", str(root), "--workers", "1", "--json", keep=scan_json)
    # edits: one changed file, one removed, one added
    make_png(root / "cat" / "001.png", (40, 40), (255, 0, 0))
    (root / "dog" / "002.jpg").unlink()
    make_png(root / "cat" / "new.png", (12, 12), (0, 0, 255))
    cli("rescan", "scan", str(root), "--workers", "1", "--json", keep=scan_json)
    for name, args in {
        "query": (),
        "query-label": ("--label", "cat"),
        "query-corrupt": ("--status", "corrupt"),
        "query-missing": ("--status", "missing"),
        "query-size": ("--min-width", "16", "--min-height", "12"),
        "query-per-label": ("--per-label", "2", "--seed", "5"),
        "query-random": ("--order", "random", "--seed", "7", "--limit", "5"),
        "query-columns": ("--columns", "id,path,xxh3_128,bytes,mode,format,split,label_id", "--format", "csv"),
        "query-offset": ("--limit", "3", "--offset", "2"),
        "query-paths": ("--format", "paths"),
    }.items():
        cli(name, "query", *args)
    cli("mark-ids", "mark", "--processed", "--json", stdin="1\n2\n999\n")
    cli("mark-paths", "mark", "--by", "path", "--processing-status", "failed", "--error", "why", "--json",
        stdin=f"{root}/cat/000.png\ndog/000.jpg\n{root}/nope.png\n")  # fmt: skip
    cli("query-processed", "query", "--processed")
    cli("query-failed", "query", "--processing-status", "failed")
    cli("query-unprocessed", "query", "--unprocessed", "--format", "paths")
    cli("features-compute", "features", "compute", "--type", "dhash", "--workers", "1", "--json",
        keep=lambda t: {k: v for k, v in json.loads(t).items() if k not in ("seconds", "per_s")})  # fmt: skip
    cli("features-thumb", "features", "compute", "--type", "thumb", "--label", "cat", "--workers", "1", "--quiet")
    cli("features-list", "features", "list", "--format", "jsonl")
    cli("features-show", "features", "show", "3", "--json")
    cli("similar", "similar", "3", "--type", "thumb", "--top", "3", "--format", "jsonl")
    cli("dups", "dups", "--format", "jsonl")
    cli("leaks", "leaks", "--type", "dhash", "--split", "train=0.5,val=0.5", "--format", "jsonl")
    cli("leaks-exact", "leaks", "--split", "train=0.5,val=0.5", "--label", "cat", "--format", "jsonl")
    cli("roots", "roots", "list")
    npz = tmp / "dhash.npz"
    cli("features-export", "features", "export", str(npz), "--type", "dhash")
    out["features-export-bytes"] = hashlib.sha256(npz.read_bytes()).hexdigest()
    cli("features-import", "features", "import", str(npz), "--type", "copy", "--json",
        keep=lambda t: {k: v for k, v in json.loads(t).items() if k not in ("seconds", "mb_per_s", "journal", "path")})  # fmt: skip
    cli("features-drop", "features", "drop", "--type", "copy")
    cli("stats", "stats", "--json", keep=_stats)
    cli("log", "log", "show", "--json", "--top", "1000", keep=_log)
    out["training"] = _epochs(db)
    for fmt in ("wds", "parquet", "csv", "mds", "dali"):
        export = tmp / f"export-{fmt}"
        cli(f"export-{fmt}", "export", str(export), "--format", fmt, "--split", "train=0.5,val=0.5", "--seed", "3",
            "--shard-size", "4", "--json", keep=lambda t: {k: v for k, v in json.loads(t).items() if k not in ("seconds", "bytes")})  # fmt: skip
        out[f"export-{fmt}-files"] = _files(export, tmp)
        shutil.rmtree(export)
    return out


def _epochs(db: str) -> list[Any]:
    """Two epochs of dlindex.torch.DataLoader (2 workers) over the catalog: ids, labels, vectors."""
    from dlindex.torch import DataLoader

    loader = DataLoader(database_path=db, feature_type="dhash", images=True, image_size=8, batch_size=4,
                        num_workers=2, per_label=2, seed=0)  # fmt: skip
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        seen = []
        for batch in loader:
            seen += [(int(i), int(label), hashlib.sha256(f.numpy().tobytes() + im.numpy().tobytes()).hexdigest())
                     for i, label, f, im in zip(batch["id"], batch["label"], batch["features"], batch["image"],
                                                strict=True)]  # fmt: skip
        epochs.append(sorted(seen))
    return epochs


def _stats(text: str) -> dict[str, Any]:
    data = json.loads(text)
    data.pop("catalog_bytes", None)
    data.pop("catalog_backend", None)
    data["indexes"] = [(i["name"], i["table"]) for i in data.get("indexes", [])]
    for scan in data.get("last_scans", []):
        scan.pop("seconds", None)
    return dict(data)


def _log(text: str) -> list[tuple[Any, ...]]:
    """What the log says happened: each fingerprint with its calls and rows (not its timings
    or plans: the two engines' plans and speeds differ)."""
    data = json.loads(text)
    entries = data["fingerprints"] if isinstance(data, dict) else data
    # a wait for the write lock is logged when it took 1 ms or more: timing, not work
    return sorted(
        (e["fingerprint"], e.get("kind"), e["calls"], e.get("rows"))
        for e in entries
        if e.get("sql") != "BEGIN IMMEDIATE"
    )


def _files(folder: Path, tmp: Path) -> dict[str, Any]:
    """Each file of an export by its content hash; index.json itself, without its time, its
    catalog's location and the test's folder."""
    found: dict[str, Any] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.suffix == ".json":
            doc = json.loads(data.decode().replace(str(tmp), "TMP"))
            doc.pop("created_at", None)
            doc.get("catalog", {}).pop("path", None)
            found[str(path.relative_to(folder))] = doc
        else:
            found[str(path.relative_to(folder))] = hashlib.sha256(data).hexdigest()
    return found


def test_postgres_answers_as_sqlite(tmp_path: Path, pg_url: str) -> None:
    on_sqlite = scenario(tmp_path / "a", str(tmp_path / "a" / "catalog.db"))
    on_postgres = scenario(tmp_path / "b", pg_url)
    # the trees sit in different folders: compare with each one's root named ROOT
    a = json.loads(json.dumps(on_sqlite).replace(str(tmp_path / "a"), "TMP"))
    b = json.loads(json.dumps(on_postgres).replace(str(tmp_path / "b"), "TMP"))
    assert a.keys() == b.keys()
    for step in a:
        assert b[step] == a[step], step
