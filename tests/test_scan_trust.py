"""What a rescan believes: a replacement of the same size and mtime is read again, a re-read
file that is the same is not called changed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import xxhash

from .backends import ON_BOTH_BACKENDS, raw
from .conftest import make_png, rows, scan

pytestmark = ON_BOTH_BACKENDS


def row(db: Path, path: str) -> tuple[object, ...]:
    found = rows(db, "SELECT id, xxh3_128, processed, status, inode FROM image_metadata WHERE file_path = ?", (path,))
    return tuple(found[0])


def same_size_other_bytes(source: Path, target: Path) -> bytes:
    """A copy of ``source`` at ``target`` with one byte of its pixel data changed."""
    data = bytearray(source.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(data)
    return bytes(data)


def replace_keeping_mtime(path: Path, data_from: Path, how: str) -> None:
    """Put ``data_from``'s bytes at ``path`` as cp -p (in place) or rsync -a / tar x (a new file) do."""
    st = path.stat()
    os.utime(data_from, ns=(st.st_atime_ns, st.st_mtime_ns))
    if how == "cp -p":
        subprocess.run(["cp", "-p", str(data_from), str(path)], check=True)  # same inode, new ctime
    else:
        staged = path.with_name(".staged")
        shutil.copy2(data_from, staged)  # copy2 keeps the mtime, like rsync -a
        os.replace(staged, path)  # a new inode
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


@pytest.mark.parametrize("how", ["cp -p", "rename"])
def test_a_same_size_replacement_keeping_the_mtime_is_seen(
    image_tree: Path, db_path: Path, tmp_path: Path, how: str
) -> None:
    scan(db_path, image_tree)
    with raw(db_path) as conn:
        conn.execute("UPDATE image_metadata SET processed = 1")
    target = image_tree / "cat" / "001.png"
    before = row(db_path, "cat/001.png")
    new = same_size_other_bytes(target, tmp_path / "new.png")
    replace_keeping_mtime(target, tmp_path / "new.png", how)
    summary = scan(db_path, image_tree)
    assert (summary.changed, summary.reread, summary.unchanged) == (1, 0, 6)
    after = row(db_path, "cat/001.png")
    assert after[0] == before[0]  # the same id
    assert after[1] == xxhash.xxh3_128_hexdigest(new) != before[1]
    assert after[2] == 0, "new content resets processed"
    assert row(db_path, "cat/000.png")[2] == 1
    assert scan(db_path, image_tree).unchanged == 7  # the new identity is recorded: read once


def test_verify_decodes_a_same_size_replacement(image_tree: Path, db_path: Path, tmp_path: Path) -> None:
    scan(db_path, image_tree)
    target = image_tree / "dog" / "000.png"
    size = target.stat().st_size
    (tmp_path / "bad.png").write_bytes(target.read_bytes()[:64] + b"\0" * (size - 64))  # pixels gone
    replace_keeping_mtime(target, tmp_path / "bad.png", "cp -p")
    summary = scan(db_path, image_tree, verify=True)
    assert (summary.changed, summary.corrupt) == (1, 1)
    assert row(db_path, "dog/000.png")[3] == "corrupt"


def test_a_replacement_with_the_same_bytes_is_a_re_read(image_tree: Path, db_path: Path, tmp_path: Path) -> None:
    scan(db_path, image_tree)
    with raw(db_path) as conn:
        conn.execute("UPDATE image_metadata SET processed = 1")
    target = image_tree / "cat" / "002.png"
    shutil.copy2(target, tmp_path / "same.png")
    replace_keeping_mtime(target, tmp_path / "same.png", "rename")  # a restore from a backup
    summary = scan(db_path, image_tree)
    assert (summary.changed, summary.reread, summary.unchanged) == (0, 1, 6)
    assert row(db_path, "cat/002.png")[2] == 1  # nothing to redo
    assert row(db_path, "cat/002.png")[4] == target.stat().st_ino


def test_force_calls_only_real_changes_changed(image_tree: Path, db_path: Path) -> None:
    scan(db_path, image_tree)
    make_png(image_tree / "cat" / "000.png", (30, 30), (9, 9, 9))
    forced = scan(db_path, image_tree, force=True)
    assert (forced.seen, forced.changed, forced.reread, forced.unchanged) == (7, 1, 6, 0)


def test_rows_without_an_identity_get_it_without_a_read(image_tree: Path, db_path: Path, tmp_path: Path) -> None:
    """Rows of a catalog made before schema 15 have no inode: the next scan records it from
    its lstat (no read), and from then on a replacement is seen."""
    scan(db_path, image_tree)
    with raw(db_path) as conn:
        conn.execute("UPDATE image_metadata SET inode = NULL, ctime_ns = NULL")
    first = scan(db_path, image_tree)
    assert (first.unchanged, first.changed, first.reread) == (7, 0, 0)
    assert rows(db_path, "SELECT count(*) FROM image_metadata WHERE inode IS NULL OR ctime_ns IS NULL") == [(0,)]
    target = image_tree / "dog" / "001.png"
    same_size_other_bytes(target, tmp_path / "new.png")
    replace_keeping_mtime(target, tmp_path / "new.png", "rename")
    assert scan(db_path, image_tree).changed == 1


def _high_inode(real: Any) -> Any:
    """os.fstat or os.lstat as a file system with 64-bit file ids reports them (NTFS over SMB:
    the sequence number in the top bits; btrfs, overlayfs xino): st_ino at or above 2**63."""

    def stat_high(*args: Any, **kwargs: Any) -> os.stat_result:
        st = real(*args, **kwargs)
        extra = {name: getattr(st, name) for name in dir(st) if name.startswith("st_") and name not in _SEQUENCE}
        return os.stat_result((st[0], st.st_ino | 1 << 63, *tuple(st)[2:10]), extra)

    return stat_high


_SEQUENCE = ("st_mode", "st_ino", "st_dev", "st_nlink", "st_uid", "st_gid", "st_size")


def test_inodes_past_the_signed_64_bit_range_are_kept(
    image_tree: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """st_ino is unsigned 64-bit; the catalog's INTEGER (BIGINT) is signed: an inode at or above
    2**63 is stored as its two's complement and compared so, never an overflow."""
    monkeypatch.setattr(os, "fstat", _high_inode(os.fstat))
    monkeypatch.setattr(os, "lstat", _high_inode(os.lstat))
    first = scan(db_path, image_tree)
    assert first.new == 7
    assert all(int(r[0]) < 0 for r in rows(db_path, "SELECT inode FROM image_metadata"))
    again = scan(db_path, image_tree)
    assert (again.unchanged, again.changed, again.reread) == (7, 0, 0)


def test_only_the_loaders_own_prefix_makes_a_rescan_clear_a_failure(image_tree: Path, db_path: Path) -> None:
    """A rescan clears the failures the training loader recorded (``loader: ``, exactly, as
    PostgreSQL's LIKE compares it), never a user's verdict that merely reads alike."""
    from dlindex import Catalog
    from dlindex.query.mark import mark_samples

    scan(db_path, image_tree)
    ((sample,),) = rows(db_path, "SELECT id FROM image_metadata WHERE file_path = ?", ("cat/000.png",))
    with Catalog(db_path) as catalog:
        mark_samples(catalog, [str(sample)], processing_status="failed", error="LOADER: crops badly")
    again = scan(db_path, image_tree)
    assert (again.unchanged, again.reread) == (7, 0)
    assert rows(db_path, "SELECT processing_status, error FROM image_metadata WHERE id = ?", (sample,)) == [
        ("failed", "LOADER: crops badly")
    ]
