"""What an unchanged rescan remembers of each folder unit, so the next one skips the catalog.

The fast path (dlindex.scan.quick) compares find's lines of a unit with lines SQLite prints of
the unit's rows: at millions of files, SQLite's printing and the comparison cost more than
find itself. A unit found unchanged is remembered in ``scan_digests``: a digest of everything
the comparison read on find's side (its lines, the unit's range, label, split and the walk's
options) and its answer. The next rescan that gets the same digest from find gives the same
answer without reading the rows, provided the rows are the ones compared; that is kept true
by the catalog itself, not by dlindex's writers:

- the catalog's triggers (migrations.m016_scan_digests) delete a unit's digest whenever any
  writer inserts, deletes or changes one of its rows in a column the comparison reads; a
  digest is used only where those triggers are present exactly as dlindex made them;
- a writer that bypasses triggers (``INSERT OR REPLACE`` deletes rows without firing them) is
  caught by the unit's row count, read from the index at each use;
- a unit's row is written (or kept) before its rows are compared, and its answer is stored
  only into that same row at the end: a write to the unit's rows in between deletes the row
  (the triggers), so the answer is not kept.

A digest that does not match only costs the full comparison; a digest never answers for rows
other than those it was made from.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Any

import xxhash

from dlindex.catalog.sqlite.migrations import SCAN_DIGESTS

# A new meaning of the comparison (quick._LINES, quick._compare) takes a new tag: the old
# digests then match nothing.
_TAG = b"dlindex scan digest 1\0"
_TRIGGERS = "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'image_metadata'"
_OWN_TRIGGERS = {
    statement.split()[2]: statement for statement in SCAN_DIGESTS if statement.startswith("CREATE TRIGGER")
}
_READ = "SELECT start, stop, digest FROM scan_digests WHERE root_id = ?"
_ANSWER = "SELECT files, skips FROM scan_digests WHERE root_id = ? AND start = ? AND digest = ?"
_COUNT = "SELECT count(*) FROM image_metadata WHERE root_id = ? AND file_path >= ?"
_COUNT_BELOW = _COUNT + " AND file_path < ?"
_DROP = "DELETE FROM scan_digests WHERE root_id = ? AND start = ?"
_OPEN = "INSERT INTO scan_digests (root_id, start, stop, digest, files, skips) VALUES (?, ?, ?, ?, -1, '{}')"
_STORE = """UPDATE scan_digests SET digest = ?, files = ?, skips = ?
    WHERE root_id = ? AND start = ? AND stop IS ? AND digest = ?"""
_WAIT_S = 2.0  # for the write lock: a scan is not held up by a long writer, it only compares

Answer = tuple[int, dict[str, int]]  # (files, skipped entries by reason): quick._compare's


def unit_digest(segment: bytes, inputs: Mapping[str, Any]) -> bytes:
    """The digest of one comparison: find's lines of the unit and every other input."""
    h = xxhash.xxh3_128(_TAG)
    h.update(repr(sorted(inputs.items())).encode("utf-8", "surrogateescape"))
    h.update(b"\0")
    h.update(segment)
    return h.digest()


class UnitDigests:
    """The digests of one root's units: opened (one short write transaction) before the units'
    rows are compared, and answers stored (another) after; on a connection of their own, so the
    scan's connection stays in autocommit. Unusable (every call a no-op) where the triggers are
    not dlindex's, or the catalog cannot be written now."""

    def __init__(self, path: str, root_id: int, units: Sequence[tuple[str, str | None]]) -> None:
        self.root_id = root_id
        self.held: dict[str, bytes] = {}  # start -> the digest its row had when opened
        self.remembered = 0  # units with an answer stored by an earlier rescan (may not match)
        self.found: list[tuple[bytes, int, str, int, str, str | None, bytes]] = []
        self.conn: sqlite3.Connection | None = None
        try:
            self.conn = sqlite3.connect(path, isolation_level=None, timeout=_WAIT_S)
            self.conn.execute("BEGIN IMMEDIATE")
            triggers = dict(self.conn.execute(_TRIGGERS).fetchall())
            if any(triggers.get(name) != sql for name, sql in _OWN_TRIGGERS.items()):
                self.close()  # dropped or edited: no digest can be trusted or kept true
                return
            wanted = dict(units)
            for start, stop, digest in self.conn.execute(_READ, (root_id,)).fetchall():
                if start in wanted and wanted[start] == stop:
                    self.held[start] = bytes(digest)
                else:  # another cut of the tree: the digests of a root never overlap
                    self.conn.execute(_DROP, (root_id, start))
            self.remembered = len(self.held)
            # This rescan's own token: another rescan that opens the same row after a writer
            # deleted it must not have its row filled with this one's older answer.
            token = os.urandom(16)
            fresh = [(root_id, start, stop, token) for start, stop in units if start not in self.held]
            self.conn.executemany(_OPEN, fresh)
            self.held.update((start, token) for _, start, _, _ in fresh)
            self.conn.execute("COMMIT")
        except sqlite3.Error:
            self.close()

    @property
    def usable(self) -> bool:
        return self.conn is not None

    def recall(self, start: str, stop: str | None, digest: bytes) -> Answer | None:
        """The answer remembered for this unit and digest, if its row still holds it and the unit
        has as many rows as it had (see the module's note on triggers)."""
        if self.conn is None or self.held.get(start) != digest:
            return None
        try:
            row = self.conn.execute(_ANSWER, (self.root_id, start, digest)).fetchone()
            if row is None:
                return None  # a writer changed the unit's rows since it was opened
            sql, params = (
                (_COUNT, (self.root_id, start)) if stop is None else (_COUNT_BELOW, (self.root_id, start, stop))
            )
            if self.conn.execute(sql, params).fetchone()[0] != row[0]:
                return None
        except sqlite3.Error:
            return None
        return int(row[0]), dict(json.loads(row[1]))

    def remember(self, start: str, stop: str | None, digest: bytes, answer: Answer) -> None:
        """A unit the full comparison found unchanged: stored at commit, into its row as opened."""
        if self.conn is not None and start in self.held:
            skips = json.dumps(answer[1], sort_keys=True)
            self.found.append((digest, answer[0], skips, self.root_id, start, stop, self.held[start]))

    def commit(self) -> None:
        """Store the answers found, each only where its unit's row is still as opened."""
        if self.conn is not None and self.found:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                self.conn.executemany(_STORE, self.found)
                self.conn.execute("COMMIT")
            except sqlite3.Error:  # the lock held past the wait, a full disk: nothing is stored
                pass
        self.close()

    def __enter__(self) -> UnitDigests:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # after commit() a no-op; else nothing found is stored

    def close(self) -> None:
        if self.conn is not None:
            with suppress(sqlite3.Error):
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                self.conn.close()
            self.conn = None
