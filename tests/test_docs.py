"""Each command has docs/commands/<name>.md naming every option it accepts."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer.main

from dlindex.cli import app

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _commands() -> dict[str, object]:
    group = typer.main.get_command(app)
    return dict(group.commands)  # type: ignore[attr-defined]


def _options(command: object) -> list[str]:
    names: list[str] = []
    for param in getattr(command, "params", []):
        names.extend(o for o in param.opts if o.startswith("--"))
        if hasattr(param, "commands"):
            pass
    return names


def _leaves(name: str, command: object) -> list[tuple[str, object]]:
    sub = getattr(command, "commands", None)
    if sub:
        return [(f"{name} {n}", c) for n, c in sub.items()]
    return [(name, command)]


@pytest.mark.parametrize("name", sorted(_commands()))
def test_command_has_a_page_naming_every_option(name: str) -> None:
    page = DOCS / "commands" / f"{name.split()[0]}.md"
    assert page.is_file(), f"docs/commands/{name}.md is missing"
    text = page.read_text()
    for leaf, command in _leaves(name, _commands()[name]):
        for option in _options(command):
            assert option in text, f"{option} of `dlindex {leaf}` is not documented in {page.name}"


def test_readme_quick_start_has_two_commands() -> None:
    readme = (DOCS.parent / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in section.splitlines() if line.startswith("python3 -m venv")]
    assert len(commands) == 2
    ci = (DOCS.parent / ".ci" / "run").read_text()
    assert commands[1] in ci, ".ci/run must run the README's test command"
