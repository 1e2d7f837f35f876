"""scan_tree: labels, incremental rescans, hostile names, links, special files, failures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dlindex import InputError, ScanOptions
from dlindex.scan import tasks as worker_module

from .backends import ON_BOTH_BACKENDS, raw, where
from .conftest import make_jpeg, make_png, rows, scan

pytestmark = ON_BOTH_BACKENDS

ONE = ScanOptions(workers=1)


def by_path(db: Path) -> dict[str, tuple[object, ...]]:
    found = rows(
        db,
        "SELECT file_path, image_metadata.id, labels.name, status, width, height, format, processed, "
        "xxh3_128, error FROM image_metadata LEFT JOIN labels ON labels.id = label_id",
    )
    return {r[0]: r[1:] for r in found}  # type: ignore[misc]


def test_first_scan_records_every_file(image_tree: Path, db_path: Path) -> None:
    summary = scan(db_path, image_tree)
    assert (summary.seen, summary.new, summary.corrupt, summary.errors) == (7, 7, 1, 0)
    found = by_path(db_path)
    assert sorted(found) == [
        "cat/000.png",
        "cat/001.png",
        "cat/002.png",
        "dog/000.png",
        "dog/001.png",
        "dog/002.png",
        "dog/broken.jpg",
    ]
    assert found["cat/001.png"][1:6] == ("cat", "ok", 17, 16, "PNG")
    assert found["dog/broken.jpg"][2] == "corrupt"
    assert "cannot identify" in str(found["dog/broken.jpg"][8])


def test_files_directly_under_root_have_no_class(image_tree: Path, db_path: Path) -> None:
    make_png(image_tree / "top.png")
    scan(db_path, image_tree)
    assert by_path(db_path)["top.png"][1] is None  # never a class "" that shifts the others


def test_nested_folders_take_the_first_level_label(image_tree: Path, db_path: Path) -> None:
    make_png(image_tree / "cat" / "indoor" / "sofa" / "x.png")
    scan(db_path, image_tree)
    assert by_path(db_path)["cat/indoor/sofa/x.png"][1] == "cat"


def test_rescan_of_unchanged_tree_changes_nothing(image_tree: Path, db_path: Path) -> None:
    scan(db_path, image_tree)
    before = by_path(db_path)
    summary = scan(db_path, image_tree)
    assert (summary.seen, summary.new, summary.changed, summary.unchanged, summary.missing) == (7, 0, 0, 7, 0)
    assert by_path(db_path) == before


def test_rescan_detects_new_changed_and_missing_with_stable_ids(image_tree: Path, db_path: Path) -> None:
    scan(db_path, image_tree)
    before = by_path(db_path)
    with raw(db_path) as conn:
        conn.execute("UPDATE image_metadata SET processed = 1, processing_status = 'completed'")
    make_png(image_tree / "cat" / "001.png", (50, 40), (1, 2, 3))  # new content
    (image_tree / "dog" / "002.png").unlink()
    make_png(image_tree / "dog" / "new.png")
    summary = scan(db_path, image_tree)
    assert (summary.new, summary.changed, summary.missing, summary.unchanged) == (1, 1, 1, 5)
    after = by_path(db_path)
    assert after["cat/001.png"][0] == before["cat/001.png"][0]  # same id
    assert after["cat/001.png"][3:5] == (50, 40)
    assert after["cat/001.png"][6] == 0, "new content resets processed"
    assert after["cat/000.png"][6] == 1, "unchanged rows keep their flags"
    assert after["dog/002.png"][2] == "missing"
    assert rows(db_path, "SELECT processing_status FROM image_metadata WHERE file_path = 'cat/001.png'") == [(None,)]


def test_touch_without_new_content_keeps_processed(image_tree: Path, db_path: Path) -> None:
    scan(db_path, image_tree)
    with raw(db_path) as conn:
        conn.execute("UPDATE image_metadata SET processed = 1")
    target = image_tree / "cat" / "000.png"
    os.utime(target, ns=(1, 1_000_000_000))
    summary = scan(db_path, image_tree)
    assert summary.changed == 1
    assert by_path(db_path)["cat/000.png"][6] == 1


def test_rows_written_by_a_racing_scan_are_updated_not_duplicated(
    image_tree: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New files go in with a plain INSERT; if another scan inserted the same key after our walk,
    the batch falls back to the upsert: ids and flags stay, nothing is duplicated or lost."""
    from dlindex.scan import diff as treediff

    scan(db_path, image_tree)
    before = by_path(db_path)
    with raw(db_path) as conn:
        conn.execute("UPDATE image_metadata SET processed = 1")
    # Make the walk blind to the existing rows, as if they were written after it looked.
    monkeypatch.setattr(treediff, "_ROWS_FROM", treediff._ROWS_FROM.replace("WHERE", "WHERE false AND"))
    monkeypatch.setattr(treediff, "_ROWS_BETWEEN", treediff._ROWS_BETWEEN.replace("WHERE", "WHERE false AND"))
    summary = scan(db_path, image_tree)
    assert summary.new == len(before)
    after = by_path(db_path)
    assert {k: v[0] for k, v in after.items()} == {k: v[0] for k, v in before.items()}  # same ids
    assert {v[6] for v in after.values()} == {1}  # same content: processed kept
    assert rows(db_path, "SELECT count(*) FROM image_metadata") == [(len(before),)]


def test_missing_file_that_returns_is_ok_again_with_same_id(image_tree: Path, db_path: Path) -> None:
    scan(db_path, image_tree)
    target = image_tree / "cat" / "000.png"
    data = target.read_bytes()
    original_id = by_path(db_path)["cat/000.png"][0]
    target.unlink()
    scan(db_path, image_tree)
    assert by_path(db_path)["cat/000.png"][2] == "missing"
    target.write_bytes(data)
    scan(db_path, image_tree)
    assert by_path(db_path)["cat/000.png"][:3] == (original_id, "cat", "ok")


def test_prune_deletes_missing_rows(image_tree: Path, db_path: Path) -> None:
    scan(db_path, image_tree)
    (image_tree / "cat" / "000.png").unlink()
    summary = scan(db_path, image_tree, ScanOptions(workers=1, prune=True))
    assert summary.pruned == 1
    assert "cat/000.png" not in by_path(db_path)


def test_vanished_folder_marks_its_files_missing(image_tree: Path, db_path: Path) -> None:
    scan(db_path, image_tree)
    for f in (image_tree / "cat").iterdir():
        f.unlink()
    (image_tree / "cat").rmdir()
    summary = scan(db_path, image_tree)
    assert summary.missing == 3
    assert {v[2] for k, v in by_path(db_path).items() if k.startswith("cat/")} == {"missing"}


def test_hostile_names_are_ordinary(image_tree: Path, db_path: Path) -> None:
    names = ["with space.png", "quote'\"s.png", "new\nline.png", "-leading-dash.png", "ünïcødé.png", "tab\t.png"]
    for name in names:
        make_png(image_tree / "cat" / name)
    scan(db_path, image_tree)
    found = by_path(db_path)
    for name in names:
        assert found[f"cat/{name}"][2] == "ok", name
    assert scan(db_path, image_tree).unchanged == 7 + len(names)


def test_non_utf8_names_are_stored_losslessly(tmp_path: Path, db_path: Path) -> None:
    root = tmp_path / "images"
    raw_dir = os.path.join(os.fsencode(root), b"caf\xe9")
    os.makedirs(raw_dir)
    raw_file = os.path.join(raw_dir, b"\xff\xfeimg.png")
    make_png(Path(os.fsdecode(raw_file)))
    make_png(root / "ok" / "plain.png")
    summary = scan(db_path, root)
    assert (summary.new, summary.errors) == (2, 0)
    ((display, raw, label),) = rows(
        db_path,
        "SELECT file_path, file_path_bytes, labels.name FROM image_metadata JOIN labels ON labels.id = label_id "
        "WHERE file_path_bytes IS NOT NULL",
    )
    assert raw == b"caf\xe9/\xff\xfeimg.png"
    assert display == "caf\\xe9/\\xff\\xfeimg.png"
    assert label == "caf\\xe9"
    (root_path,) = rows(db_path, "SELECT path FROM roots")[0]
    with open(os.path.join(os.fsencode(str(root_path)), raw), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert scan(db_path, root).unchanged == 2


def test_symlinks_are_followed_unless_told_not_to(image_tree: Path, db_path: Path, tmp_path: Path) -> None:
    outside = make_png(tmp_path / "elsewhere" / "out.png")
    (image_tree / "cat" / "link.png").symlink_to(outside)
    (image_tree / "cat" / "dangling.png").symlink_to(tmp_path / "nope.png")
    summary = scan(db_path, image_tree)
    assert "cat/link.png" in by_path(db_path)
    assert summary.skipped_by_reason == {"broken_link": 1}
    other = where(tmp_path / "other.db")
    summary = scan(other, image_tree, ScanOptions(workers=1, follow_symlinks=False))
    assert "cat/link.png" not in by_path(other)
    assert (summary.skipped, summary.skipped_by_reason) == (2, {"symlink": 2})


def test_symlink_loop_terminates_and_indexes_each_file_once(image_tree: Path, db_path: Path) -> None:
    (image_tree / "cat" / "loop").symlink_to(image_tree)
    (image_tree / "dog" / "again").symlink_to(image_tree / "dog")
    (image_tree / "dog" / "twin.png").symlink_to(image_tree / "dog" / "000.png")
    summary = scan(db_path, image_tree)
    assert (summary.seen, summary.skipped_by_reason) == (7, {"loop": 2, "duplicate": 1})
    assert len(by_path(db_path)) == 7
    assert not any("loop" in p or "again" in p or "twin" in p for p in by_path(db_path))


def test_broken_symlink_is_counted_not_an_error(image_tree: Path, db_path: Path, tmp_path: Path) -> None:
    (image_tree / "cat" / "dangling.png").symlink_to(tmp_path / "nope.png")
    (image_tree / "cat" / "self.png").symlink_to(image_tree / "cat" / "self.png")  # ELOOP
    summary = scan(db_path, image_tree)
    assert (summary.errors, summary.skipped_by_reason) == (0, {"broken_link": 2})


@pytest.mark.timeout(30)
def test_fifo_and_socket_with_image_names_are_skipped(image_tree: Path, db_path: Path) -> None:
    import socket

    os.mkfifo(image_tree / "cat" / "pipe.jpg")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(image_tree / "cat" / "sock.png"))
    try:
        summary = scan(db_path, image_tree)
    finally:
        sock.close()
    assert (summary.seen, summary.skipped_by_reason) == (7, {"fifo": 1, "socket": 1})


def test_hidden_ext_and_exclude_options(image_tree: Path, db_path: Path, tmp_path: Path) -> None:
    make_png(image_tree / ".cache" / "x.png")
    make_png(image_tree / "cat" / ".hidden.png")
    (image_tree / "cat" / "notes.txt").write_text("hi")
    make_png(image_tree / "tmp" / "scratch.png")
    summary = scan(db_path, image_tree, ScanOptions(workers=1, exclude=("tmp",)))
    assert summary.seen == 7
    other = where(tmp_path / "other.db")
    summary = scan(other, image_tree, ScanOptions(workers=1, hidden=True, extensions=("png",)))
    assert summary.seen == 9  # 6 PNGs + tmp/scratch.png + 2 hidden; no .jpg, no .txt
    assert ".cache/x.png" in by_path(other)


def test_labels_file_overrides_folder_labels(image_tree: Path, db_path: Path, tmp_path: Path) -> None:
    labels = tmp_path / "labels.csv"
    labels.write_text("path,label\ncat/000.png,tiger\n")
    summary = scan(db_path, image_tree, ScanOptions(workers=1, labels_file=labels))
    assert by_path(db_path)["cat/000.png"][1] == "tiger"
    assert by_path(db_path)["cat/001.png"][1] == "cat"
    labels.write_text("path,label\ncat/000.png,lion\n")
    summary = scan(db_path, image_tree, ScanOptions(workers=1, labels_file=labels))
    assert (summary.relabeled, summary.changed) == (1, 0)
    assert by_path(db_path)["cat/000.png"][1] == "lion"


def test_labels_file_paths_matching_no_image_are_reported(image_tree: Path, db_path: Path, tmp_path: Path) -> None:
    labels = tmp_path / "labels.csv"
    labels.write_text("path,label\ncat/000.png,tiger\ncat/000.PNG,x\n./dog/001.png,y\ndog/broken.jpg,z\nbird/9.png,w\n")
    summary = scan(db_path, image_tree, ScanOptions(workers=1, labels_file=labels))
    # dog/broken.jpg is in the catalog (status corrupt): its label applies; the others name nothing
    assert summary.unknown_label_paths == 3
    assert summary.unknown_label_examples == ("./dog/001.png", "bird/9.png", "cat/000.PNG")
    assert summary.as_dict()["unknown_label_examples"] == ["./dog/001.png", "bird/9.png", "cat/000.PNG"]
    labels.write_text("path,label\ncat/000.png,tiger\n")
    assert scan(db_path, image_tree, ScanOptions(workers=1, labels_file=labels)).unknown_label_paths == 0


def test_bad_labels_file_is_an_input_error(image_tree: Path, db_path: Path, tmp_path: Path) -> None:
    labels = tmp_path / "labels.csv"
    labels.write_text("file,class\na,b\n")
    with pytest.raises(InputError, match="path,label"):
        scan(db_path, image_tree, ScanOptions(workers=1, labels_file=labels))


def test_bad_root_is_an_input_error(tmp_path: Path, db_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        scan(db_path, tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="not a folder"):
        scan(db_path, tmp_path / "file")


def test_unreadable_and_vanishing_files_are_counted_not_fatal(
    image_tree: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def flaky_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        name = os.fsencode(path)
        if name.endswith(b"cat/001.png"):
            raise PermissionError(13, "Permission denied")
        if name.endswith(b"dog/001.png"):
            raise FileNotFoundError(2, "No such file or directory")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", flaky_open)  # forked workers inherit the patch
    summary = scan(db_path, image_tree)
    assert (summary.errors, summary.new) == (2, 5)
    messages = dict(summary.error_samples)
    assert "Permission denied" in messages["cat/001.png"]


def test_unreadable_folder_does_not_mark_its_files_missing(
    image_tree: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scan(db_path, image_tree)
    real_scandir = os.scandir

    def failing_scandir(path):  # type: ignore[no-untyped-def]
        if os.fsencode(path).endswith(b"/cat"):
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", failing_scandir)
    summary = scan(db_path, image_tree)
    assert (summary.errors, summary.missing) == (1, 0)
    assert by_path(db_path)["cat/000.png"][2] == "ok"


def test_a_crashing_decoder_only_marks_its_file(
    image_tree: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = worker_module.inspect_content

    def crash_on_one(path, key, *args, **kwargs):  # type: ignore[no-untyped-def]
        if key == "dog/001.png":
            os._exit(139)  # what a segfault in a C decoder looks like to the pool
        return real(path, key, *args, **kwargs)

    monkeypatch.setattr(worker_module, "inspect_content", crash_on_one)
    summary = scan(db_path, image_tree, ScanOptions(workers=2))
    found = by_path(db_path)
    assert summary.seen == 7 and len(found) == 7
    assert found["dog/001.png"][2] == "corrupt"
    assert "crashed" in str(found["dog/001.png"][8])
    assert found["dog/000.png"][2] == "ok"


def test_many_files_with_several_workers(tmp_path: Path, db_path: Path) -> None:
    root = tmp_path / "many"
    for i in range(600):
        make_jpeg(root / f"c{i % 7}" / f"{i:04d}.jpg", (8 + i % 5, 8), (i % 256, 0, 0))
    summary = scan(db_path, root, ScanOptions(workers=2, io_threads=4))
    assert (summary.seen, summary.new, summary.corrupt) == (600, 600, 0)
    assert rows(db_path, "SELECT count(*), count(DISTINCT file_path) FROM image_metadata") == [(600, 600)]
    assert scan(db_path, root, ScanOptions(workers=2)).unchanged == 600


def test_scans_table_records_each_run(image_tree: Path, db_path: Path) -> None:
    scan(db_path, image_tree)
    scan(db_path, image_tree)
    recorded = rows(db_path, "SELECT state, seen, new, unchanged, finished_at IS NOT NULL FROM scans ORDER BY id")
    assert recorded == [("completed", 7, 7, 0, 1), ("completed", 7, 0, 7, 1)]


def test_two_roots_in_one_catalog(image_tree: Path, db_path: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    make_png(other / "cat" / "000.png")
    scan(db_path, image_tree)
    scan(db_path, other)
    assert rows(db_path, "SELECT count(*) FROM roots") == [(2,)]
    assert rows(db_path, "SELECT count(*) FROM image_metadata") == [(8,)]
    summary = scan(db_path, image_tree)
    assert (summary.unchanged, summary.missing) == (7, 0), "another root's rows are not missing"


def test_unit_diffs_cross_the_pipe_as_plain_tuples_and_come_back_typed() -> None:
    import pickle

    from dlindex.scan.diff import ToProbe, UnitDiff
    from dlindex.scan.probe import Probe

    probe = Probe("cat/a.jpg", "ok", 10, 5, "ab" * 16, 2, 3, "JPEG", "RGB")
    item = ToProbe(b"/r/cat/a.jpg", "cat/a.jpg", "cat", None, 7)
    diff = UnitDiff(seen=2, to_probe=[item], probed=[(probe, item)], missing=[(3, "cat/b.jpg")])
    data = pickle.dumps(diff, protocol=pickle.HIGHEST_PROTOCOL)
    assert b"ToProbe" not in data and b"Probe" not in data  # no per-object class reference
    back = pickle.loads(data)
    assert back == diff
    assert type(back.to_probe[0]) is ToProbe and type(back.probed[0][0]) is Probe
    assert back.probed[0][0].kind == "ok" and back.to_probe[0].known_id == 7
