"""Catalog versions: one numbered version per command that changed the catalog, and tags.

A command that writes (scan, mark, merge, features import, roots move) runs inside
``Catalog.versioned(command)``. Its first write transaction opens the version row, each later
one moves the version's ``last_change`` to the state it commits, and at its end the version
is closed with what the command said it did, or dropped when it changed nothing. A version is
the state its ``last_change`` names: ``--at 7`` reads the catalog as version 7 left it
(dlindex.catalog.as_of), even when another command's writes fell inside its span.
A command killed part way leaves its version unfinished with the states it did commit; the
next versioned command closes it as ``interrupted`` (nothing it committed is undone).
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from dlindex.catalog.backend import SQL_ERRORS
from dlindex.errors import DlindexError, InputError
from dlindex.pids import pid_alive

if TYPE_CHECKING:
    from dlindex.catalog.backend import Connection


class Catalog(Protocol):
    """What versions use of a dlindex.catalog.connection.Catalog (which imports this module)."""

    open_version: OpenVersion | None

    def write_transaction(self, *, bookkeeping: bool = False) -> AbstractContextManager[Connection]: ...
    def read(self, sql: str, params: Mapping[str, Any] = ..., /) -> Iterator[tuple[Any, ...]]: ...


# The state this transaction makes: the counter moved at its start (Catalog.write_transaction).
_OPEN = """INSERT INTO versions (command, started_at, first_change, last_change, pid, host)
    SELECT :command, :now, counter - 1, counter, :pid, :host FROM catalog_changes WHERE id = 1 RETURNING id"""
_TOUCH = "UPDATE versions SET last_change = (SELECT counter FROM catalog_changes WHERE id = 1) WHERE id = :id"
_CLOSE = "UPDATE versions SET finished_at = :now, summary = :summary WHERE id = :id"
_SPAN = "SELECT first_change, last_change FROM versions WHERE id = :id"
# Did anything a version can show change in (first, last]? By index and key, never the whole catalog.
_CHANGED = """SELECT EXISTS (SELECT 1 FROM image_metadata WHERE valid_from > :first AND valid_from <= :last)
    OR EXISTS (SELECT 1 FROM image_history WHERE valid_to > :first AND valid_to <= :last)"""
_DROP = "DELETE FROM versions WHERE id = :id AND NOT EXISTS (SELECT 1 FROM version_tags WHERE version = :id)"
_UNFINISHED = "SELECT id, pid, host FROM versions WHERE finished_at IS NULL"
_ABANDON = "UPDATE versions SET finished_at = :now, summary = :summary WHERE id = :id AND finished_at IS NULL"
_LIST = """SELECT v.id, v.command, v.started_at, v.finished_at, v.first_change, v.last_change, v.summary,
        (SELECT group_concat(name, ',') FROM version_tags t WHERE t.version = v.id) AS tags
    FROM versions v WHERE v.id > :after ORDER BY v.id"""
_EXISTS = "SELECT finished_at FROM versions WHERE id = :id"
_EXISTS_SPAN = "SELECT finished_at, last_change FROM versions WHERE id = :id"
_LATEST_FINISHED = "SELECT max(id) FROM versions WHERE finished_at IS NOT NULL"
_TAG = """INSERT INTO version_tags (name, version, tagged_at) VALUES (:name, :version, :now)
    ON CONFLICT (name) DO UPDATE SET version = excluded.version, tagged_at = excluded.tagged_at"""
_TAGGED = "SELECT version FROM version_tags WHERE name = :name"
_UNTAG = "DELETE FROM version_tags WHERE name = :name"
# A tag is a name a shell passes unquoted and a version number never is: it starts with a letter.
_TAG_NAME = re.compile(r"[A-Za-z][A-Za-z0-9._+-]{0,99}")
_RESERVED = ("latest",)


@dataclass
class OpenVersion:
    """The version a running command writes: opened by its first write transaction."""

    command: str
    id: int | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    keep: bool = False  # the command changed what history does not hold (vectors): keep it anyway

    def touch(self, conn: Connection) -> None:
        """Inside a write transaction, after the counter moved: the version spans its state."""
        if self.id is None:
            close_abandoned(conn)
            opened = {"command": self.command, "now": _now(), "pid": os.getpid(), "host": socket.gethostname()}
            row = conn.execute(_OPEN, opened).fetchone()
            self.id = int(row[0])
        else:
            conn.execute(_TOUCH, {"id": self.id})


@dataclass(frozen=True)
class Version:
    """One row of ``dlindex versions``."""

    id: int
    command: str
    started_at: str
    finished_at: str | None
    first_change: int
    last_change: int
    summary: dict[str, Any] | None
    tags: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.id, "command": self.command, "started_at": self.started_at,
            "finished_at": self.finished_at, "state": self.last_change, "tags": list(self.tags),
            "summary": self.summary,
        }  # fmt: skip


@contextmanager
def versioned(catalog: Catalog, command: str) -> Iterator[OpenVersion]:
    """``Catalog.versioned``: a nested block is part of the outer command's version."""
    if catalog.open_version is not None:
        yield catalog.open_version
        return
    version = catalog.open_version = OpenVersion(command)
    try:
        yield version
    except BaseException as e:
        catalog.open_version = None
        with suppress(*SQL_ERRORS, DlindexError):  # the error being raised is the one to report
            close(catalog, version, failed=e)
        raise
    catalog.open_version = None
    close(catalog, version)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def close(catalog: Catalog, version: OpenVersion, *, failed: BaseException | None = None) -> None:
    """End a version: its summary and end time, or no version at all where nothing changed."""
    if version.id is None:
        return
    summary = dict(version.summary)
    if failed is not None:
        summary["interrupted"] = type(failed).__name__
    with catalog.write_transaction(bookkeeping=True) as conn:
        first, last = conn.execute(_SPAN, {"id": version.id}).fetchone()
        changed = version.keep or bool(conn.execute(_CHANGED, {"first": first, "last": last}).fetchone()[0])
        if not changed:
            conn.execute(_DROP, {"id": version.id})
        else:
            conn.execute(_CLOSE, {"now": _now(), "summary": json.dumps(summary, sort_keys=True), "id": version.id})


def close_abandoned(conn: Connection) -> None:
    """Versions whose command died (kill -9) before closing them, on this host: closed as
    interrupted, with every state they committed (inside a write transaction)."""
    here = socket.gethostname()
    for vid, pid, host in conn.execute(_UNFINISHED).fetchall():
        if host == here and pid != os.getpid() and not pid_alive(int(pid)):
            conn.execute(_ABANDON, {"now": _now(), "summary": json.dumps({"interrupted": "killed"}), "id": vid})


def list_versions(catalog: Catalog, *, after: int = 0) -> Iterator[Version]:
    for vid, command, started, finished, first, last, summary, tags in catalog.read(_LIST, {"after": after}):
        yield Version(
            int(vid), str(command), str(started), finished, int(first), int(last),
            json.loads(summary) if summary else None, tuple(sorted(tags.split(","))) if tags else (),
        )  # fmt: skip


def tag(catalog: Catalog, name: str, version: int | None = None) -> int:
    """Name ``version`` (default: the latest finished one); a tag already given moves. Returns the version."""
    check_tag_name(name)
    with catalog.write_transaction(bookkeeping=True) as conn:
        if version is None:
            found = conn.execute(_LATEST_FINISHED).fetchone()[0]
            if found is None:
                raise InputError("this catalog has no finished version to tag yet: scan something first")
            version = int(found)
        row = conn.execute(_EXISTS, {"id": int(version)}).fetchone()
        if row is None:
            raise InputError(f"no version {version} in this catalog: dlindex versions lists them")
        if row[0] is None:
            raise InputError(f"version {version} is still being written: tag it when its command has finished")
        conn.execute(_TAG, {"name": name, "version": int(version), "now": _now()})
    return int(version)


def untag(catalog: Catalog, name: str) -> int:
    """Remove tag ``name``; returns the version it named. The version itself stays."""
    check_tag_name(name)
    with catalog.write_transaction(bookkeeping=True) as conn:
        row = conn.execute(_TAGGED, {"name": name}).fetchone()
        if row is None:
            raise InputError(f"no tag {name!r} in this catalog")
        conn.execute(_UNTAG, {"name": name})
    return int(row[0])


def check_tag_name(name: str) -> None:
    if not _TAG_NAME.fullmatch(name) or name in _RESERVED:
        shown = name[:60]
        raise InputError(
            f"tag {shown!r}: a tag starts with a letter and has at most 100 letters, digits and . _ + - "
            f"({', '.join(_RESERVED)} is taken)"
        )


def summary_of(counts: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers a command reports, without the zeros: what ``versions`` shows."""
    return {k: v for k, v in counts.items() if isinstance(v, int | float | str) and v and not isinstance(v, bool)}


_FLOOR = "UPDATE version_floor SET state = :state WHERE id = 1 AND state < :state"
_TAGGED_BEFORE = "SELECT name, version FROM version_tags WHERE version < :id ORDER BY version, name"
_DROP_BEFORE = "DELETE FROM versions WHERE id < :id"
_HISTORY_BATCH = """DELETE FROM image_history WHERE valid_to <= :floor AND (valid_to, id) IN
    (SELECT valid_to, id FROM image_history WHERE valid_to <= :floor LIMIT :batch)"""
_LABEL_HISTORY = "DELETE FROM label_history WHERE valid_to <= :floor"
PRUNE_BATCH = 100_000  # history rows a transaction deletes: the write lock is held briefly, the log stays small


@dataclass(frozen=True)
class Pruned:
    """What ``prune_before`` removed."""

    version: int  # the oldest version kept
    state: int  # the oldest state --at can read now
    versions: int
    history_rows: int

    def as_dict(self) -> dict[str, int]:
        return {
            "version": self.version,
            "state": self.state,
            "versions": self.versions,
            "history_rows": self.history_rows,
        }


def prune_before(catalog: Catalog, version: int) -> Pruned:
    """Forget the versions before ``version`` and the history only they need: ``--at`` reads
    ``version`` and later as before, earlier ones are refused. Refused (nothing written) while a
    tag names an earlier version. The floor moves first, then the history goes in batches, so a
    stop part way leaves every kept state whole, and running it again finishes it."""
    with catalog.write_transaction(bookkeeping=True) as conn:
        row = conn.execute(_EXISTS_SPAN, {"id": int(version)}).fetchone()
        if row is None:
            raise InputError(f"no version {version} in this catalog: dlindex versions lists them")
        if row[0] is None:
            raise InputError(f"version {version} is still being written: prune when its command has finished")
        tagged = conn.execute(_TAGGED_BEFORE, {"id": int(version)}).fetchall()
        if tagged:
            names = ", ".join(f"{n} (version {v})" for n, v in tagged[:5])
            raise InputError(f"tags name versions before {version}: {names}; move or delete them first (dlindex tag)")
        floor = int(row[1])
        conn.execute(_FLOOR, {"state": floor})
        dropped = conn.execute(_DROP_BEFORE, {"id": int(version)}).rowcount
    removed = 0
    while True:
        with catalog.write_transaction(bookkeeping=True) as conn:
            n = conn.execute(_HISTORY_BATCH, {"floor": floor, "batch": PRUNE_BATCH}).rowcount
            if n < PRUNE_BATCH:
                conn.execute(_LABEL_HISTORY, {"floor": floor})
        removed += max(n, 0)
        if n < PRUNE_BATCH:
            return Pruned(int(version), floor, max(int(dropped), 0), removed)


def command_text(*words: str) -> str:
    """A version's command as ``versions`` shows it: valid UTF-8 whatever a path held, bounded."""
    text = " ".join(words).encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= 300 else text[:299] + "…"
