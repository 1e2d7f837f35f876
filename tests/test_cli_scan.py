"""`dlindex scan` through typer's CliRunner and a real subprocess; the app's --help and --version."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlindex.catalog.sqlite.migrations import LATEST_VERSION
from dlindex.cli import app

from .backends import ON_BOTH_BACKENDS, SQLITE_ONLY, catalog_exists, where
from .conftest import rows

pytestmark = ON_BOTH_BACKENDS

SUMMARY_KEYS = {"seen", "new", "changed", "unchanged", "missing", "corrupt", "errors", "seconds", "skipped"}


def test_scan_json_summary(runner: CliRunner, image_tree: Path, db_path: Path) -> None:
    result = runner.invoke(app, ["scan", str(image_tree), "--db", str(db_path), "--json", "-w", "1"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert set(summary) >= SUMMARY_KEYS
    assert (summary["seen"], summary["new"], summary["corrupt"]) == (7, 7, 1)
    assert result.stderr == ""


def test_scan_human_summary(runner: CliRunner, image_tree: Path, db_path: Path) -> None:
    result = runner.invoke(app, ["scan", str(image_tree), "--db", str(db_path), "-w", "1"])
    assert result.exit_code == 0
    assert "seen 7" in result.stdout and "files/s" in result.stdout


def test_db_from_environment(runner: CliRunner, image_tree: Path, db_path: Path) -> None:
    result = runner.invoke(app, ["scan", str(image_tree), "-q", "-w", "1"], env={"DLINDEX_DB": str(db_path)})
    assert result.exit_code == 0, result.output
    assert catalog_exists(db_path)


@pytest.mark.parametrize(
    ("make_root", "message"),
    [
        (lambda tmp: tmp / "nope", "does not exist"),
        (lambda tmp: (tmp / "f.txt").write_text("x") and tmp / "f.txt", "not a folder"),
    ],
)
def test_bad_root_is_one_line_and_creates_no_catalog(
    runner: CliRunner,
    tmp_path: Path,
    db_path: Path,
    make_root,
    message: str,  # type: ignore[no-untyped-def]
) -> None:
    result = runner.invoke(app, ["scan", str(make_root(tmp_path)), "--db", str(db_path)])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1
    assert not catalog_exists(db_path)


def test_unwritable_db_location(runner: CliRunner, image_tree: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["scan", str(image_tree), "--db", str(tmp_path / "missing" / "x.db")])
    assert result.exit_code == 1
    assert "cannot create catalog" in result.stderr


@SQLITE_ONLY  # catalog files that are not dlindex's
def test_not_a_catalog_and_newer_schema(runner: CliRunner, image_tree: Path, tmp_path: Path) -> None:
    text = tmp_path / "text.db"
    text.write_text("not sqlite")
    result = runner.invoke(app, ["scan", str(image_tree), "--db", str(text)])
    assert (result.exit_code, text.read_text()) == (1, "not sqlite")
    assert "not a dlindex catalog" in result.stderr
    newer = tmp_path / "newer.db"
    conn = sqlite3.connect(newer)
    conn.execute(f"PRAGMA user_version = {LATEST_VERSION + 1}")
    conn.execute("PRAGMA application_id = 1684826488")
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    result = runner.invoke(app, ["stats", "--db", str(newer)])
    assert result.exit_code == 1 and "newer than this dlindex" in result.stderr


def test_unknown_option_is_a_usage_error(runner: CliRunner, image_tree: Path) -> None:
    result = runner.invoke(app, ["scan", str(image_tree), "--no-such-option"])
    assert result.exit_code == 2


def test_strict_exits_3_on_errors(
    runner: CliRunner, image_tree: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    real_open = os.open

    def deny(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if os.fsencode(path).endswith(b"cat/000.png"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    result = runner.invoke(app, ["scan", str(image_tree), "--db", str(db_path), "--strict", "-w", "1", "--json"])
    assert result.exit_code == 3
    assert "Permission denied" in result.stderr


def test_subprocess_scan_has_no_progress_noise_off_a_terminal(image_tree: Path, db_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dlindex", "scan", str(image_tree), "--db", str(db_path), "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0
    assert done.stderr == ""
    assert json.loads(done.stdout)["seen"] == 7


def test_progress_bar_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from dlindex.cli._shared import progress_bar

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress_bar(False, desc="scan", unit="img", file=terminal) as update:
        update(5)
    assert "scan" in terminal.getvalue() and "5img" in terminal.getvalue()
    with progress_bar(True, desc="quiet", file=terminal) as update:
        update(5)
    assert "quiet" not in terminal.getvalue()
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal: no bar, tqdm not needed
    with progress_bar(False, desc="piped") as update:
        update(5)


def test_scan_json_start_up_imports_neither_rich_nor_tqdm_nor_pydantic(image_tree: Path, tmp_path: Path) -> None:
    code = (
        "import sys; from dlindex.cli import main; sys.argv = ['dlindex', 'scan', sys.argv[1], '--db', sys.argv[2], '--json']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print([m for m in ('rich.console', 'tqdm', 'pydantic') if m in sys.modules], file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(image_tree), str(where(tmp_path / "c.db"))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
    assert json.loads(done.stdout)["seen"] == 7


def test_labels_paths_matching_no_image_are_reported_on_stderr(
    runner: CliRunner, image_tree: Path, db_path: Path, tmp_path: Path
) -> None:
    labels = tmp_path / "fixes.csv"
    labels.write_text("path,label\ncat/000.png,tiger\n" + "".join(f"cat/{i:03d}.jpg,x\n" for i in range(7)))
    result = runner.invoke(
        app, ["scan", str(image_tree), "--db", str(db_path), "--workers", "1", "--labels", str(labels), "-q"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # -q: no summary
    assert result.stderr == (
        f"7 path(s) in {labels} match no image under {image_tree}: "
        "cat/000.jpg, cat/001.jpg, cat/002.jpg, cat/003.jpg, cat/004.jpg, ...\n"
    )
    as_json = runner.invoke(
        app, ["scan", str(image_tree), "--db", str(db_path), "--workers", "1", "--labels", str(labels), "--json"]
    )
    assert json.loads(as_json.stdout)["unknown_label_paths"] == 7


def test_quiet_silences_the_summary_not_the_errors(runner: CliRunner, image_tree: Path, db_path: Path) -> None:
    result = runner.invoke(app, ["scan", str(image_tree), "--db", str(db_path), "--workers", "1", "--quiet"])
    assert (result.exit_code, result.stdout) == (0, "")
    loud = runner.invoke(app, ["scan", str(image_tree), "--db", str(db_path), "--workers", "1"])
    assert "scanned" in loud.stdout
    bad = runner.invoke(app, ["scan", str(image_tree / "nope"), "--db", str(db_path), "-q"])
    assert bad.exit_code == 1 and bad.stderr.startswith("Error: ")


def test_no_log_keeps_the_scan_out_of_the_query_log(runner: CliRunner, image_tree: Path, db_path: Path) -> None:
    quiet = runner.invoke(app, ["scan", str(image_tree), "--db", str(db_path), "-q", "-w", "1", "--no-log"])
    assert (quiet.exit_code, quiet.stderr) == (0, ""), quiet.output
    assert rows(db_path, "SELECT count(*) FROM query_log") == [(0,)]
    logged = runner.invoke(app, ["scan", str(image_tree), "--db", str(db_path), "-q", "-w", "1", "--force"])
    assert logged.exit_code == 0, logged.output
    assert rows(db_path, "SELECT count(*) FROM query_log")[0][0] > 0
