"""`dlindex export` never destroys what it did not write, and its readers never leave the export."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dlindex import Catalog, ScanOptions, scan_tree
from dlindex.export import ExportError, load_index, outdir, verify_export
from dlindex.loader import ManifestDataset, WdsDataset, iter_tar

from .conftest import export, invoke, make_png, one_error_line, rewrite_export_file

ROOT = Path(__file__).resolve().parents[1]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- --overwrite refuses


def test_overwrite_refuses_a_folder_of_user_files(runner: CliRunner, scanned_db: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    line = one_error_line(invoke(runner, "export", str(mine), "--db", str(scanned_db), "--overwrite"))
    assert "not a dlindex export" in line
    assert snapshot(mine) == {"notes.txt": b"precious"}


def test_overwrite_refuses_an_export_with_a_stranger_inside(
    runner: CliRunner, scanned_db: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    export(scanned_db, out)
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    line = one_error_line(invoke(runner, "export", str(out), "--db", str(scanned_db), "--overwrite"))
    assert "notes.txt is not part of the export" in line
    assert snapshot(out) == before


def test_overwrite_refuses_a_fake_or_damaged_index(runner: CliRunner, scanned_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    export(scanned_db, out, format="csv")
    with open(out / "train-000000.csv", "a") as f:
        f.write("a line the user added\n")
    assert "has" in one_error_line(invoke(runner, "export", str(out), "--db", str(scanned_db), "--overwrite"))
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "index.json").write_text('{"dlindex_export": 1}')  # named right, not an export
    (fake / "thesis.tex").write_text("x")
    one_error_line(invoke(runner, "export", str(fake), "--db", str(scanned_db), "--overwrite"))
    assert (fake / "thesis.tex").exists()


def test_overwrite_refuses_the_catalog_folder(runner: CliRunner, image_tree: Path, tmp_path: Path) -> None:
    home = tmp_path / "project"
    home.mkdir()
    db = home / "c.db"
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, image_tree, ScanOptions(workers=1))
    # Even when the folder also looks like an export: the catalog is never inside OUT_DIR.
    export(db, tmp_path / "x")
    for entry in (tmp_path / "x").iterdir():
        os.rename(entry, home / entry.name)
    line = one_error_line(invoke(runner, "export", str(home), "--db", str(db), "--overwrite"))
    assert "holds the catalog" in line
    assert db.exists()


def test_overwrite_refuses_a_scanned_root_and_its_parents(
    runner: CliRunner, scanned_db: Path, image_tree: Path
) -> None:
    before = snapshot(image_tree)
    assert "is the scanned root" in one_error_line(
        invoke(runner, "export", str(image_tree), "--db", str(scanned_db), "--overwrite")
    )
    # the parent holds the catalog too; a folder above the root but not the catalog:
    assert "holds" in one_error_line(
        invoke(runner, "export", str(image_tree.parent), "--db", str(scanned_db), "--overwrite")
    )
    assert snapshot(image_tree) == before


def test_overwrite_refuses_a_parent_of_a_root_without_the_catalog(runner: CliRunner, tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_png(data / "set" / "cat" / "0.png")
    db = tmp_path / "c.db"
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, data / "set", ScanOptions(workers=1))
    assert "holds the scanned root" in one_error_line(
        invoke(runner, "export", str(data), "--db", str(db), "--overwrite")
    )
    assert (data / "set" / "cat" / "0.png").exists()


def test_overwrite_refuses_dot_root_and_home(
    runner: CliRunner, scanned_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    export(scanned_db, out)  # a real export, so only the place itself is refused
    before = snapshot(out)
    monkeypatch.chdir(out)
    assert "current folder" in one_error_line(invoke(runner, "export", ".", "--db", str(scanned_db), "--overwrite"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(out))
    assert "home folder" in one_error_line(invoke(runner, "export", str(out), "--db", str(scanned_db), "--overwrite"))
    assert "root folder" in one_error_line(invoke(runner, "export", "/", "--db", str(scanned_db), "--overwrite"))
    assert snapshot(out) == before


def test_overwrite_refuses_a_symlink(scanned_db: Path, tmp_path: Path) -> None:
    export(scanned_db, tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ExportError, match="symbolic link"):
        export(scanned_db, tmp_path / "link", overwrite=True)


# ---------------------------------------------------------------- --overwrite replaces atomically


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "fallback"])
def test_overwrite_replaces_an_export_and_readers_never_see_none(
    scanned_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    out = tmp_path / "out"
    export(scanned_db, out, format="mds")
    if not exchange:
        monkeypatch.setattr(outdir, "_exchange", lambda a, b: False)
    gaps = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal gaps
        while not stop.is_set():
            gaps += not os.path.exists(out / "index.json")

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for fmt in ("jsonl", "wds", "mds", "csv") * 3:
            export(scanned_db, out, format=fmt, overwrite=True)
    finally:
        stop.set()
        watcher.join()
    assert load_index(out)["format"] == "csv"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == []
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    if exchange and outdir._exchange(tmp_path / "a", tmp_path / "b"):
        assert gaps == 0  # renameat2 swaps the folders: index.json is always there


def _in_child(code: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env, stdout=subprocess.PIPE)


def test_leftovers_of_a_killed_export_are_removed_and_a_live_ones_kept(scanned_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    start = (
        "from pathlib import Path; import os, sys, tempfile; from dlindex.export.outdir import OutputDir, temp_prefix\n"
    )
    live = _in_child(
        start + "o = OutputDir(Path('out'), False); print(o.tmp.name, flush=True); sys.stdin.read()", tmp_path
    )
    live_tmp = live.stdout.readline().decode().strip()  # type: ignore[union-attr]
    # Two exports that die mid-write (as OutputDir names its folder), by kill -9 and SIGTERM:
    for sig in (signal.SIGKILL, signal.SIGTERM):
        make = (
            "t = tempfile.mkdtemp(prefix=temp_prefix('out'), suffix='.tmp', dir='.'); open(t + '/x', 'wb').write(b'1')"
        )
        _in_child(start + make + f"\nos.kill(os.getpid(), {int(sig)})", tmp_path).wait(30)
    try:
        assert len([p for p in tmp_path.iterdir() if p.name.startswith(".out.")]) == 3
        export(scanned_db, out)
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")] == [live_tmp]
    finally:
        live.kill()
        live.wait()
    export(scanned_db, out, overwrite=True)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")] == []


def test_a_crash_between_the_fallback_renames_is_recovered(scanned_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    export(scanned_db, out, format="csv")
    old = snapshot(out)
    code = f"""
import os
from pathlib import Path
from dlindex import Catalog
from dlindex.export import export_catalog, ExportOptions, outdir
outdir._exchange = lambda a, b: False
real = os.rename
def rename(a, b):
    real(a, b)
    if str(b).endswith('export'):  # the old export moved aside; die before the new one is in place
        os.kill(os.getpid(), 9)
outdir.os.rename = rename
with Catalog({str(scanned_db)!r}) as c:
    export_catalog(c, Path('out'), ExportOptions(format='jsonl', overwrite=True))
"""
    _in_child(code, tmp_path).wait(60)
    assert not out.exists()  # the crash left neither in place...
    with pytest.raises(ExportError, match="not empty"):
        export(scanned_db, out)  # ...and the next export puts the old one back first
    assert snapshot(out) == old
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")] == []


# ---------------------------------------------------------------- sources that are no regular files


def test_fifo_device_and_changed_size_sources_are_skipped_and_counted(
    runner: CliRunner, scanned_db: Path, image_tree: Path, tmp_path: Path
) -> None:
    (image_tree / "cat" / "000.png").unlink()
    os.mkfifo(image_tree / "cat" / "000.png")  # would block a plain open() forever
    (image_tree / "cat" / "001.png").unlink()
    (image_tree / "cat" / "001.png").symlink_to("/dev/zero")  # would never end
    make_png(image_tree / "dog" / "000.png", (40, 40))  # other size than catalogued
    out = tmp_path / "out"
    result = invoke(runner, "export", str(out), "--db", str(scanned_db), "--format", "wds", "--world-size", "2", "-q")
    assert result.exit_code == 0, result.output
    assert result.stderr.count("warning: skipped") == 3
    assert "skipped 3 source file(s), not packed: 1 changed size, 2 not regular" in result.stderr
    index = load_index(out)
    assert index["counts"]["skipped"] == {"changed_size": 1, "not_regular": 2}
    assert index["counts"]["splits"]["train"]["ranks"] == [2, 2]  # 3 left, padded to equal ranks
    names = [m["json"] for s in index["dlindex_shards"] for m in iter_tar(out / s["file"])]
    assert not any(b"cat/000" in n or b"cat/001" in n or b"dog/000" in n for n in names)


# ---------------------------------------------------------------- tampered exports


@pytest.fixture
def manifest_export(scanned_db: Path, tmp_path: Path) -> Path:
    out = tmp_path / "m"
    export(scanned_db, out)
    return out


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "train-000000.jsonl").read_text().splitlines()]


def _write_rows(out: Path, rows: list[dict[str, Any]]) -> None:
    rewrite_export_file(out, "train-000000.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../../etc/passwd", r"'\.\.' part"),
        ("/etc/passwd", "is absolute"),
        ("cat/\0x", "NUL"),
        ("cat//000.png", "empty"),
    ],
)
def test_manifest_paths_that_leave_the_root_are_refused(manifest_export: Path, path: str, message: str) -> None:
    rows = _rows(manifest_export)
    rows[0]["path"] = path
    _write_rows(manifest_export, rows)
    with pytest.raises(ExportError, match=r"train-000000\.jsonl, line 1: path .*" + message):
        ManifestDataset(manifest_export, decode=False)
    result = verify_export(manifest_export)
    assert not result.ok and any(re.search(r"train-000000\.jsonl, line 1: .*" + message, p) for p in result.problems)


def test_symlinks_that_leave_the_root_are_refused(manifest_export: Path, image_tree: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.png"
    target = image_tree / "cat" / "000.png"
    secret.write_bytes(target.read_bytes())
    target.unlink()
    target.symlink_to(secret)
    dataset = ManifestDataset(manifest_export, decode=False)
    i = [os.path.basename(p) for p in dataset.paths].index(b"000.png")
    with pytest.raises(ExportError, match="leads out of"):
        dataset[i]
    assert any("leads out of" in p for p in verify_export(manifest_export).problems)


def test_absolute_paths_only_in_an_absolute_export_and_under_its_root(
    scanned_db: Path, image_tree: Path, tmp_path: Path
) -> None:
    out = tmp_path / "abs"
    export(scanned_db, out, absolute_paths=True)
    assert len(ManifestDataset(out, decode=False)) == 6
    rows = _rows(out)
    rows[0]["path"] = "/etc/hostname"
    _write_rows(out, rows)
    ManifestDataset(out, decode=False)  # file_root is / in an --absolute-paths export
    from dlindex.exported.reader import source_path

    with pytest.raises(ExportError, match="not under"):
        source_path(load_index(out), "/etc/hostname", root=image_tree)


def test_a_fifo_in_place_of_a_shard_never_blocks(scanned_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "w"
    export(scanned_db, out, format="wds")
    (out / "train-000000.tar").unlink()
    os.mkfifo(out / "train-000000.tar")
    signal.alarm(20)  # a blocking open() would hang here; fail instead
    try:
        with pytest.raises(ExportError, match="a FIFO, not a regular file"):
            list(WdsDataset(out, decode=False))
        assert any("FIFO" in p for p in verify_export(out).problems)
    finally:
        signal.alarm(0)


def test_a_truncated_or_lying_tar_names_the_shard(scanned_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "w"
    export(scanned_db, out, format="wds")
    shard = out / "train-000000.tar"
    data = shard.read_bytes()
    rewrite_export_file(out, shard.name, data[:1500])
    with pytest.raises(ExportError, match=r"train-000000\.tar is truncated"):
        list(WdsDataset(out, decode=False))
    head = bytearray(data[:512])
    for size_field in (b"\xff" * 12, b"77777777777\0", b"-0000000001\0"):  # negative, 8 GiB, not octal
        head[124:136] = size_field
        head[148:156] = b" " * 8
        head[148:156] = b"%06o\0 " % sum(head)
        rewrite_export_file(out, shard.name, bytes(head) + data[512:])
        with pytest.raises(ExportError, match=r"negative size|claims|not a number"):
            list(WdsDataset(out, decode=False))  # never allocates the 8 GiB the header claims
    rewrite_export_file(out, shard.name, data)
    assert len(list(WdsDataset(out, decode=False))) == 6


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda i: i["dlindex_shards"][0].update(bytes=10**30), r"shards\[0\]\.bytes must be a whole number"),
        (lambda i: i["options"].update(world_size=10**11), "world_size"),
        (lambda i: i["dlindex_shards"][0].update(file="../../etc/passwd"), r"'\.\.' part"),
        (lambda i: i["dlindex_shards"][0].update(file="/etc/passwd"), "absolute"),
        (lambda i: i["dlindex_shards"][0].pop("rank"), "has no 'rank'"),
        (lambda i: i.update(labels={"0": "cat", "5": "dog"}), "classes 0..1"),
        (lambda i: i.update(file_root=7), "file_root must be text"),
        (lambda i: i.update(dlindex_export=99), "upgrade dlindex"),
    ],
)
def test_a_hand_edited_index_is_one_error_line(
    runner: CliRunner, manifest_export: Path, edit: Any, message: str
) -> None:
    index = json.loads((manifest_export / "index.json").read_text())
    edit(index)
    (manifest_export / "index.json").write_text(json.dumps(index))
    line = one_error_line(invoke(runner, "export", "--verify", str(manifest_export)))
    assert "index.json" in line and re.search(message, line), line
    with pytest.raises(ExportError, match=message):
        ManifestDataset(manifest_export)


def test_damaged_index_and_rows_name_the_file_and_line(runner: CliRunner, manifest_export: Path) -> None:
    index = manifest_export / "index.json"
    good = index.read_bytes()
    index.write_bytes(good + b"x")
    assert ", line" in one_error_line(invoke(runner, "export", "--verify", str(manifest_export)))
    index.write_bytes(good)
    rows = _rows(manifest_export)
    rows[2]["label_id"] = "cat"
    _write_rows(manifest_export, rows)
    with pytest.raises(ExportError, match=r"train-000000\.jsonl, line 3: 'label_id' must be a whole number"):
        ManifestDataset(manifest_export)
    rewrite_export_file(
        manifest_export, "train-000000.jsonl", b'{"id": 1, "path": "cat/000.png", "label_id": 0}\n{"id": 2,\n'
    )
    with pytest.raises(ExportError, match=r"train-000000\.jsonl, line 2: not a JSON object"):
        ManifestDataset(manifest_export)


def test_a_manifest_larger_than_listed_is_refused(manifest_export: Path) -> None:
    with open(manifest_export / "train-000000.jsonl", "ab") as f:
        f.write(b"\n" * 10)
    with pytest.raises(ExportError, match="expected at most"):
        ManifestDataset(manifest_export)


# ---------------------------------------------------------------- option bounds


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--world-size", str(10**11)], "--world-size must be at least 1 and at most 65536"),
        (["--shard-bytes", "9" * 400], "larger than"),
        (["--shard-bytes", "2TiB"], "--shard-bytes must be"),
        (["--limit", str(2**70)], "--limit must be"),
        (["--seed", str(2**70)], "--seed must be"),
        (["--read-threads", "100000"], "--read-threads must be"),
    ],
)
def test_option_bounds(runner: CliRunner, scanned_db: Path, tmp_path: Path, args: list[str], message: str) -> None:
    line = one_error_line(
        invoke(runner, "export", str(tmp_path / "o"), "--db", str(scanned_db), "--format", "wds", *args)
    )
    assert message in line
    assert not (tmp_path / "o").exists()


def test_big_catalogs_export_every_sample_in_every_format(
    scanned_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dlindex.export.plan as plan

    monkeypatch.setattr(plan, "HALVES_MIN_IDS", 1)  # as if the id range were large
    for fmt, extra in (("jsonl", {}), ("jsonl", {"shard_size": 2}), ("wds", {}), ("mds", {}), ("csv", {})):
        summary = export(scanned_db, tmp_path / f"{fmt}{len(extra)}", format=fmt, **extra)
        assert summary.samples == 6, (fmt, extra)


def test_features_export_removes_leftovers_of_killed_runs_only(scanned_db: Path, tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    from dlindex.features import export_features, import_features

    np.savez(tmp_path / "in.npz", ids=np.arange(1, 4), vectors=np.ones((3, 2), np.float32))
    with Catalog(scanned_db) as catalog:
        import_features(catalog, "v", tmp_path / "in.npz")
    # features export names its temporaries with dlindex.features.tempfiles (.v.npz.dlx-...tmp)
    start = "import os, sys; from pathlib import Path; from dlindex.features import tempfiles\n"
    make = "fd, t = tempfiles.create(Path('v.npz')); print(t, flush=True)\n"
    live = _in_child(start + make + "sys.stdin.read()", tmp_path)
    live_tmp = os.path.basename(live.stdout.readline().decode().strip())  # type: ignore[union-attr]
    _in_child(start + make + "os.kill(os.getpid(), 9)", tmp_path).wait(30)
    try:
        assert len([p for p in tmp_path.iterdir() if p.name.startswith(".v.npz.")]) == 2
        with Catalog(scanned_db) as catalog:
            export_features(catalog, "v", tmp_path / "v.npz")
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".v.npz.")] == [live_tmp]
    finally:
        live.kill()
        live.wait()


def test_a_symlinked_source_is_packed_like_the_scan_saw_it(tmp_path: Path) -> None:
    make_png(tmp_path / "elsewhere" / "real.png", (9, 9))
    (tmp_path / "images" / "cat").mkdir(parents=True)
    make_png(tmp_path / "images" / "cat" / "plain.png")
    (tmp_path / "images" / "cat" / "link.png").symlink_to(tmp_path / "elsewhere" / "real.png")
    db = tmp_path / "c.db"
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, tmp_path / "images", ScanOptions(workers=1))
        n = catalog.conn.execute("SELECT count(*) FROM image_metadata WHERE status = 'ok'").fetchone()[0]
    summary = export(db, tmp_path / "w", format="wds")
    assert (summary.samples, summary.skipped) == (n, {})


def test_sigterm_mid_export_removes_the_temporary_folder(scanned_db: Path, tmp_path: Path) -> None:
    code = f"""
import os, signal
from pathlib import Path
from dlindex import Catalog
from dlindex.export import export_catalog, ExportOptions
with Catalog({str(scanned_db)!r}) as c:
    try:
        export_catalog(c, Path('out'), ExportOptions(format='wds'), progress=lambda n: os.kill(os.getpid(), signal.SIGTERM))
    except KeyboardInterrupt:
        raise SystemExit(130)
"""
    assert _in_child(code, tmp_path).wait(60) == 130
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith((".out", "out"))] == []


def test_overwrite_recognises_a_parquet_export_by_its_index(scanned_db: Path, tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    out = tmp_path / "p"
    export(scanned_db, out, format="parquet")
    assert (out / "_index.json").is_file() and not (out / "index.json").exists()
    export(scanned_db, out, format="parquet", overwrite=True)  # _index.json: a dlindex export
    export(scanned_db, out, format="jsonl", overwrite=True)  # and another format may replace it
    assert load_index(out)["format"] == "jsonl" and not (out / "_index.json").exists()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"notes.txt is not part of the export"):
        export(scanned_db, out, format="parquet", overwrite=True)
