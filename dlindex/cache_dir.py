"""This user's cache folder for dlindex on this machine: ``$XDG_CACHE_HOME/dlindex``, else
``~/.cache/dlindex`` (matrix files of server catalogs, translated SQL, index advice, watch locks)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/dlindex``, or ``~/.cache/dlindex`` where it is unset or empty."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dlindex"
