"""PostgreSQL forms of dlindex's statements kept on disk, so a command does not parse again what
an earlier one on this machine already translated (importing sqlglot and parsing a statement
cost a short command more than its work: measured in issue #33).

One JSON file per dlindex rule set and sqlglot version, ``$XDG_CACHE_HOME/dlindex/pg-sql-<key>.json``;
read once per process, written back (merged with what other processes added, then renamed
into place) when the process ends. A file that cannot be read or written is ignored: the cache
is an optimisation, never a reason to fail.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import tempfile
from contextlib import suppress
from pathlib import Path
from typing import Any

from dlindex.cache_dir import cache_dir
from dlindex.catalog.postgres.statement import JsonParam, Translated

MAX_ENTRIES = 4096  # logged statements the index advisor replays must not grow it without bound
_loaded: dict[str, Any] | None = None
_added: dict[str, Any] = {}


def _path() -> Path:
    from importlib import metadata  # ~10 ms to import: only when a statement is translated

    rules = Path(__file__).with_name("transpile.py").read_bytes()
    try:
        version = metadata.version("sqlglot")
    except metadata.PackageNotFoundError:
        version = "?"
    key = hashlib.sha256(rules + version.encode()).hexdigest()[:16]
    return cache_dir() / f"pg-sql-{key}.json"


def _read(path: Path) -> dict[str, Any]:
    with suppress(OSError, ValueError):
        found = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(found, dict):
            return found
    return {}


def lookup(sql: str) -> Translated | None:
    """The remembered PostgreSQL form of ``sql``, or None."""
    global _loaded
    if _loaded is None:
        _loaded = _read(_path())
    entry = _loaded.get(sql) or _added.get(sql)
    if entry is None:
        return None
    text, params, named, names = entry
    return Translated(text, tuple(JsonParam(*p) for p in params), named, tuple(names))


def remember(sql: str, translated: Translated) -> None:
    """Keep ``translated`` for the next processes (written when this one ends)."""
    if not _added:
        atexit.register(_write)
    params = [[p.key, p.slot, p.empty_type] for p in translated.json_params]
    _added[sql] = [translated.text, params, translated.named, list(translated.names)]


def _write() -> None:
    path = _path()
    merged = {**_read(path), **_added}
    if len(merged) > MAX_ENTRIES:
        merged = dict(list(_added.items())[-MAX_ENTRIES:])
    with suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".pg-sql-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(merged, out)
            os.replace(tmp, path)
        finally:
            with suppress(OSError):
                os.unlink(tmp)
