"""The `dlindex` command: a thin typer layer over the library.

Each command lives in its own module, imported only when needed: `dlindex scan` loads the
scan command and what it uses, not every command's dependencies, which keeps start-up
short (it is part of every timed rescan and of every shell pipeline).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Annotated, Any

import typer

# name -> (module in dlindex.cli, attribute, is a sub-app with its own commands)
COMMANDS: dict[str, tuple[str, str, bool]] = {
    "scan": ("scan", "scan", False),
    "stats": ("stats", "stats", False),
    "demo": ("demo", "demo", False),
    "query": ("query", "query", False),
    "mark": ("mark", "mark", False),
    "export": ("export", "export", False),
    "log": ("log", "app", True),
    "features": ("features", "app", True),
    "similar": ("similar", "similar", False),
    "index": ("index", "index", False),
    "roots": ("roots", "app", True),
    "check": ("check", "check", False),
    "dups": ("dups", "dups", False),
    "leaks": ("leaks", "leaks", False),
    "merge": ("merge", "merge", False),
    "postgres": ("postgres", "app", True),
    "versions": ("versions", "versions", False),
    "tag": ("versions", "tag", False),
    "diff": ("versions", "diff", False),
    "text": ("text", "app", True),
}


def build_app(only: str | None = None) -> typer.Typer:
    """The typer app with every command, or with just ``only`` (what `main` runs)."""
    app = typer.Typer(
        name="dlindex",
        help="An SQLite catalog for deep-learning image datasets.",
        pretty_exceptions_enable=False,
        no_args_is_help=True,
        add_completion=False,
        context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
        rich_markup_mode=None,
    )

    @app.callback()
    def _group(
        version: Annotated[
            bool,
            typer.Option(
                "--version", is_eager=True, callback=_print_version, help="Print the dlindex version and exit."
            ),
        ] = False,
    ) -> None:
        """An SQLite catalog for deep-learning image datasets."""

    for name, (module_name, attribute, is_group) in COMMANDS.items():
        if only is not None and name != only:
            continue
        target = getattr(importlib.import_module(f"{__name__}.{module_name}"), attribute)
        if is_group:
            app.add_typer(target, name=name)
        else:
            app.command(name)(target)
    return app


def _print_version(value: bool) -> None:
    if value:
        from dlindex.version import __version__

        typer.echo(f"dlindex {__version__}")
        raise typer.Exit()


_full_app: typer.Typer | None = None


def __getattr__(name: str) -> Any:
    # `from dlindex.cli import app` (tests, docs) gets every command, built on first use.
    global _full_app
    if name == "app":
        if _full_app is None:
            _full_app = build_app()
        return _full_app
    raise AttributeError(name)


def main() -> None:
    invoked = sys.argv[1] if len(sys.argv) > 1 else None
    app = build_app(invoked if invoked in COMMANDS else None)
    try:
        app()
    except KeyboardInterrupt:  # outside a command's own handling (start-up, a prompt)
        print("Error: interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        # `dlindex query | head`: the reader left; exit quietly like other Unix tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(141)
