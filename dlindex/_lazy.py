"""Lazy package exports (PEP 562): a name is imported from its module on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, exports: dict[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose public names live in the
    submodules ``exports`` maps them to (or in the module a full ``dlindex.`` name gives); a
    name, once imported, is cached in ``namespace``."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        full = module if module.startswith("dlindex.") else f"{package}.{module}"
        value = getattr(importlib.import_module(full), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *exports])

    return __getattr__, __dir__
