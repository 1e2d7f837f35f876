"""`dlindex --help`, `--version` and `python -m dlindex`; every COMMAND --help shows each default, uneaten."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main
import typer.rich_utils
from rich.text import Text
from typer.testing import CliRunner

from dlindex.cli import app


def _leaves() -> list[tuple[tuple[str, ...], Any]]:
    """Every command and subcommand, as (argv words, click command)."""
    found: list[tuple[tuple[str, ...], Any]] = []

    def walk(words: tuple[str, ...], command: Any) -> None:
        found.append((words, command))
        for name, sub in getattr(command, "commands", {}).items():
            walk((*words, name), sub)

    walk((), typer.main.get_command(app))
    return found


LEAVES = _leaves()


def _shown_default(param: Any) -> str | None:
    """What `[default: ...]` should say for this parameter, or None where there is nothing to say."""
    if isinstance(param.show_default, str):
        return f"({param.show_default})"
    if param.show_default is False or param.default is None or param.default == () or param.default == []:
        return None
    if getattr(param, "is_flag", False) and not getattr(param, "secondary_opts", ()):
        return None  # a plain flag: off unless given
    if getattr(param, "is_eager", False):
        return None  # --help, --version
    values = param.default if isinstance(param.default, (list, tuple)) else [param.default]
    shown = []
    for value in values:
        if getattr(param, "secondary_opts", ()) and isinstance(value, bool):
            shown.append((param.opts if value else param.secondary_opts)[0].lstrip("-"))
        else:
            shown.append(str(getattr(value, "value", value)))
    return ", ".join(shown)


def _help(monkeypatch: pytest.MonkeyPatch, words: tuple[str, ...]) -> str:
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 1000)  # one line per option: nothing wraps
    result = CliRunner().invoke(
        app, [*words, "--help"], env={"COLUMNS": "1000"}, terminal_width=1000, max_content_width=1000
    )
    assert result.exit_code == 0, result.output
    return " ".join(result.stdout.split())


@pytest.mark.parametrize(("words", "command"), LEAVES, ids=[" ".join(w) or "dlindex" for w, _ in LEAVES])
def test_help_shows_every_default(monkeypatch: pytest.MonkeyPatch, words: tuple[str, ...], command: Any) -> None:
    text = _help(monkeypatch, words)
    for param in command.params:
        default = _shown_default(param)
        if default is not None:
            assert re.search(rf"default: {re.escape(default)}[];]", text), (
                f"`dlindex {' '.join(words)} --help` hides {param.opts}'s default"
            )
    assert "\\[default" not in text


@pytest.mark.parametrize(("words", "command"), LEAVES, ids=[" ".join(w) or "dlindex" for w, _ in LEAVES])
def test_no_help_text_is_swallowed_as_markup(words: tuple[str, ...], command: Any) -> None:
    texts = [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]
    for text in texts:
        assert "[default" not in text, f"write a default as show_default, not in the help text: {text!r}"
        assert Text.from_markup(text).plain == text, f"rich markup would eat part of {text!r}"


def test_every_command_is_covered() -> None:
    names = {" ".join(words) for words, _ in LEAVES}
    assert {"query", "export", "features compute", "log show", "roots move", "index"} <= names


def test_python_dash_m_help() -> None:
    done = subprocess.run([sys.executable, "-m", "dlindex", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for command in ("scan", "stats", "demo"):
        assert command in done.stdout


def test_help_at_80_columns_wraps_at_the_terminal_not_at_18_characters() -> None:
    env = {**os.environ, "COLUMNS": "80"}
    done = subprocess.run(
        [sys.executable, "-m", "dlindex", "export", "--help"], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    # rich's option table squeezed the help column to ~18 characters: "Only processed," / "or only" / ...
    assert any("Only processed, or only unprocessed," in line for line in lines), done.stdout
    assert any(line.strip().startswith("--processing-status") for line in lines), done.stdout  # not "--processing-sta…"


def test_version(runner: CliRunner) -> None:
    from dlindex import __version__

    result = runner.invoke(app, ["--version"])
    assert (result.exit_code, result.stdout) == (0, f"dlindex {__version__}\n")
    done = subprocess.run([sys.executable, "-m", "dlindex", "--version"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, f"dlindex {__version__}\n")


def _message_strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string literal in a module that is not a docstring."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_help_or_message_points_at_a_docs_file_a_wheel_lacks() -> None:
    # docs/ is not in the wheel: a user of `pip install dlindex` has no docs/reliability.md to open
    package = Path(__file__).resolve().parents[1] / "dlindex"
    found = [
        f"{path.relative_to(package.parent)}:{line}: {text!r}"
        for path in sorted(package.rglob("*.py"))
        for line, text in _message_strings(path)
        if re.search(r"docs/\S*\.md", text)
    ]
    assert not found, "\n".join(found)
    for words, command in LEAVES:
        texts = [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]
        assert not [t for t in texts if re.search(r"docs/\S*\.md", t)], words
