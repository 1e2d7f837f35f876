"""scan --watch: the catalog follows the tree (real inotify events through watchfiles, and timed
rescans without them), automatic feature types are computed as samples land, one watcher per
catalog, a tree that disappears stops the watch in one line, Ctrl-C and SIGTERM end it cleanly."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dlindex import Catalog, InputError, ScanOptions
from dlindex.features import set_auto
from dlindex.scan.watch import WatchOptions, watch_tree

from .conftest import compute, make_png, rows

pytest.importorskip("watchfiles")

DEADLINE_S = 30.0  # generous: a loaded CI machine; the latency itself is measured by bench/bench_watch.py


def wait_for(condition: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"not within {DEADLINE_S} s: {what}")
        time.sleep(0.05)


class Watcher:
    """``dlindex scan ROOT --watch --json`` in a process of its own (as a user runs it: the
    scan's worker processes are forked from a process whose only other thread is the file
    watcher's); its batches, read once it ended."""

    def __init__(self, db: Path, root: Path, *args: str) -> None:
        command = [sys.executable, "-m", "dlindex", "scan", str(root), "--watch", "--json", "--workers", "1"]
        self.proc = subprocess.Popen(
            [*command, "--db", str(db), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []  # its batches as they are printed (a test may wait for one)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.err = ""

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("the watcher did not stop") from None
        finally:
            self.reader.join(timeout=DEADLINE_S)
            assert self.proc.stderr is not None
            self.err = self.proc.stderr.read()
        return self.proc.returncode

    @property
    def batches(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in list(self.lines)]


@contextmanager
def watching(db: Path, root: Path, *args: str) -> Iterator[Watcher]:
    """A watcher for the block, past its first scan; stopped (SIGTERM: exit 130) at its end."""
    watcher = Watcher(db, root, *args)
    try:
        wait_for(lambda: catalogued(db, "cat/000.png") or watcher.proc.poll() is not None, "the first scan")
        yield watcher
    finally:
        code = watcher.stop()
    assert code == 130, watcher.err


def catalogued(db: Path, file_path: str) -> bool:
    if not db.exists():  # not before the watcher made it: sqlite3 would make an empty file
        return False
    try:
        return bool(rows(db, "SELECT 1 FROM image_metadata WHERE file_path = ? AND status = 'ok'", (file_path,)))
    except sqlite3.OperationalError:  # the schema is being made
        return False


def test_new_changed_and_removed_files_reach_the_catalog(image_tree: Path, tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    with watching(db, image_tree) as watcher:
        make_png(image_tree / "cat" / "new.png", (20, 20), (0, 200, 0))
        wait_for(lambda: catalogued(db, "cat/new.png"), "a new file catalogued")
        make_png(image_tree / "bird" / "first.png", (21, 20), (0, 0, 200))  # a new folder: a new class
        wait_for(lambda: catalogued(db, "bird/first.png"), "a file in a new folder catalogued")
        (image_tree / "dog" / "001.png").unlink()
        wait_for(
            lambda: rows(db, "SELECT status FROM image_metadata WHERE file_path = 'dog/001.png'") == [("missing",)],
            "a removed file marked missing",
        )
    batches = watcher.batches
    assert batches[0]["reason"] == "start" and batches[0]["scan"]["new"] == 7  # six PNGs and a broken file
    # the first word of the watcher (an event batch, or a wake with none: "catch-up") is answered
    # by a rescan; then only events (no timer within 300 s)
    assert batches[1]["reason"] in ("catch-up", "events")
    assert all(b["reason"] == "events" and b["events"] for b in batches[2:]) and len(batches) >= 4
    assert rows(db, "SELECT name FROM labels ORDER BY name") == [("bird",), ("cat",), ("dog",)]


def test_automatic_features_are_computed_as_samples_land(scanned_db: Path, image_tree: Path) -> None:
    compute(scanned_db, "dhash")
    with Catalog(scanned_db) as catalog:
        set_auto(catalog, "dhash")
    with watching(scanned_db, image_tree) as watcher:
        make_png(image_tree / "cat" / "auto.png", (24, 20), (90, 9, 9))

        def computed() -> list[tuple[object, object]]:
            return [(f["feature_type"], f["computed"]) for b in watcher.batches for f in b["features"]]  # type: ignore[attr-defined]

        # the batch's line, printed after its vectors were committed (a SIGTERM in between
        # would end the watch before the line, the catalog consistent)
        wait_for(lambda: ("dhash", 1) in computed(), "the batch that computed the new sample's dhash")
    assert rows(
        scanned_db,
        "SELECT count(*) FROM image_features f JOIN image_metadata m ON m.id = f.image_id "
        "WHERE m.file_path = 'cat/auto.png' AND f.feature_type = 'dhash'",
    ) == [(1,)]
    assert rows(scanned_db, "SELECT count(*) FROM feature_state") == [(0,)]


def test_without_events_a_timer_rescans(image_tree: Path, tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    with watching(db, image_tree, "--no-events", "--interval", "0.2") as watcher:
        make_png(image_tree / "cat" / "timer.png", (20, 20), (1, 2, 3))
        wait_for(lambda: catalogued(db, "cat/timer.png"), "a timed rescan")
    assert {b["reason"] for b in watcher.batches[1:]} == {"timer"}


def test_a_flood_of_new_files_is_caught_whole(image_tree: Path, tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    source = (image_tree / "cat" / "000.png").read_bytes()
    with watching(db, image_tree):
        for folder in range(20):
            target = image_tree / f"flood{folder:02d}"
            target.mkdir()
            for i in range(250):  # distinct bytes: each is a new sample, not a duplicate
                (target / f"{i:04d}.png").write_bytes(source + i.to_bytes(2, "big"))
        wait_for(
            lambda: rows(db, "SELECT count(*) FROM image_metadata WHERE file_path LIKE 'flood%'") == [(5000,)],
            "5,000 new files",
        )


def test_one_watcher_a_catalog(image_tree: Path, tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    with watching(db, image_tree):
        second = subprocess.run(
            [sys.executable, "-m", "dlindex", "scan", str(image_tree), "--watch", "--db", str(db)],
            capture_output=True, text=True, timeout=DEADLINE_S,
        )  # fmt: skip
    assert second.returncode == 1
    assert "is watching catalog" in second.stderr and "one watcher a catalog" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1, second.stderr


def test_a_tree_that_disappears_stops_the_watch_in_one_line(image_tree: Path, tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    watcher = Watcher(db, image_tree)
    wait_for(lambda: catalogued(db, "cat/000.png"), "the first scan")
    shutil.rmtree(image_tree)
    wait_for(lambda: watcher.proc.poll() is not None, "the watcher's end")
    assert watcher.stop() == 1
    assert watcher.err.strip().splitlines() == [
        f"Error: {image_tree} is gone: the watch stopped (the catalog keeps what it had)"
    ]
    assert rows(db, "SELECT count(*) FROM image_metadata") == [(7,)]  # what it had, kept


def test_bad_options_are_refused(image_tree: Path, tmp_path: Path) -> None:
    with Catalog(tmp_path / "w.db", create=True) as catalog, pytest.raises(InputError, match="--interval"):
        watch_tree(catalog, image_tree, watching=WatchOptions(interval_s=0))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_cli_prints_a_line_a_batch_and_stops_cleanly(image_tree: Path, tmp_path: Path, sig: int) -> None:
    db = tmp_path / "w.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlindex", "scan", str(image_tree), "--watch", "--db", str(db)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    try:
        wait_for(lambda: catalogued(db, "cat/000.png"), "the first scan")
        make_png(image_tree / "cat" / "cli.png", (20, 20), (7, 7, 7))
        wait_for(lambda: catalogued(db, "cat/cli.png"), "a new file through the CLI")
        time.sleep(0.3)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=DEADLINE_S)
    except AssertionError:
        proc.kill()
        print(proc.communicate())
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    lines = out.splitlines()
    assert "batch 0 (start): new 7" in lines[0] and any("new 1" in line for line in lines[1:]), out
    assert err.strip().splitlines()[-1].startswith("watch stopped after "), err
    assert err.strip().splitlines()[-1].endswith(" batch(es); the catalog is consistent"), err


def test_a_library_caller_stops_the_watch_within_a_second_or_two(image_tree: Path, tmp_path: Path) -> None:
    """watch_tree on a thread, stopped by its event: seen at the next wake, not after --interval.
    (This thread only waits meanwhile: it touches no catalog while the watcher forks its workers.)"""
    first = threading.Event()
    stop = threading.Event()
    done: list[int] = []

    def run() -> None:
        with Catalog(tmp_path / "w.db", create=True) as catalog:
            done.append(
                watch_tree(catalog, image_tree, ScanOptions(workers=1), WatchOptions(), lambda b: first.set(), stop)
            )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert first.wait(DEADLINE_S)
    time.sleep(1.5)  # past the catch-up rescan: now waiting on events, with --interval at 300 s
    began = time.monotonic()
    stop.set()
    thread.join(DEADLINE_S)
    assert not thread.is_alive() and done and done[0] >= 1
    assert time.monotonic() - began < 5.0
