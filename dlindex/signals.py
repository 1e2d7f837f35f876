"""SIGTERM handled like Ctrl-C by the long-running commands (scan, features compute)."""

from __future__ import annotations

import signal
from collections.abc import Callable


def sigterm_as_interrupt() -> Callable[[], None]:
    """Make SIGTERM raise KeyboardInterrupt, so a killed run stops the way Ctrl-C stops it
    (keep what is committed, record the interruption); returns the function that restores
    the previous handler."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, previous)
