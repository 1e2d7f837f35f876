"""What a ``features import`` file is read into, and the checks every reader of one shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dlindex.errors import InputError


@dataclass(frozen=True)
class Loaded:
    """What a file holds: keys (ids, or a list of paths) and an (n, dim) float array."""

    keys: npt.NDArray[np.int64] | list[str]
    vectors: npt.NDArray[np.floating[Any]]


def one_line(e: BaseException) -> str:
    """An exception as one short line for an error message."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300]


def check_rows(n: int, max_rows: int | None, where: str) -> None:
    """Refuse a file claiming more vectors than the catalog has samples, before reading them."""
    if max_rows is not None and n > max_rows:
        raise InputError(
            f"{where}: {n:,} vectors, but the catalog has {max_rows:,} samples (one vector a sample); "
            "nothing was imported"
        )
