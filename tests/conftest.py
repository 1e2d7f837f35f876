"""Shared fixtures and helpers: image trees made with Pillow, catalogs, the CLI runner, one-call wrappers.

Test files are named for what they test: ``test_cli_<command>.py`` drives one command through
CliRunner (or a real process); ``test_<package>_<module>.py`` tests one library module of the
layout (``test_scan_walk.py`` for dlindex/scan/walk.py, ``test_catalog_connection.py`` for
dlindex/catalog/connection.py), ``test_<package>.py`` a package as a whole; a suffix names a
property checked across modules (``_fuzz``, ``_safety``, ``_trust``, ``_bounds``); ``test_faults_*``,
``test_docs*`` and ``test_user_environment.py`` check the whole program. Helpers shared by more
than one file live here; catalogs written straight into SQLite come from synthetic.py, logged
catalogs for index advice from advisor_workload.py, real PostgreSQL and Redis servers (the
``postgres_server``, ``pg_url``, ``redis_server`` and ``redis_url`` fixtures) from servers.py, and
the running of one module's tests on both backends (``catalog_backend``) from backends.py.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from PIL import Image
from typer.testing import CliRunner, Result

from dlindex import Catalog, QuerySpec, ScanOptions, ScanSummary, scan_tree
from dlindex.cli import app
from dlindex.export import ExportOptions, ExportSummary, export_catalog
from dlindex.exported.index import index_path
from dlindex.features import ComputeOptions, ComputeSummary, ImportSummary, compute_features, import_features

from .backends import Location, backend_first, catalog_backend, catalog_template, raw, where  # noqa: F401  (fixtures)
from .servers import pg_url, postgres_server, redis_server, redis_url  # noqa: F401  (fixtures for every module)
from .synthetic import Row, balanced, make_catalog

REPO = Path(__file__).resolve().parents[1]
DLINDEX = (sys.executable, "-m", "dlindex")  # the CLI in a real process
SHARED = REPO.parent / "shared"
CORPUS = SHARED / "corpus" / "pillow-tests-images"
CORPUS_EXPECTED = SHARED / "corpus" / "pillow-tests-images.expected.json"


def make_png(path: Path, size: tuple[int, int] = (16, 16), color: tuple[int, int, int] = (0, 0, 0)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def make_jpeg(path: Path, size: tuple[int, int] = (32, 24), color: tuple[int, int, int] = (10, 20, 30)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path, "JPEG", quality=90)
    return path


@pytest.fixture
def image_tree(tmp_path: Path) -> Path:
    """Six tiny PNGs in two classes (cat/000.png ... dog/002.png), plus one broken file."""
    root = tmp_path / "images"
    for label, i in itertools.product(("cat", "dog"), range(3)):
        make_png(root / label / f"{i:03d}.png", (16 + i, 16), (40 * i, 0, 0))
    (root / "dog" / "broken.jpg").write_bytes(b"not a jpeg")
    return root


@pytest.fixture
def db_path(tmp_path: Path, request: pytest.FixtureRequest) -> Location:
    """The catalog of the test: a file, or on a ``[postgresql]`` run of a module on both backends, a server database."""
    backend_first(request)
    return where(tmp_path / "catalog.db")


@pytest.fixture
def scanned_db(image_tree: Path, db_path: Path) -> Path:
    """A catalog of image_tree, scanned once with one worker."""
    with Catalog(db_path, create=True) as catalog:
        scan_tree(catalog, image_tree, ScanOptions(workers=1))
    return db_path


@pytest.fixture
def cats(tmp_path: Path, request: pytest.FixtureRequest) -> Location:
    """A synthetic catalog of eight samples: cat/0001.png ... is ids 1-4, dog/0001.png ... ids 5-8."""
    backend_first(request)
    return balanced(tmp_path / "c.db", {"cat": 4, "dog": 4})


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder for the loader's epoch plans (DLINDEX_PLAN_DIR), set for the test."""
    from dlindex.loader import shared_plan

    folder = tmp_path / "plans"
    folder.mkdir()
    monkeypatch.setenv(shared_plan.ENV, str(folder))
    return folder


@pytest.fixture(autouse=True)
def _no_dlindex_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("DLINDEX_")]:
        monkeypatch.delenv(name)


# --- reading a catalog behind dlindex's back --------------------------------------------------


def rows(db: Location, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Read the catalog with the backend's own driver (sqlite3, psycopg), independent of dlindex's code."""
    with raw(db) as conn:
        return [tuple(row) for row in conn.execute(sql, params).fetchall()]


def processed_ids(db: Location) -> list[int]:
    """The ids whose processed flag is set, in id order."""
    return [int(str(r[0])) for r in rows(db, "SELECT id FROM image_metadata WHERE processed = 1 ORDER BY id")]


# --- one library call on a catalog file -----------------------------------------------------------


def scan(db: Path, root: Path, options: ScanOptions | None = None, **fields: Any) -> ScanSummary:
    """Scan ``root`` into ``db`` (created if need be); one worker unless ``options`` or fields say otherwise."""
    with Catalog(db, create=True) as catalog:
        return scan_tree(catalog, root, options or ScanOptions(**{"workers": 1, **fields}))


def export(db: Path, out: Path, **options: Any) -> ExportSummary:
    with Catalog(db) as catalog:
        return export_catalog(catalog, out, ExportOptions(**options))


def exported(db: Path, out: Path, **options: Any) -> Path:
    """Export, then hand back the folder to read it from."""
    export(db, out, **options)
    return out


def compute(db: Path, name: str, spec: QuerySpec | None = None, **options: Any) -> ComputeSummary:
    """features compute with one worker unless told otherwise."""
    with Catalog(db) as catalog:
        return compute_features(catalog, name, spec, ComputeOptions(**{"workers": 1, **options}))


def import_file(db: Path, file: Path, name: str = "emb", **options: Any) -> ImportSummary:
    with Catalog(db) as catalog:
        return import_features(catalog, name, file, **options)


def rewrite_export_file(out: Path, name: str, data: bytes) -> None:
    """Replace one file of an export and make index.json agree: a consistent hand-edit."""
    (out / name).write_bytes(data)
    index = json.loads(index_path(out).read_text())
    for entry in [*index["dlindex_shards"], *index["files"]]:
        if entry["file"] == name:
            entry["bytes"], entry["xxh3_128"] = len(data), xxhash.xxh3_128_hexdigest(data)
    index_path(out).write_text(json.dumps(index))


# --- exact neighbours, the slow way ----------------------------------------------------------


def brute_force(vectors: np.ndarray, labels: list[str], q: int, k: int, metric: str,
                allowed: set[int] | None = None, other_labels: bool = False) -> list[tuple[int, float]]:  # fmt: skip
    """Plain float64 numpy over every row (ids are 1-based row numbers), ties to the lower id."""
    v = vectors.astype(np.float64)
    x = v[q - 1]
    if metric == "l2":
        d = np.sqrt(((v - x) ** 2).sum(axis=1))
    else:
        scale = np.sqrt((v * v).sum(axis=1)) * np.sqrt((x * x).sum())
        with np.errstate(divide="ignore", invalid="ignore"):
            d = np.where(scale > 0, np.clip(1 - (v * x).sum(axis=1) / scale, 0, 2), 1.0)
    ids = [i for i in range(1, len(v) + 1) if i != q and (allowed is None or i in allowed)
           and not (other_labels and labels[i - 1] == labels[q - 1])]  # fmt: skip
    return sorted(((i, float(d[i - 1])) for i in ids), key=lambda t: (t[1], t[0]))[:k]


def catalog_with(tmp_path: Path, vectors: np.ndarray, statuses: list[str] | None = None) -> tuple[Path, list[str]]:
    """A synthetic catalog with ``vectors`` stored as feature type "v"; labels cycle a, b, c."""
    n = len(vectors)
    labels = [("a", "b", "c")[i % 3] for i in range(n)]
    status = statuses or ["ok"] * n
    db = make_catalog(tmp_path / "s.db", [Row(labels[i], status=status[i]) for i in range(n)])
    np.savez(tmp_path / "v.npz", ids=np.arange(1, n + 1), vectors=vectors)
    with Catalog(db) as catalog:
        import_features(catalog, "v", tmp_path / "v.npz")
    return db, labels


# --- the CLI through CliRunner --------------------------------------------------------------------


def invoke(runner: CliRunner, *args: str, input: str | bytes | None = None) -> Result:
    """Run ``dlindex ARGS``; a traceback (any exception but typer's exit) fails the test."""
    result = runner.invoke(app, list(args), input=input)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def captioned_catalog(
    tmp_path: Path, runner: CliRunner, images: dict[str, tuple[tuple[int, int], tuple[int, int, int]]],
    captions: dict[str, Any],
) -> Location:  # fmt: skip
    """A scanned tree of PNGs (name -> (size, colour)) with ``captions`` (name -> a caption or a
    list of them) imported from ``caps.jsonl`` (source ``caps``): its catalog's location."""
    for name, (size, colour) in images.items():
        make_png(tmp_path / "tree" / name, size, colour)
    location = where(tmp_path / "c.db")
    assert invoke(runner, "scan", str(tmp_path / "tree"), "--db", str(location), "-q").exit_code == 0
    lines = (json.dumps({"path": name, "caption": caption}) + "\n" for name, caption in captions.items())
    (tmp_path / "caps.jsonl").write_text("".join(lines))
    from dlindex.text.importer import import_texts  # the text stage: only where a test asks for it

    with Catalog(location) as catalog:
        import_texts(catalog, tmp_path / "caps.jsonl")
    return location


def one_error_line(result: Result) -> str:
    """Exit 1 with exactly one ``Error:`` line on stderr; returns that line."""
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]
