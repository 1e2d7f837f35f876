"""The shape of the code: no SQL in the CLI, no import cycle between modules or packages, and an
export read back without the catalog."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dlindex"

# An SQL statement, not prose that happens to say "select" (the selection options do).
SQL = re.compile(
    r"\bSELECT\b.+\bFROM\b|\bINSERT\s+(OR\s+\w+\s+)?INTO\b|\bUPDATE\s+\w+\s+SET\b|\bDELETE\s+FROM\b"
    r"|\b(CREATE|DROP)\s+(TABLE|INDEX|VIEW|TRIGGER)\b|\bPRAGMA\s+\w+\s*=",
    re.IGNORECASE | re.DOTALL,
)


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def _strings(tree: ast.AST) -> Iterator[ast.Constant]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node


def test_the_cli_holds_no_sql() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:60]!r}"
        for name, path in MODULES.items()
        if name.startswith("dlindex.cli")
        for node in _strings(ast.parse(path.read_text(encoding="utf-8")))
        if SQL.search(node.value)
    ]
    assert not found, "SQL belongs in the library, not in dlindex/cli/:\n" + "\n".join(found)


def _resolve(name: str) -> str | None:
    """The dlindex module an import names: itself, or the longest prefix that is one."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _absolute(path: Path, module: str | None, level: int) -> str:
    """The absolute module a ``from`` import names; relative ones resolved against ``path``
    (ruff bans them, but a cycle must not hide behind one)."""
    if level == 0:
        return module or ""
    package = _module(path).split(".") if path.name == "__init__.py" else _module(path).split(".")[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _imports(path: Path) -> set[str]:
    """Every dlindex module ``path`` imports: at the top, inside functions and under TYPE_CHECKING."""
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # `from dlindex.cli import scan` imports the module dlindex.cli.scan, not just the package
            base = _absolute(path, node.module, node.level)
            names = [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            if name == "dlindex" or name.startswith("dlindex."):
                target = _resolve(name)
                if target is not None:
                    targets.add(target)
    return targets


def import_graph() -> dict[str, set[str]]:
    return {name: _imports(path) - {name} for name, path in MODULES.items()}


def package_graph() -> dict[str, set[str]]:
    """The graph between dlindex.X nodes: dlindex.catalog.sqlite counts as dlindex.catalog."""

    def top(name: str) -> str:
        return ".".join(name.split(".")[:2])

    graph: dict[str, set[str]] = {}
    for source, targets in import_graph().items():
        graph.setdefault(top(source), set()).update(top(t) for t in targets)
    return {node: targets - {node} for node, targets in graph.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one node (Tarjan), each as a cycle path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(_cycle_path(graph, set(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _cycle_path(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One cycle through a strongly connected component: start -> ... -> start."""
    start = min(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:  # breadth first, so the path shown is a shortest one back to start
        following = []
        for node in frontier:
            for target in sorted(graph.get(node, set()) & component):
                if target == start:
                    path = [start]
                    while node != start:
                        path.append(node)
                        node = previous[node]
                    return [start, *reversed(path[1:]), start]
                if target not in previous:
                    previous[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {component}")


def test_cycle_finder_reports_the_path() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def _message(found: list[list[str]]) -> str:
    return "import cycles (imports inside functions and under TYPE_CHECKING count):\n" + "\n".join(
        " -> ".join(path) for path in found
    )


def test_module_import_graph_has_no_cycle() -> None:
    found = cycles(import_graph())
    assert not found, _message(found)


def test_package_import_graph_has_no_cycle() -> None:
    found = cycles(package_graph())
    assert not found, _message(found)


def test_relative_imports_resolve_to_their_modules() -> None:
    paths = PACKAGE / "catalog" / "paths.py"
    assert _absolute(paths, "sqlite", 1) == "dlindex.catalog.sqlite"  # from .sqlite import ...
    assert _absolute(paths, None, 2) == "dlindex"  # from .. import faults
    assert _absolute(PACKAGE / "catalog" / "__init__.py", "paths", 1) == "dlindex.catalog.paths"
    assert _absolute(paths, "dlindex.errors", 0) == "dlindex.errors"


# --- the layer order: a module imports only its own layer or lower ----------------------------

# Low to high. A module belongs to the layer of the longest entry that names it or a package
# above it ("dlindex" itself names only the package root). Packages that are not on every branch
# yet (exported/, loader/) are here already, so the merged tree is checked too. Every import
# counts, as for the cycles: at the top, in a function, and under TYPE_CHECKING (a typing-only
# import of a higher layer's type is still a lower module that knows a higher one; where a type
# must cross, the lower layer takes plain values or a Protocol of its own).
LAYERS: tuple[tuple[str, ...], ...] = (
    # base: leaves every layer may use
    (
        "dlindex.errors",
        "dlindex.faults",
        "dlindex._lazy",
        "dlindex.version",
        "dlindex.orientation",
        "dlindex.pids",
        "dlindex.cache_dir",
        "dlindex.demo",
    ),
    ("dlindex.exported",),  # an export on disk read back, without the catalog
    ("dlindex.catalog",),
    ("dlindex.query", "dlindex.querylog"),
    ("dlindex.engines",),  # where work runs (fork pool, Ray, parts I/N): used by the next layer
    (
        "dlindex.scan",
        "dlindex.features",
        "dlindex.quality",
        "dlindex.export",
        "dlindex.advisor",
        "dlindex.stats",
        "dlindex.text",
    ),
    ("dlindex.loader",),  # the training loader: datasets over an export, the catalog loader
    ("dlindex.torch", "dlindex"),  # the facade and the package root (lazy re-exports of every layer)
    ("dlindex.cli", "dlindex.__main__"),
)


def layer_of(module: str) -> int | None:
    """The index in LAYERS of ``module``'s layer; None if no entry names it."""
    best: tuple[int, int] | None = None  # (length of the entry, layer)
    for number, entries in enumerate(LAYERS):
        for entry in entries:
            names = module == entry if entry == "dlindex" else module == entry or module.startswith(entry + ".")
            if names and (best is None or len(entry) > best[0]):
                best = (len(entry), number)
    return None if best is None else best[1]


def layer_violations() -> list[str]:
    found = []
    for name, path in MODULES.items():
        own = layer_of(name)
        for target in sorted(_imports(path) - {name}):
            theirs = layer_of(target)
            if own is not None and theirs is not None and theirs > own:
                found.append(f"{name} ({LAYERS[own][0]}'s layer) imports {target} ({LAYERS[theirs][0]}'s layer)")
    return found


def test_every_module_has_a_layer() -> None:
    unplaced = [name for name in MODULES if layer_of(name) is None]
    assert not unplaced, "modules no entry of LAYERS names (place them in tests/test_structure.py):\n" + "\n".join(
        unplaced
    )


def test_layer_finder() -> None:
    assert layer_of("dlindex") == layer_of("dlindex.torch") == 7
    assert layer_of("dlindex.catalog.sqlite") == layer_of("dlindex.catalog") == 2
    assert layer_of("dlindex.cli.scan") == 8 and layer_of("dlindex.errors") == 0
    assert layer_of("dlindex.exportedx") is None and layer_of("dlindex.exported.index") == 1


def test_no_module_imports_a_higher_layer() -> None:
    found = layer_violations()
    assert not found, "imports of a higher layer (at the top, in functions and under TYPE_CHECKING):\n" + (
        "\n".join(found)
    )


# --- module size ------------------------------------------------------------------------------

MAX_LINES = 400  # a module a reader holds in mind at once (STYLE.md: "under ~400 lines")


def test_every_module_is_under_400_lines() -> None:
    lines = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in MODULES.values()}
    long = {name: n for name, n in lines.items() if n >= MAX_LINES}
    assert not long, f"modules of {MAX_LINES} lines or more (split them along a seam): {long}"


# The read side of an export: whatever opens one (the loader, --verify) needs none of these.
WRITE_SIDE = ("dlindex.catalog", "dlindex.query", "dlindex.export")


def _under(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def reachable(graph: dict[str, set[str]], start: set[str]) -> dict[str, str]:
    """Every module ``start`` imports, directly or not, each with the module that imports it."""
    found: dict[str, str] = {}
    frontier = sorted(start)
    while frontier:
        node = frontier.pop()
        for target in sorted(graph.get(node, ())):
            if target not in found and target not in start:
                found[target] = node
                frontier.append(target)
    return found


def test_reachable_follows_imports_to_their_end() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a"}}
    assert reachable(graph, {"a"}) == {"b": "a", "c": "b"}


def test_the_export_read_side_imports_no_catalog_query_or_export_module() -> None:
    graph = import_graph()
    wing = {name for name in graph if _under(name, ("dlindex.exported",))}
    assert "dlindex.exported.reader" in wing and "dlindex.exported.verify" in wing
    found = {t: by for t, by in reachable(graph, wing).items() if _under(t, WRITE_SIDE)}
    assert not found, "dlindex.exported must not import (at the top, in functions or for types): " + ", ".join(
        f"{target} (from {by})" for target, by in sorted(found.items())
    )


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wds and a jsonl export of a few images (one catalog, SQLite)."""
    from PIL import Image

    from dlindex import Catalog, ScanOptions, scan_tree
    from dlindex.export import ExportOptions, export_catalog

    base = tmp_path_factory.mktemp("exports")
    for i in range(6):
        path = base / "imgs" / ("ant", "bee")[i % 2] / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8 + i, 8)).save(path)
    with Catalog(base / "c.db", create=True) as catalog:
        scan_tree(catalog, base / "imgs", ScanOptions(workers=1))
        export_catalog(catalog, base / "wds", ExportOptions(format="wds", shard_size=2))
        export_catalog(catalog, base / "jsonl", ExportOptions(format="jsonl"))
    return base


def _loaded(code: str) -> list[str]:
    """The dlindex modules a fresh interpreter has loaded after running ``code``."""
    code += "\nimport sys\nprint(' '.join(sorted(m for m in sys.modules if m.startswith('dlindex'))))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.parametrize(
    "code",
    [
        "import dlindex.loader",
        "from dlindex.loader import WdsDataset\nassert len(list(WdsDataset({wds!r}, decode=False))) == 6",
        "from dlindex.loader import ManifestDataset\nd = ManifestDataset({jsonl!r})\nassert len(d) == 6 and d[5][0].size[1] == 8",
        "from dlindex.loader import iter_tar, rank_and_world\nrank_and_world()",
        "from dlindex.exported.verify import verify_export\nassert verify_export({wds!r}).ok",
    ],
    ids=["import", "wds", "manifest", "names", "verify"],
)
def test_reading_an_export_back_loads_no_catalog_query_or_export_module(exports: Path, code: str) -> None:
    loaded = _loaded(code.format(wds=str(exports / "wds"), jsonl=str(exports / "jsonl")))
    assert loaded, "the code loaded no dlindex module"
    found = [m for m in loaded if _under(m, WRITE_SIDE)]
    assert not found, f"reading an export back loaded {found}"
