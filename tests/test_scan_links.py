"""Symbolic links are followed by default, as ImageFolder does; each file is catalogued once."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from dlindex import ScanOptions
from dlindex.scan.listing import SKIP_REASONS

from .backends import ON_BOTH_BACKENDS, where
from .conftest import make_png, rows, scan

pytestmark = ON_BOTH_BACKENDS

PARALLEL = ScanOptions(workers=2)


def catalogued(db: Path) -> dict[str, tuple[int, str, str]]:
    found = rows(
        db,
        "SELECT file_path, image_metadata.id, labels.name, status FROM image_metadata "
        "JOIN labels ON labels.id = label_id",
    )
    return {str(r[0]): (int(r[1]), str(r[2]), str(r[3])) for r in found}  # type: ignore[call-overload]


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    """Class folders kept outside the dataset root, as a shared store would."""
    store = tmp_path / "store"
    for label in ("bird", "fish"):
        for i in range(3):
            make_png(store / label / f"{i}.png", color=(i, 9, 9))
    return store


def test_symlinked_class_folders_are_catalogued_under_the_link(image_tree: Path, storage: Path, db_path: Path) -> None:
    (image_tree / "bird").symlink_to(storage / "bird")
    (image_tree / "fish").symlink_to(storage / "fish")
    summary = scan(db_path, image_tree, workers=2)
    found = catalogued(db_path)
    assert {k: v[1] for k, v in found.items() if k.startswith(("bird/", "fish/"))} == {
        "bird/0.png": "bird", "bird/1.png": "bird", "bird/2.png": "bird",
        "fish/0.png": "fish", "fish/1.png": "fish", "fish/2.png": "fish",
    }  # fmt: skip
    assert (summary.new, summary.skipped) == (13, 0)
    again = scan(db_path, image_tree, workers=2)
    assert (again.unchanged, again.new, again.missing, again.skipped) == (13, 0, 0, 0)
    assert catalogued(db_path) == found  # same ids


def test_two_links_to_one_folder_catalogue_it_once_under_the_first_path(
    image_tree: Path, storage: Path, db_path: Path
) -> None:
    # Different first-level folders: different units, walked by different workers.
    (image_tree / "bird").symlink_to(storage / "bird")
    (image_tree / "zz-bird-again").symlink_to(storage / "bird")
    (image_tree / "cat" / "bird.png").symlink_to(storage / "fish" / "0.png")
    (image_tree / "dog" / "bird.png").symlink_to(storage / "fish" / "0.png")
    summary = scan(db_path, image_tree, workers=2)
    found = catalogued(db_path)
    assert not any(k.startswith("zz-bird-again/") for k in found)
    assert "cat/bird.png" in found and "dog/bird.png" not in found
    assert (summary.seen, summary.skipped_by_reason) == (11, {"duplicate": 4})
    for _ in range(2):  # stable: same choice, same ids, nothing counted missing again
        again = scan(db_path, image_tree, workers=2)
        assert (again.unchanged, again.new, again.missing, again.skipped_by_reason) == (11, 0, 0, {"duplicate": 4})
        assert catalogued(db_path) == found


def test_a_duplicate_that_becomes_first_takes_over(image_tree: Path, storage: Path, db_path: Path) -> None:
    (image_tree / "m-bird").symlink_to(storage / "bird")
    scan(db_path, image_tree, workers=2)
    (image_tree / "a-bird").symlink_to(storage / "bird")
    summary = scan(db_path, image_tree, workers=2)
    assert (summary.new, summary.missing, summary.skipped_by_reason) == (3, 3, {"duplicate": 3})
    found = catalogued(db_path)
    assert {k for k, v in found.items() if v[2] == "missing"} == {"m-bird/0.png", "m-bird/1.png", "m-bird/2.png"}


def test_links_inside_root_keep_the_real_path(image_tree: Path, db_path: Path) -> None:
    (image_tree / "kitten").symlink_to(image_tree / "cat")  # a second name for a class
    (image_tree / "dog" / "best.png").symlink_to(image_tree / "dog" / "001.png")
    (image_tree / "dog" / "deeper").mkdir()
    (image_tree / "dog" / "deeper" / "up").symlink_to(image_tree / "dog")  # a loop, two levels
    (image_tree / "dog" / "root").symlink_to(image_tree)
    summary = scan(db_path, image_tree, workers=2)
    assert sorted(catalogued(db_path)) == sorted(
        [f"{c}/{i:03d}.png" for c in ("cat", "dog") for i in range(3)] + ["dog/broken.jpg"]
    )
    assert summary.skipped_by_reason == {"loop": 2, "duplicate": 2}


def test_a_link_to_a_hidden_folder_inside_root_is_followed(image_tree: Path, db_path: Path) -> None:
    make_png(image_tree / ".store" / "owl" / "a.png")
    (image_tree / "owl").symlink_to(image_tree / ".store" / "owl")
    summary = scan(db_path, image_tree, workers=2)
    assert catalogued(db_path)["owl/a.png"][1] == "owl"
    assert summary.skipped_by_reason == {"hidden": 1}


def test_loops_through_folders_outside_root_end(image_tree: Path, tmp_path: Path, db_path: Path) -> None:
    outer = tmp_path / "outer"
    make_png(outer / "a" / "x.png")
    (outer / "a" / "back").symlink_to(outer)  # outer/a/back -> outer: a loop outside ROOT
    (outer / "a" / "root").symlink_to(image_tree)  # back into ROOT: a loop too
    (image_tree / "owl").symlink_to(outer)
    summary = scan(db_path, image_tree, workers=2)
    assert "owl/a/x.png" in catalogued(db_path)
    assert summary.skipped_by_reason == {"loop": 2}


def test_no_follow_symlinks_counts_every_link(image_tree: Path, storage: Path, db_path: Path) -> None:
    (image_tree / "bird").symlink_to(storage / "bird")
    (image_tree / "cat" / "x.png").symlink_to(storage / "fish" / "1.png")
    summary = scan(db_path, image_tree, ScanOptions(workers=2, follow_symlinks=False))
    assert (summary.seen, summary.skipped_by_reason) == (7, {"symlink": 2})


def test_a_link_to_a_fifo_is_never_opened(image_tree: Path, tmp_path: Path, db_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    (image_tree / "cat" / "pipe.png").symlink_to(tmp_path / "pipe")
    assert scan(db_path, image_tree, workers=2).skipped_by_reason == {"fifo": 1}


def test_every_entry_without_a_row_is_counted_by_reason(image_tree: Path, tmp_path: Path, db_path: Path) -> None:
    cat = image_tree / "cat"
    make_png(cat / ".hidden.png")
    (image_tree / ".cache").mkdir()
    (cat / "notes.txt").write_text("hi")
    make_png(image_tree / "tmp" / "a.png")
    os.mkfifo(cat / "pipe.png")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(cat / "sock.png"))
    (cat / "gone.png").symlink_to(tmp_path / "nowhere.png")
    (cat / "loop").symlink_to(cat)
    (cat / "same.png").symlink_to(cat / "000.png")
    try:
        os.mknod(cat / "null.png", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        device = 1
    except PermissionError:
        device = 0  # not root: no device node to test with
    try:
        summary = scan(db_path, image_tree, ScanOptions(workers=2, exclude=("tmp",)))
    finally:
        sock.close()
    expected = {"hidden": 2, "excluded": 1, "not_image": 1, "broken_link": 1, "loop": 1, "duplicate": 1,
                "fifo": 1, "socket": 1, "device": device}  # fmt: skip
    assert summary.skipped_by_reason == {k: v for k, v in expected.items() if v}
    assert list(summary.skipped_by_reason) == [r for r in SKIP_REASONS if r in summary.skipped_by_reason]
    assert summary.skipped == sum(expected.values())
    assert summary.seen == 7


def test_unreadable_folder_and_file_are_counted(
    image_tree: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locked = image_tree / "locked"
    make_png(locked / "a.png")
    unreadable = image_tree / "cat" / "000.png"
    if os.geteuid() != 0:
        unreadable.chmod(0)
        locked.chmod(0)
    else:  # root reads everything: refuse as the kernel would, in this process and its forked workers
        real_scandir, real_open = os.scandir, os.open

        def scandir(path: Any = ".") -> Any:
            if os.fsencode(path).rstrip(b"/") == os.fsencode(locked):
                raise PermissionError(errno.EACCES, "Permission denied", path)
            return real_scandir(path)

        def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if not isinstance(path, int) and os.fsencode(path) == os.fsencode(unreadable):
                raise PermissionError(errno.EACCES, "Permission denied", path)
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "scandir", scandir)
        monkeypatch.setattr(os, "open", open_)
    try:
        summary = scan(db_path, image_tree, workers=2)
    finally:
        locked.chmod(0o755)
        unreadable.chmod(0o644)
    assert summary.skipped_by_reason == {"unreadable": 2}
    assert summary.errors == 2
    assert sorted(message for _, message in summary.error_samples) == [
        "cannot list folder: Permission denied",
        "cannot open: Permission denied",
    ]


def test_a_copy_of_a_tree_with_symlinked_classes_matches_the_original(tmp_path: Path, image_tree: Path) -> None:
    linked = tmp_path / "linked"
    linked.mkdir()
    for label in ("cat", "dog"):
        (linked / label).symlink_to(image_tree / label)
    shutil.copy(image_tree / "cat" / "000.png", linked / "top.png")
    a, b = where(tmp_path / "a.db"), where(tmp_path / "b.db")
    scan(a, image_tree, workers=2)
    scan(b, linked, workers=2)
    query = "SELECT file_path, labels.name, xxh3_128 FROM image_metadata JOIN labels ON labels.id = label_id"
    assert sorted(rows(b, query)) == sorted(rows(a, query) + [r for r in rows(b, query) if r[0] == "top.png"])


def test_the_docs_list_exactly_the_skip_reasons() -> None:
    page = (Path(__file__).parent.parent / "docs" / "commands" / "scan.md").read_text()
    table = page[page.index("| reason | entry |") : page.index("## Labels")]
    documented = [name for line in table.splitlines()[2:] if line.startswith("| `") for name in
                  line.split("|")[1].replace("`", "").replace(",", " ").split()]  # fmt: skip
    assert documented == list(SKIP_REASONS)


def test_cli_json_and_summary_show_the_reasons(runner: Any, image_tree: Path, storage: Path, db_path: Path) -> None:
    from dlindex.cli import app

    (image_tree / "bird").symlink_to(storage / "bird")
    (image_tree / "cat" / "notes.txt").write_text("hi")
    args = ["scan", str(image_tree), "--db", str(db_path), "--json"]
    result = runner.invoke(app, [*args, "--no-follow-symlinks"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["seen"], data["skipped"], data["skipped_by_reason"]) == (7, 2, {"not_image": 1, "symlink": 1})
    result = runner.invoke(app, args)
    data = json.loads(result.stdout)
    assert (data["new"], data["skipped"], data["skipped_by_reason"]) == (3, 1, {"not_image": 1})
    result = runner.invoke(app, args[:-1])
    assert "skipped: not_image 1" in result.stdout and result.stderr == ""


def test_a_changed_file_behind_a_link_is_probed_again_and_a_removed_first_path_hands_over(
    image_tree: Path, storage: Path, db_path: Path
) -> None:
    (image_tree / "a-bird").symlink_to(storage / "bird")
    (image_tree / "m-bird").symlink_to(storage / "bird")
    scan(db_path, image_tree, workers=2)
    before = catalogued(db_path)
    make_png(storage / "bird" / "0.png", size=(20, 20))
    changed = scan(db_path, image_tree, workers=2)
    assert (changed.changed, changed.unchanged) == (1, 9)
    assert catalogued(db_path)["a-bird/0.png"][0] == before["a-bird/0.png"][0]
    (image_tree / "a-bird").unlink()  # the second path, a duplicate so far, is now the first
    handed = scan(db_path, image_tree, workers=2)
    assert (handed.missing, handed.new, handed.changed, handed.skipped) == (3, 3, 0, 0)
    after = catalogued(db_path)
    assert all(after[f"a-bird/{i}.png"] == (before[f"a-bird/{i}.png"][0], "a-bird", "missing") for i in range(3))
    assert all(after[f"m-bird/{i}.png"][1:] == ("m-bird", "ok") for i in range(3))
