"""A rescan's fast path (dlindex.scan.quick: GNU find's lines against the catalog's) gives the
same results as the walk: the same summary, the same rows, on trees made to trip it up."""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import stat
import sys
from collections.abc import Iterator
from contextlib import closing, suppress
from pathlib import Path
from typing import Any

import pytest

from dlindex import ScanOptions
from dlindex.scan import quick
from dlindex.scan import run as scan_run

from .conftest import make_png, scan

pytestmark = pytest.mark.skipif(quick.gnu_find() is None, reason="GNU find is not installed")

_VOLATILE = ("scan_id", "seconds", "files_per_s")


def copy(source: Path, target: Path) -> None:
    """A copy of a catalog, its write-ahead log included."""
    for path in (target, target.with_name(target.name + "-wal"), target.with_name(target.name + "-shm")):
        path.unlink(missing_ok=True)
    with closing(sqlite3.connect(source)) as read, closing(sqlite3.connect(target)) as written:
        read.backup(written)


def dump(db: Path) -> list[tuple[Any, ...]]:
    """Every row of the catalog's image_metadata and labels, but the timestamps."""
    with closing(sqlite3.connect(db)) as conn:
        columns = [c[1] for c in conn.execute("PRAGMA table_info(image_metadata)")]
        kept = ", ".join(c for c in columns if c not in ("created_at", "updated_at"))
        found = conn.execute(f"SELECT {kept} FROM image_metadata ORDER BY id").fetchall()
        return found + conn.execute("SELECT * FROM labels ORDER BY id").fetchall()


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[Path]:
    """Class folders of plain files beside folders of odd names, links, FIFOs, sockets, devices."""
    root = tmp_path / "images"
    for label in ("dog", "cow"):
        for i in range(4):
            make_png(root / label / f"{i:03d}.png", color=(i, 0, 0))
    make_png(root / "cow" / "deeper" / "still" / "x.PNG")
    cat = os.fsencode(root / "cat")
    odd = [b"new\nline.png", b"bad\xffname.png", b"back\\slash.png", b" space .PNG", b"-dash.jpg",
           b"glob*?[x].png", b"a.tar.png", b"UPPER.JPG", b"tab\tname.jpeg"]  # fmt: skip
    for name in odd:
        make_png(Path(os.fsdecode(os.path.join(cat, name))))
    make_png(Path(os.fsdecode(os.path.join(os.fsencode(root), b"\xfe\xfd folder", b"a.png"))))
    make_png(root / "new\nfolder" / "a.png")
    make_png(root / "odd" / "a.png")
    make_png(root / "odd" / ".hidden.png")
    make_png(root / "odd" / ".cache" / "b.png")
    (root / "odd" / "notes.txt").write_text("hi")
    os.mkfifo(root / "odd" / "pipe.png")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "odd" / "sock.png"))
    make_png(root / "links" / "a.png")
    (root / "links" / "loop").symlink_to(root / "links")
    (root / "links" / "same.png").symlink_to(root / "links" / "a.png")
    (root / "links" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    (root / "links" / "outside").symlink_to(tmp_path)
    make_png(root / "dev" / "a.png")
    if os.geteuid() == 0:
        os.mknod(root / "dev" / "null.png", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    (root / "empty").mkdir()
    make_png(root / "top.png")
    try:
        yield root
    finally:
        sock.close()


class Twins:
    """Rescans a catalog both ways, from copies of it, and checks they agree."""

    def __init__(self, db: Path, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.db, self.root, self.tmp, self.monkeypatch = db, root, tmp_path, monkeypatch
        self.quick: list[quick.Quick | None] = []

    def rescan(self, **fields: Any) -> dict[str, Any]:
        """Rescan with the fast path and without; the same summary and rows, or the test fails."""
        fast, walked = self.tmp / "fast.db", self.tmp / "walked.db"
        for target in (fast, walked):
            copy(self.db, target)
        options = ScanOptions(**{"workers": 1, **fields})
        with self.monkeypatch.context() as patch:
            patch.setattr(scan_run, "skip_unchanged", self._recording)
            by_find = scan(fast, self.root, options).as_dict()
        with self.monkeypatch.context() as patch:
            patch.setattr(quick, "gnu_find", lambda: None)
            by_walk = scan(walked, self.root, options).as_dict()
        for key in _VOLATILE:
            by_find.pop(key), by_walk.pop(key)
        assert by_find == by_walk
        assert dump(fast) == dump(walked)
        copy(fast, self.db)
        return by_find

    def _recording(self, *args: Any) -> quick.Quick | None:
        found = quick.skip_unchanged(*args)
        self.quick.append(found)
        return found

    def counted(self) -> int:
        """Files the last fast rescan counted without walking them."""
        last = self.quick[-1]
        return 0 if last is None else last.files


def test_a_rescan_agrees_with_the_walk_on_a_hostile_tree(
    hostile: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "catalog.db"
    first = scan(db, hostile)
    assert first.new > 20
    twins = Twins(db, hostile, tmp_path, monkeypatch)

    summary = twins.rescan()
    assert summary["unchanged"] == first.new
    # dog, cow, dev (a device is counted by find), "new\nfolder"; not cat (odd names), odd (hidden
    # entries), links (followed), the folder named in bytes that are not UTF-8
    assert twins.counted() == 11
    assert summary["skipped_by_reason"] == first.skipped_by_reason

    dog, cow = hostile / "dog", hostile / "cow"
    os.utime(dog / "000.png", ns=(1, 2))  # another mtime
    make_png(cow / "001.png", (20, 20))  # another size
    data, before = (dog / "002.png").read_bytes(), (dog / "002.png").stat()
    (dog / "002.png").unlink()
    (dog / "002.png").write_bytes(data)  # another inode, the same size and mtime
    os.utime(dog / "002.png", ns=(before.st_atime_ns, before.st_mtime_ns))
    summary = twins.rescan()
    assert (summary["changed"], summary["reread"]) == (2, 1)
    assert twins.counted() == 2  # dev and "new\nfolder" only

    (dog / "003.png").unlink()
    make_png(cow / "new.png")
    (cow / "readme.md").write_text("not an image")
    make_png(dog / ".secret.png")
    summary = twins.rescan()
    assert (summary["new"], summary["missing"]) == (1, 1)
    summary = twins.rescan()  # the same again: now unchanged, with the skips counted by find
    assert summary["skipped_by_reason"]["not_image"] == 2 and twins.counted() == 8

    for fields in ({"follow_symlinks": False}, {"hidden": True}, {"extensions": ("png",)}, {"max_pixels": 100}):
        twins.rescan(**fields)
    twins.rescan()

    os.rename(cow, hostile / "calf")  # another label: new rows, the old ones missing
    twins.rescan()
    assert twins.rescan()["unchanged"] > 0 and twins.counted() > 0


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE image_metadata SET processing_status = 'failed', error = 'loader: gone' WHERE file_path = 'dog/001.png'",
        "UPDATE image_metadata SET label_id = (SELECT id FROM labels WHERE name = 'cat') WHERE file_path = 'dog/001.png'",
        "UPDATE image_metadata SET split = 'train' WHERE file_path = 'dog/001.png'",
        "UPDATE image_metadata SET inode = NULL, ctime_ns = NULL WHERE file_path = 'dog/001.png'",
        "UPDATE image_metadata SET mtime_ns = -1500000000 WHERE file_path = 'dog/001.png'",
        "UPDATE image_metadata SET status = 'missing' WHERE file_path = 'dog/001.png'",
        "UPDATE image_metadata SET file_path = 'dog/zzz.png' WHERE file_path = 'dog/001.png'",
        "DELETE FROM image_metadata WHERE file_path = 'dog/001.png'",
        "UPDATE image_metadata SET pixel_limit = 5 WHERE file_path = 'dog/001.png'",
    ],
)
def test_rows_the_walk_would_not_pass_are_not_passed(
    hostile: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sql: str
) -> None:
    db = tmp_path / "catalog.db"
    scan(db, hostile)
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(sql)
    twins = Twins(db, hostile, tmp_path, monkeypatch)
    twins.rescan()
    assert twins.counted() == 7  # cow, dev, "new\nfolder": dog is walked


def test_a_folder_printing_more_than_the_limit_is_walked(
    hostile: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "catalog.db"
    scan(db, hostile)
    for i in range(40):
        make_png(hostile / "big" / f"{i:03d}.png")
    scan(db, hostile)
    monkeypatch.setattr(quick, "_READ", 64)
    monkeypatch.setattr(quick, "_SEGMENT_LIMIT", 1024)  # big/ prints ~3 KB: walked, the others not
    twins = Twins(db, hostile, tmp_path, monkeypatch)
    twins.rescan()
    assert twins.counted() == 11


def test_a_message_from_find_sends_every_unit_to_the_walk(
    hostile: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An unreadable folder, a file gone meanwhile: find says so on stderr (root reads every
    # folder, so a wrapper says it here); the walk then reports what it finds itself.
    db = tmp_path / "catalog.db"
    scan(db, hostile)
    wrapper = tmp_path / "find"
    real = quick.gnu_find()
    wrapper.write_text(f'#!/bin/sh\n{real} "$@"\necho "find: \'./dog\': Permission denied" >&2\nexit 1\n')
    wrapper.chmod(0o755)
    monkeypatch.setattr(quick, "gnu_find", lambda: str(wrapper))
    twins = Twins(db, hostile, tmp_path, monkeypatch)
    twins.rescan()
    assert twins.quick == [None]


@pytest.mark.skipif(os.geteuid() == 0, reason="root lists every folder")
def test_an_unreadable_folder_is_reported_as_by_the_walk(
    hostile: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "catalog.db"
    scan(db, hostile)
    (hostile / "dog").chmod(0)
    try:
        twins = Twins(db, hostile, tmp_path, monkeypatch)
        assert twins.rescan()["errors"] == 1
        assert twins.quick == [None]
    finally:
        (hostile / "dog").chmod(0o755)


def test_a_find_that_is_not_gnu_find_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "find").write_text("#!/bin/sh\necho 'find (busybox) 1.36'\n")
    (tmp_path / "find").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert quick.gnu_find.__wrapped__() is None
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))  # no find at all (a venv's bin)
    if shutil.which("find") is None:
        assert quick.gnu_find.__wrapped__() is None


def _find_children() -> list[int]:
    """This process's child processes that are find."""
    found = []
    for task in Path("/proc/self/task").iterdir():
        for pid in (task / "children").read_text().split():
            with suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "find":
                    found.append(int(pid))
    return found


def test_a_rescan_starts_find_before_its_first_write_and_a_first_scan_not_at_all(
    hostile: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """find runs while the first write waits for the catalog's check (dlindex.catalog.sqlite.check_ahead)."""
    from dlindex.catalog.sqlite.backend import SqliteBackend

    events: list[str] = []
    check = SqliteBackend.check_before_first_write

    class Finds(quick._Finds):
        def __init__(self, *args: Any) -> None:
            events.append("find")
            super().__init__(*args)

    def checked(self: SqliteBackend, conn: Any) -> list[int]:
        events.append("check")
        return check(self, conn)

    monkeypatch.setattr(quick, "_Finds", Finds)
    monkeypatch.setattr(SqliteBackend, "check_before_first_write", checked)
    db = tmp_path / "catalog.db"
    scan(db, hostile)
    assert events == ["check"]  # a first scan: every file is new, no find
    events.clear()
    assert scan(db, hostile).unchanged > 0
    assert events == ["find", "check"]


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads children from /proc")
def test_a_rescan_refused_at_its_first_write_leaves_no_find_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlindex.catalog.sqlite.backend import SqliteBackend
    from dlindex.errors import DamagedCatalogError

    root = tmp_path / "images"
    for i in range(300):
        make_png(root / f"c{i % 30}" / f"{i}.png")
    db = tmp_path / "catalog.db"
    scan(db, root)
    started: list[quick._Finds] = []

    class Finds(quick._Finds):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            started.append(self)

    def refused(self: SqliteBackend, conn: Any) -> list[int]:
        raise DamagedCatalogError(f"catalog {self.path} is damaged (a test)")

    monkeypatch.setattr(quick, "_Finds", Finds)
    monkeypatch.setattr(SqliteBackend, "check_before_first_write", refused)
    rows = dump(db)
    with pytest.raises(DamagedCatalogError):
        scan(db, root)
    assert started and all(process.returncode is not None for process in started[0].processes)
    assert not _find_children()
    assert dump(db) == rows
