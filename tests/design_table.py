"""The module table of docs/design.md as the code defines it: `python -m tests.design_table` prints it
(`--write` puts it into docs/design.md).

Each row names one module of dlindex/ (a package by its folder, for its __init__.py) and the first
line of its docstring, the module's one-line purpose.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dlindex"
DESIGN = ROOT / "docs" / "design.md"
HEADER = "| module | owns |\n|---|---|"


def module_name(path: Path) -> str:
    """`dlindex/catalog/` for a package's __init__.py, `dlindex/catalog/sqlite.py` for a module."""
    relative = path.relative_to(ROOT).as_posix()
    return relative.removesuffix("__init__.py") if path.name == "__init__.py" else relative


def purpose(path: Path) -> str:
    """The first line of the module's docstring ("" if it has none)."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return docstring.strip().splitlines()[0].strip() if docstring.strip() else ""


def expected_rows() -> dict[str, str]:
    """Module name -> purpose, for every .py file under dlindex/ (__main__.py included)."""
    paths = sorted(
        PACKAGE.rglob("*.py"), key=lambda p: (p.parent.relative_to(PACKAGE).parts, p.name != "__init__.py", p.name)
    )
    return {module_name(p): purpose(p) for p in paths if "__pycache__" not in p.parts}


def documented_rows(text: str | None = None) -> dict[str, str]:
    """Module name -> purpose as docs/design.md's module table lists them."""
    text = DESIGN.read_text(encoding="utf-8") if text is None else text
    rows: dict[str, str] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| `dlindex/") else []
        if len(cells) >= 2:
            for name in re.findall(r"`(dlindex/[^`]*)`", cells[0]):
                rows[name] = "|".join(cells[1:]).strip()
    return rows


def normalise(text: str) -> str:
    """Compare purposes without backticks, a trailing period or the first letter's case."""
    text = " ".join(text.replace("`", "").split()).rstrip(".").strip()
    return text[:1].lower() + text[1:]


def table() -> str:
    return "\n".join([HEADER, *(f"| `{name}` | {text} |" for name, text in expected_rows().items())])


START, END = "<!-- module-table:start -->", "<!-- module-table:end -->"


def write_table() -> None:
    """Rewrite the table between the module-table markers of docs/design.md."""
    text = DESIGN.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    DESIGN.write_text(f"{head}{START}\n{table()}\n{END}{tail}", encoding="utf-8")


if __name__ == "__main__":
    import sys

    write_table() if "--write" in sys.argv else print(table())
