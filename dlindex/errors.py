"""Exit codes and the one exception type whose message reaches the user as a single line."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1  # a DlindexError: no catalog, unreadable input, bad manifest
    USAGE = 2  # typer's own: unknown option, bad value, conflicting flags
    PARTIAL = 3  # only under --strict: finished, but some inputs were skipped
    INTERRUPTED = 130  # Ctrl-C or SIGTERM: the catalog is consistent, rerun to finish


class DlindexError(Exception):
    """An error caused by the user's input or environment; str(self) is shown as one line."""

    exit_code: ExitCode = ExitCode.ERROR


class CatalogError(DlindexError):
    """The catalog file is missing, unreadable, foreign or from a newer dlindex."""


class InputError(DlindexError):
    """A command-line value or input file that dlindex cannot use."""


class Interrupted(DlindexError):
    """The user asked us to stop (SIGINT/SIGTERM); work done so far is committed."""

    exit_code = ExitCode.INTERRUPTED
