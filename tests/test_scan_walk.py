"""Keys are lossless: two different names never share a file_path, on any rescan."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from dlindex import Catalog, ScanOptions, scan_tree
from dlindex.catalog.paths import display_name

from .conftest import make_png, rows, scan


def ids(db: Path) -> dict[tuple[str, bytes | None], int]:
    found = rows(db, "SELECT file_path, file_path_bytes, id FROM image_metadata WHERE status != 'missing'")
    return {(str(p), b): int(i) for p, b, i in found}  # type: ignore[misc,call-overload]


LOOKALIKES = [
    b"\xff.png",  # not UTF-8: its stand-in spells the next name
    b"\\xff.png",  # UTF-8, literally backslash-x-f-f
    b"\\x5cxff.png",  # spells the stand-in of the one above
    b"\xff\\xff.png",  # backslashreplace alone gave these two the same stand-in
    b"\\xff\xff.png",
    b"plain\\name.png",  # a backslash that spells nothing stays as it is
]


def test_lookalike_names_are_all_catalogued_and_keep_their_ids(tmp_path: Path, db_path: Path) -> None:
    root = tmp_path / "images"
    for folder in (b"cat", b"\xff", b"\\xff"):  # lookalike folders too
        for name in LOOKALIKES:
            path = os.path.join(os.fsencode(root), folder, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            make_png(Path(os.fsdecode(path)), color=(len(name), len(folder), 0))
    summary = scan(db_path, root, workers=2)
    total = 3 * len(LOOKALIKES)
    assert (summary.new, summary.errors) == (total, 0)
    first = ids(db_path)
    assert len(first) == total
    assert ("cat/plain\\name.png", None) in first
    assert ("cat/\\xff.png", b"cat/\xff.png") in first  # the non-UTF-8 name keeps its familiar stand-in
    assert ("cat/\\x5cxff.png", b"cat/\\xff.png") in first  # the literal that spelt it is escaped
    # each row's bytes open its own file
    root_path = os.fsencode(str(rows(db_path, "SELECT path FROM roots")[0][0]))
    for (text, raw), _ in first.items():
        with open(os.path.join(root_path, raw or text.encode()), "rb") as f:
            assert f.read(4) == b"\x89PNG"
    for _ in range(2):
        again = scan(db_path, root, workers=2)
        assert (again.unchanged, again.new, again.missing, again.changed) == (total, 0, 0, 0)
        assert ids(db_path) == first
    os.remove(os.path.join(os.fsencode(root), b"cat", b"\xff.png"))
    gone = scan(db_path, root, workers=2)
    assert (gone.missing, gone.unchanged) == (1, total - 1)


names = st.binary(min_size=1, max_size=12).filter(lambda b: b"/" not in b and b"\x00" not in b)
lookalike_names = st.lists(
    st.sampled_from([b"\\", b"x", b"5", b"c", b"f", b"\xff", b"\xe9", b"a", b"\\x", b"\\x5c", b"\\xff"]),
    min_size=1, max_size=6,
).map(b"".join)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(names, lookalike_names), min_size=2, max_size=8, unique=True))
def test_display_names_are_one_to_one_and_slash_free(raw: list[bytes]) -> None:
    keys = [display_name(name) for name in raw]
    assert len({text for text, _ in keys}) == len(raw)  # no two names share a key
    for name, (text, lossless) in zip(raw, keys, strict=False):
        assert "/" not in text
        assert lossless == (text.encode("utf-8", "surrogatepass") == name)
        text.encode("utf-8")  # always storable as SQLite TEXT


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(names, lookalike_names), min_size=1, max_size=4))
def test_a_path_is_keyed_one_name_at_a_time(parts: list[bytes]) -> None:
    text, lossless = display_name(b"/".join(parts))
    each = [display_name(part) for part in parts]
    assert (text, lossless) == ("/".join(t for t, _ in each), all(ok for _, ok in each))


@settings(max_examples=15, deadline=None)
@given(st.lists(st.one_of(names, lookalike_names).filter(lambda b: b not in (b".", b"..")), min_size=1, max_size=6,
                unique=True))  # fmt: skip
def test_any_set_of_names_is_catalogued_once_each_with_stable_ids(raw: list[bytes]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(os.fsencode(tmp), b"images")
        for i, name in enumerate(raw):  # each name as a file and as a class folder
            for path in (os.path.join(root, b"c", name + b".png"), os.path.join(root, name, b"x.png")):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(b"not an image %d" % i)
        db = Path(tmp) / "catalog.db"
        with Catalog(db, create=True) as catalog:
            first = scan_tree(catalog, os.fsdecode(root), ScanOptions(workers=1))
            again = scan_tree(catalog, os.fsdecode(root), ScanOptions(workers=1))
        hidden = sum(name.startswith(b".") for name in raw)
        assert (first.new, first.errors) == (2 * len(raw) - 2 * hidden, 0)
        assert (again.unchanged, again.new, again.missing) == (first.new, 0, 0)
        assert len(ids(db)) == first.new


def test_mark_finds_lookalike_rows_by_key_and_by_real_path(tmp_path: Path, db_path: Path) -> None:
    from dlindex import mark_samples

    root = tmp_path / "images"
    for name in LOOKALIKES:
        make_png(Path(os.fsdecode(os.path.join(os.fsencode(root), b"cat", name))))
    scan(db_path, root, workers=2)
    found = rows(db_path, "SELECT file_path, file_path_bytes FROM image_metadata")
    real_root = os.fsencode(str(rows(db_path, "SELECT path FROM roots")[0][0]))
    by_key = [json.dumps({"file_path": str(text)}) for text, _ in found]
    by_path = [os.path.join(real_root, raw or str(text).encode()) for text, raw in found]  # type: ignore[arg-type]
    with Catalog(db_path) as catalog:
        assert mark_samples(catalog, by_key, processed=True).matched == len(LOOKALIKES)
        assert mark_samples(catalog, by_path, processed=False, by="path").matched == len(LOOKALIKES)


def test_a_sample_named_by_its_real_name_or_by_its_stand_in(tmp_path: Path, db_path: Path) -> None:
    from dlindex.features.samples import resolve_sample

    root = tmp_path / "images"
    for name in LOOKALIKES:
        make_png(Path(os.fsdecode(os.path.join(os.fsencode(root), b"cat", name))))
    scan(db_path, root, workers=2)
    found = ids(db_path)
    with Catalog(db_path) as catalog:
        # the real name wins: a file literally named \xff.png exists
        assert resolve_sample(catalog, "cat/\\xff.png") == found[("cat/\\x5cxff.png", b"cat/\\xff.png")]
        # a stand-in that is no real name is taken as the key it is (copied from file_path)
        assert (
            resolve_sample(catalog, "cat/\\xff\\x5cxff.png") == found[("cat/\\xff\\x5cxff.png", b"cat/\xff\\xff.png")]
        )
