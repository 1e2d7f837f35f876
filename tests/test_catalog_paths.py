"""The one path rule (dlindex.catalog.paths): normal forms, and every entry point agreeing on it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlindex import Catalog, ScanOptions, scan_tree
from dlindex.catalog.paths import AMBIGUOUS, NO_ROOT, UNKNOWN, normalise, path_key, resolve_paths
from dlindex.catalog.sqlite.migrations import path_hash
from dlindex.errors import InputError
from dlindex.features.samples import resolve_sample
from dlindex.features.vector_import import _resolve_paths
from dlindex.query.mark import mark_samples

from .backends import ON_BOTH_BACKENDS, where
from .conftest import make_png

pytestmark = ON_BOTH_BACKENDS

PARTS = st.sampled_from([b".", b"..", b"", b"a", b"b", b"\xff", b"\\xff", b"c.png"])
PATHS = st.builds(lambda lead, parts: lead + b"/".join(parts), st.sampled_from([b"", b"/", b"//", b"./"]),
                  st.lists(PARTS, max_size=6))  # fmt: skip
PREFIXES = [(b"/data/a/", 2), (b"/data/", 1), (b"/", 3)]
# Names a scan keeps (not hidden, an image suffix), lookalikes of stand-ins among them.
NAME = st.binary(min_size=1, max_size=8).filter(lambda b: b"/" not in b and b"\0" not in b and not b.startswith(b"."))


@given(PATHS)
def test_normalise_is_idempotent_and_keys_its_normal_form(path: bytes) -> None:
    once = normalise(path)
    assert normalise(once) == once
    assert path_key(once, PREFIXES) == path_key(path, PREFIXES)
    assert not once.startswith(b"//") and b"/./" not in once


def test_path_key_deepest_root_wins_and_relative_paths_have_no_root() -> None:
    assert path_key(b"/data/a/x.png", PREFIXES) == (2, "x.png")
    assert path_key(b"/data/b/../a/./x.png", PREFIXES) == (2, "x.png")
    assert path_key(b"/data//b/x.png", PREFIXES) == (1, "b/x.png")
    assert path_key(b"././cat//1.png", PREFIXES) == (None, "cat/1.png")
    assert path_key(b"/elsewhere/x.png", PREFIXES[:2]) == (NO_ROOT, "/elsewhere/x.png")
    assert path_key(b"\xff.png", PREFIXES) == (None, "\\xff.png")


def _scan(db: Path, *roots: Path) -> None:
    with Catalog(db, create=True) as catalog:
        for root in roots:
            scan_tree(catalog, root, ScanOptions(workers=1))


def _samples(db: Path) -> list[tuple[int, bytes, bytes, str]]:
    """(id, absolute path, path under its root, file_path key) of every sample."""
    with Catalog(db) as catalog:
        rows = catalog.conn.execute(
            "SELECT image_metadata.id, roots.path, roots.path_bytes, file_path, file_path_bytes "
            "FROM image_metadata JOIN roots ON roots.id = image_metadata.root_id ORDER BY image_metadata.id"
        ).fetchall()
    out = []
    for id_, root, root_bytes, key, raw in rows:
        rel = bytes(raw) if raw is not None else os.fsencode(key)
        prefix = bytes(root_bytes) if root_bytes is not None else os.fsencode(root)
        out.append((int(id_), prefix.rstrip(b"/") + b"/" + rel, rel, str(key)))
    return out


def _every_entry_point(db: Path, path: bytes, id_: int, json_key: str | None = None) -> None:
    with Catalog(db) as catalog:
        assert resolve_paths(catalog, [path]) == [id_]
        assert resolve_sample(catalog, os.fsdecode(path)) == id_
        assert _resolve_paths(catalog, [os.fsdecode(path)], Path("v.jsonl")).tolist() == [id_]
        record = json.dumps({"file_path": json_key}).encode() if json_key is not None else path
        result = mark_samples(catalog, [record], processed=True, by="path")
        assert (result.matched, result.unknown) == (1, 0), path
        flagged = catalog.conn.execute("SELECT id FROM image_metadata WHERE processed = 1").fetchall()
        assert flagged == [(id_,)]
        mark_samples(catalog, [str(id_)], processed=False)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(NAME, min_size=1, max_size=4, unique=True))
def test_every_scanned_key_resolves_to_its_own_id_everywhere(tmp_path_factory: pytest.TempPathFactory,
                                                             names: list[bytes]) -> None:  # fmt: skip
    base = tmp_path_factory.mktemp("keys")
    root = base / "images"
    for name in names:
        folder = os.fsencode(root / "cat")
        os.makedirs(folder, exist_ok=True)
        make_png(Path(os.fsdecode(folder + b"/" + name + b".png")))
    db = where(base / "c.db")
    _scan(db, root)
    samples = _samples(db)
    assert len(samples) == len(names)
    for id_, absolute, rel, key in samples:
        _every_entry_point(db, absolute, id_)
        _every_entry_point(db, rel, id_)
        _every_entry_point(db, b"./" + rel, id_, json_key=key)


def test_stand_in_copied_from_file_path_names_its_sample(tmp_path: Path) -> None:
    root = tmp_path / "images"
    make_png(Path(os.fsdecode(os.fsencode(root) + b"/caf\xe9.png")))
    _scan(where(tmp_path / "c.db"), root)
    ((id_, _, _, key),) = _samples(where(tmp_path / "c.db"))
    assert key == "caf\\xe9.png"
    with Catalog(where(tmp_path / "c.db")) as catalog:
        assert resolve_paths(catalog, [key.encode()]) == [id_]
        assert resolve_sample(catalog, key) == id_
        # the seeded-sample key hashes the stand-in, the same bytes on either backend
        ((stored,),) = catalog.read("SELECT path_hash FROM image_metadata WHERE id = :id", {"id": id_})
    assert stored == path_hash(key)


def test_a_relative_path_under_two_roots(tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    make_png(first / "cat" / "1.png")
    make_png(second / "cat" / "1.png")
    _scan(where(tmp_path / "c.db"), first, second)
    with Catalog(where(tmp_path / "c.db")) as catalog:
        assert resolve_paths(catalog, [b"cat/1.png", b"cat/2.png"]) == [AMBIGUOUS, UNKNOWN]
        with pytest.raises(InputError, match="under several roots"):
            resolve_sample(catalog, "cat/1.png")
        with pytest.raises(InputError, match="matches files under several roots"):
            _resolve_paths(catalog, ["cat/1.png"], Path("v.jsonl"))
        # mark documents this: a relative path is matched under every root
        assert mark_samples(catalog, [b"cat/1.png"], processed=True, by="path").matched == 2
        absolute = os.fsencode(second / "cat" / "1.png")
        assert resolve_paths(catalog, [absolute]) == [2]


def test_absolute_path_under_no_root(tmp_path: Path) -> None:
    make_png(tmp_path / "images" / "1.png")
    _scan(where(tmp_path / "c.db"), tmp_path / "images")
    with Catalog(where(tmp_path / "c.db")) as catalog:
        assert resolve_paths(catalog, [b"/nowhere/1.png"]) == [UNKNOWN]
        with pytest.raises(InputError, match="is under no scanned root"):
            _resolve_paths(catalog, ["/nowhere/1.png"], Path("v.jsonl"))
        with pytest.raises(InputError, match="is not in the catalog"):
            resolve_sample(catalog, "/nowhere/1.png")
        assert mark_samples(catalog, [b"/nowhere/1.png"], processed=True, by="path").unknown == 1
