"""Exit codes and the one exception type whose message reaches the user as a single line."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1  # a DlindexError: no catalog, unreadable input, bad manifest
    USAGE = 2  # typer's own: unknown option, bad value, conflicting flags
    PARTIAL = 3  # only under --strict: finished, but some inputs were skipped
    DISK_FULL = 4  # no space (or quota) left where dlindex writes; nothing half-written, rerun
    BUSY = 5  # another process held the catalog's write lock past --wait; rerun later
    DAMAGED = 6  # the catalog file is damaged; see `dlindex check` and docs/reliability.md
    INTERRUPTED = 130  # Ctrl-C or SIGTERM: the catalog is consistent, rerun to finish


class DlindexError(Exception):
    """An error caused by the user's input or environment; str(self) is shown as one line."""

    exit_code: ExitCode = ExitCode.ERROR


class CatalogError(DlindexError):
    """The catalog file is missing, unreadable, foreign or from a newer dlindex."""


class ReadOnlyCatalogError(CatalogError):
    """A write was asked of a catalog opened read-only (read-only file, folder or mount)."""


class CatalogBusyError(CatalogError):
    """Another process kept the write lock for longer than we were willing to wait."""

    exit_code = ExitCode.BUSY


class CatalogConnectionLost(CatalogError):
    """The server of a server catalog went away mid-command (stopped, crashed, network)."""


class DamagedCatalogError(CatalogError):
    """The catalog file is damaged (corrupt pages, missing tables): nothing is written to it."""

    exit_code = ExitCode.DAMAGED


class DiskFullError(DlindexError):
    """No space (or quota) left on the filesystem of a file dlindex was writing."""

    exit_code = ExitCode.DISK_FULL


# A statement a catalog refused, in the DB-API's terms (PEP 249: DatabaseError, IntegrityError,
# OperationalError). A server catalog raises these; a file catalog raises sqlite3's own (no
# translation on the hot path), so code that catches either uses dlindex.catalog.backend's
# SQL_ERRORS, INTEGRITY_ERRORS, OPERATIONAL_ERRORS and CLOSED_ERRORS.
class CatalogSQLError(CatalogError):
    """A statement the catalog refused (a bug, or a state nothing below names)."""


class CatalogIntegrityError(CatalogSQLError):
    """A row a constraint refused: a duplicate key, a foreign key to no row."""


class CatalogOperationalError(CatalogSQLError):
    """The catalog could not run a statement: locked, full, read-only, cancelled."""


class CatalogClosedError(CatalogSQLError):
    """A statement on a connection that was already closed."""


class CatalogLockTimeout(CatalogOperationalError, CatalogBusyError):
    """Another transaction held the rows a statement needs for longer than --wait."""

    exit_code = ExitCode.BUSY


class CatalogFullError(CatalogOperationalError, DiskFullError):
    """The catalog's storage (a server's disk, its memory) has no room for the write."""

    exit_code = ExitCode.DISK_FULL


class CatalogReadOnlySQLError(CatalogOperationalError, ReadOnlyCatalogError):
    """A write on a catalog that accepts only reads (a read-only transaction or role)."""


class InputError(DlindexError):
    """A command-line value or input file that dlindex cannot use."""


class UsageError(InputError):
    """An option value that is not one of its choices: exit 2 like typer's own, in one line."""

    exit_code = ExitCode.USAGE


class Interrupted(DlindexError):
    """The user asked us to stop (SIGINT/SIGTERM); work done so far is committed."""

    exit_code = ExitCode.INTERRUPTED


class DlindexWarning(UserWarning):
    """Something the user should know that does not stop the command (shown as one line)."""


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'label'?)`` for a near miss of one of ``choices`` (difflib), else ``""``."""
    close = difflib.get_close_matches(value, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
