"""`dlindex query` at a terminal: rows stream out in a table with a row cap, paths shortened
in the middle to the terminal width; off a terminal nothing changes."""

from __future__ import annotations

import fcntl
import io
import json
import os
import select
import struct
import subprocess
import sys
import termios
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len
from rich.console import Console
from typer.testing import CliRunner

from dlindex.cli import _output, _table, app

from .synthetic import Row, make_catalog

LONG_ROOT = "/data/imagenet/train/with/a/rather/long/root"


@pytest.fixture
def big(tmp_path: Path) -> Path:
    return make_catalog(
        tmp_path / "big.db", [Row(label) for label in ("cat", "dog") for _ in range(125)], root=LONG_ROOT
    )


def terminal(monkeypatch: pytest.MonkeyPatch, width: int = 80) -> io.StringIO:
    out = io.StringIO()
    monkeypatch.setattr(
        _output, "stdout_console", Console(file=out, force_terminal=True, width=width, color_system=None)
    )
    return out


def table_lines(text: str) -> list[str]:
    """The table's header (one entry, however many lines a narrow terminal breaks it into), rule and rows."""
    lines = [line for line in text.splitlines() if line.strip()]
    rule = next((k for k, line in enumerate(lines) if line.strip().startswith("─")), 1)
    return ["\n".join(lines[:rule]), *lines[rule:]]


def test_a_terminal_gets_the_first_100_rows_and_a_line_saying_how_many_more(
    runner: CliRunner, big: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = terminal(monkeypatch)
    result = runner.invoke(app, ["query", "--db", str(big)])
    assert result.exit_code == 0, result.output
    lines = table_lines(out.getvalue())
    assert len(lines) == 2 + 100  # header, rule, 100 rows
    assert lines[2].split()[0] == "1" and lines[-1].split()[0] == "100"
    assert result.stderr == "… 150 more rows; use --all or --limit N to print them, or --format jsonl\n"
    assert max(cell_len(line) for line in out.getvalue().splitlines()) <= 80


def test_headers_stay_readable_at_80_columns(runner: CliRunner, big: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = terminal(monkeypatch)
    result = runner.invoke(app, ["query", "--db", str(big), "--limit", "3"])
    assert result.exit_code == 0, result.output
    header = table_lines(out.getvalue())[0]
    assert "…" not in header, header  # every default column's name, not "wid…", "pro…", "pro…"
    words = header.split()
    for name in ("id", "path", "label", "width", "height", "status", "processed", "processing", "_status"):
        assert name in words, header
    assert max(cell_len(line) for line in out.getvalue().splitlines()) <= 80


def test_every_column_name_stays_whole_at_80_columns(
    runner: CliRunner, big: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`orientation` (11 letters, no underscore to break at) was cut to `orientati…`."""
    from dlindex.query.spec import COLUMNS

    out = terminal(monkeypatch)
    wide = "id,path,label,width,height,orientation,processing_status,excluded"
    result = runner.invoke(app, ["query", "--db", str(big), "--limit", "3", "-c", wide])
    assert result.exit_code == 0, result.output
    header = table_lines(out.getvalue())[0]
    assert "…" not in header and "orientation" in header.split(), header
    assert max(cell_len(line) for line in out.getvalue().splitlines()) <= 80
    longest = max((w for name in COLUMNS for w in _table._words(name)), key=len)
    assert _table.header_floor(longest) == len(longest)  # every catalog column's name fits its floor


def test_paths_are_shortened_in_the_middle_to_the_width(
    runner: CliRunner, big: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for width in (50, 70, 120):
        out = terminal(monkeypatch, width)
        result = runner.invoke(app, ["query", "--db", str(big), "-c", "id,path,label,width", "--max-rows", "3"])
        assert result.exit_code == 0, result.output
        lines = table_lines(out.getvalue())
        assert max(cell_len(line) for line in lines) <= width
        path = lines[2].split()[1]
        assert path.startswith("/data/") and path.endswith("/cat/0001.png"), path
        assert ("…" in path) == (width < 80), path  # the full path fits in 120 columns
        assert len(path) >= min(width // 3, len(LONG_ROOT) + 13)


@pytest.mark.parametrize(
    ("args", "rows", "more"),
    [
        (["--all"], 250, 0),
        (["--limit", "120"], 120, 0),
        (["--max-rows", "5"], 5, 245),
        (["--max-rows", "5", "--all"], 250, 0),
        (["--label", "cat", "--max-rows", "125"], 125, 0),
    ],
)
def test_the_cap_and_how_to_lift_it(
    runner: CliRunner, big: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], rows: int, more: int
) -> None:
    out = terminal(monkeypatch)
    result = runner.invoke(app, ["query", "--db", str(big), "-c", "id,label", *args])
    assert result.exit_code == 0, result.output
    assert len(table_lines(out.getvalue())) == 2 + rows
    assert result.stderr == (
        f"… {more} more rows; use --all or --limit N to print them, or --format jsonl\n" if more else ""
    )


def test_off_a_terminal_every_row_is_written_as_before(runner: CliRunner, big: Path) -> None:
    result = runner.invoke(app, ["query", "--db", str(big), "-c", "id,path"])
    assert result.exit_code == 0 and result.stderr == ""
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 250 and rows[0] == {"id": 1, "path": f"{LONG_ROOT}/cat/0001.png"}


def test_an_explicit_table_off_a_terminal_is_not_capped(runner: CliRunner, big: Path) -> None:
    result = runner.invoke(app, ["query", "--db", str(big), "-c", "id", "--format", "table"])
    assert result.exit_code == 0 and result.stderr == ""
    assert len(table_lines(result.stdout)) == 2 + 250


def _rows(n: int) -> Iterator[dict[str, Any]]:
    for i in range(1, n + 1):
        yield {"id": i, "path": f"/data/train/cat/{i:07d}.png", "label": "cat"}


def test_the_first_rows_print_before_the_rest_is_read() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80)
    printed_at: list[int] = []

    def rows() -> Iterator[dict[str, Any]]:
        for row in _rows(5000):
            if out.getvalue() and not printed_at:
                printed_at.append(row["id"])
            yield row

    result = _table.stream_table(console, rows(), ("id", "path", "label"))
    assert result == _table.TableResult(shown=5000, more=0)
    assert printed_at == [_table.FIRST_CHUNK + 1]  # on screen once the first chunk was read


def test_memory_stays_flat_however_many_rows_follow_the_cap() -> None:
    def peak(n: int) -> int:
        console = Console(file=io.StringIO(), force_terminal=True, width=80)
        tracemalloc.start()
        result = _table.stream_table(console, _rows(n), ("id", "path", "label"), max_rows=100)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert result == _table.TableResult(shown=min(n, 100), more=max(n - 100, 0))
        return peak

    small, large = peak(1_000), peak(200_000)
    assert large < small * 1.5 + 200_000, (small, large)


def test_control_characters_in_names_never_reach_the_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    rows = [{"id": 1, "path": "/data/\x1b]0;pwned\x07/\x1b[31mred.png"}, {"id": 2, "path": "/data/caf\udce9.png"}]
    _table.stream_table(console, rows, ("id", "path"))
    text = out.getvalue()
    assert "\x1b]" not in text and "\x07" not in text and "\x1b[31m" not in text
    assert "\\x1b[31mred.png" in text and "caf\\udce9.png" in text


def test_shorten_middle() -> None:
    assert _table.shorten_middle("/data/train/n01440764/img_0001.png", 22) == "/data/t…/img_0001.png"
    assert _table.shorten_middle("/data/train/n01440764/img_0001.png", 25) == "/data/tr…/img_0001.png"
    assert _table.shorten_middle("short", 10) == "short"
    for width in range(1, 40):
        shortened = _table.shorten_middle("/data/train/n01440764/img_0001.png", width)
        assert width // 2 <= len(shortened) <= min(width, 34), (width, shortened)


def _pty_query(db: Path, *args: str, columns: int = 80) -> tuple[float, str, str]:
    """Run `dlindex query` with stdout on a real pseudo-terminal; (seconds to the first row, screen, stderr)."""
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM")}
    env.update(TERM="xterm-256color", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "dlindex", "query", "--db", str(db), *args], stdout=follower,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)  # fmt: skip
    os.close(follower)
    chunks: list[bytes] = []
    first = None
    # poll, not select: select() refuses a descriptor >= 1024, which a long-lived test worker may reach
    waiting = select.poll()
    waiting.register(leader, select.POLLIN)
    while True:
        ready = waiting.poll(60_000)
        assert ready, "no output within 60 s"
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the command closed the terminal
            break
        if not data:
            break
        chunks.append(data)
        if first is None and b"\xe2\x94\x80" in b"".join(chunks):  # the rule under the header
            first = time.perf_counter() - started
    _, err = proc.communicate(timeout=60)
    os.close(leader)
    assert proc.returncode == 0, err
    assert first is not None
    return first, b"".join(chunks).decode(), err.decode()


def test_on_a_real_terminal(big: Path) -> None:
    _, screen, err = _pty_query(big)
    plain = table_lines(screen.replace("\x1b[1m", "").replace("\x1b[0m", "").replace("\r\n", "\n"))
    assert len(plain) == 102, screen[:500]
    assert max(cell_len(line) for block in plain for line in block.splitlines()) <= 80
    assert "/cat/0001.png" in plain[2] and "…" in plain[2]
    assert err == "… 150 more rows; use --all or --limit N to print them, or --format jsonl\n"
