"""``mark``'s writes: the staged samples updated in one transaction, or in batches by id.

``mark_samples`` (mark.py) stages every record first (``temp.mark_ids``: ids;
``temp.mark_paths``: paths), then calls ``apply_marks``. Up to ``BATCH_SAMPLES`` staged
samples are one write transaction that resolves paths, counts unknown samples and updates the
rows whose values change: all of it or none. A larger mark commits in batches of
``BATCH_SAMPLES`` samples in ascending id order, each batch its own write transaction: the
log (-wal) and the time the write lock is held stay bounded whatever the mark's size (a single
transaction of 10^7 samples spread over a 10^8-row catalog writes ~10 GB of log before it can
commit, and holds the lock for minutes). A batch, once committed, is never undone: a mark
stopped part way (Ctrl-C, a full disk, a lock wait that ran out) says how far it got, and
running it again finishes it, since it changes only the rows whose values still differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dlindex.catalog.sqlite.connect import INT64_MAX, INT64_MIN, rollback
from dlindex.errors import DlindexError, Interrupted

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

# A batch of 2^18 samples writes at most 4 GiB of log (one 16 KiB page each, where every
# sample lies on a page of its own) and ~0.1-0.3 GB where ids are dense; it holds the write
# lock for about a second, so other writers never wait their --wait out behind a big mark.
BATCH_SAMPLES = 1 << 18
# The pages a batch's UPDATE reads stay in SQLite's cache for its unknown-id check, where one runs
# (up to this much; a batch of dense ids spans ~5,000-20,000 pages): a read less per page.
_CACHE_BYTES = 64 << 20
_EXAMPLES = 10

_COUNT_IDS = "SELECT count(*) FROM temp.mark_ids"
_COUNT_PATHS = "SELECT count(*) FROM temp.mark_paths"
_ANY_PATH = "SELECT 1 FROM temp.mark_paths LIMIT 1"
_ROOTS = "SELECT id, path, path_bytes FROM roots"
_CREATE_BATCH = "CREATE TEMP TABLE IF NOT EXISTS mark_batch (id INTEGER PRIMARY KEY)"
_CLEAR_BATCH = "DELETE FROM temp.mark_batch"
_FILL_BATCH = "INSERT INTO temp.mark_batch (id) SELECT id FROM temp.mark_ids WHERE id >= :lo AND id <= :hi"
# The last id of the batch that starts at :lo (none: the rest is the last batch).
_BATCH_END = "SELECT id FROM temp.mark_ids WHERE id >= :lo ORDER BY id LIMIT 1 OFFSET :skip"
_ID_RANGE = "SELECT min(id), max(id) FROM temp.{ids}"
_ROWS_IN = "SELECT count(*) FROM image_metadata WHERE id >= :lo AND id <= :hi"
_UNKNOWN_IDS = (
    "SELECT staged.id FROM temp.{ids} AS staged WHERE NOT EXISTS "
    "(SELECT 1 FROM main.image_metadata WHERE image_metadata.id = staged.id)"
)
# root_id 0 stands for a relative path: it may sit under any root.
_UNKNOWN_PATHS = (
    "SELECT staged.root_id, staged.file_path FROM temp.mark_paths AS staged WHERE NOT EXISTS ("
    "SELECT 1 FROM main.image_metadata WHERE image_metadata.root_id = staged.root_id "
    "AND image_metadata.file_path = staged.file_path) AND (staged.root_id != 0 OR NOT EXISTS ("
    "SELECT 1 FROM main.roots JOIN main.image_metadata ON image_metadata.root_id = roots.id "
    "AND image_metadata.file_path = staged.file_path))"
)
# The samples the staged paths name, added to the staged ids: a sample named by its id and by
# its path, or by two spellings of its path, is one.
_RESOLVE_PATHS = (
    "INSERT OR IGNORE INTO temp.mark_ids (id) "
    "SELECT target.id FROM temp.mark_paths AS staged JOIN main.image_metadata AS target "
    "ON target.root_id = staged.root_id AND target.file_path = staged.file_path "
    "UNION SELECT target.id FROM temp.mark_paths AS staged JOIN main.roots "
    "JOIN main.image_metadata AS target ON target.root_id = roots.id AND target.file_path = staged.file_path "
    "WHERE staged.root_id = 0"
)
# A server catalog takes the row locks of an update in id order first, so writers marking
# overlapping samples at once queue behind each other instead of deadlocking (docs/postgres.md).
_LOCK = "SELECT id FROM image_metadata WHERE id IN (SELECT id FROM temp.{ids}) ORDER BY id FOR UPDATE"
_UPDATE = (
    "UPDATE image_metadata SET {set}, updated_at = CURRENT_TIMESTAMP "
    "WHERE id IN (SELECT id FROM temp.{ids}) AND ({changed})"
)


@dataclass
class Applied:
    """What the writes found and changed (distinct samples)."""

    matched: int = 0
    updated: int = 0
    unknown: int = 0
    examples: list[str] = field(default_factory=list)
    batches: int = 0
    unknown_ids: int = 0  # of ``unknown``: staged ids not in the catalog (the rest are paths)

    def note_unknown(self, name: str, *, is_id: bool) -> None:
        self.unknown += 1
        self.unknown_ids += is_id
        if len(self.examples) < _EXAMPLES:
            self.examples.append(name)


def apply_marks(
    catalog: Catalog, values: dict[str, Any], set_sql: str, changed_sql: str, *, batch: int = BATCH_SAMPLES
) -> Applied:
    """Resolve the staged samples and update them: one transaction up to ``batch`` samples,
    else batches of ``batch`` samples in id order, each committed on its own."""
    conn = catalog.conn
    staged = int(conn.execute(_COUNT_IDS).fetchone()[0]) + int(conn.execute(_COUNT_PATHS).fetchone()[0])
    update = _UPDATE.replace("{set}", set_sql).replace("{changed}", changed_sql)
    done = Applied()
    with catalog.backend.page_cache(conn, _CACHE_BYTES):
        if staged <= batch:
            return _in_one(catalog, update, values, done)
        return _in_batches(catalog, update, values, done, batch)


def _in_one(catalog: Catalog, update: str, values: dict[str, Any], done: Applied) -> Applied:
    """All or nothing: paths resolved, rows updated and unknowns counted in one transaction."""
    with catalog.write_transaction() as tx:
        paths = Applied()
        _resolve_paths(tx, paths)
        staged = int(tx.execute(_COUNT_IDS).fetchone()[0])
        done.updated = _update(catalog, tx, "mark_ids", update, values)
        if done.updated < staged:  # else every staged id named a row that changed: none unknown
            _check_unknown(tx, "mark_ids", staged, done)
        done.unknown += paths.unknown  # unknown ids are listed first, then paths
        done.examples = (done.examples + paths.examples)[:_EXAMPLES]
        done.matched = staged - done.unknown_ids
    done.batches = 1
    return done


def _in_batches(catalog: Catalog, update: str, values: dict[str, Any], done: Applied, batch: int) -> Applied:
    """Batches of ``batch`` staged samples in id order, each its own write transaction that
    updates and then counts its unknown ids, where some staged id changed no row."""
    conn = catalog.conn
    # Paths first become the ids they name now (a read: only temporary tables are written).
    conn.execute("BEGIN")
    try:
        _resolve_paths(conn, done)
        conn.execute("COMMIT")
    except BaseException:
        rollback(conn)
        raise
    total = int(conn.execute(_COUNT_IDS).fetchone()[0])
    conn.execute(_CREATE_BATCH)
    lo = INT64_MIN
    written = 0  # staged samples in committed batches
    try:
        while written < total:
            with catalog.write_transaction() as tx:
                row = tx.execute(_BATCH_END, {"lo": lo, "skip": batch - 1}).fetchone()
                hi = INT64_MAX if row is None else int(row[0])
                tx.execute(_CLEAR_BATCH)
                size = tx.execute(_FILL_BATCH, {"lo": lo, "hi": hi}).rowcount
                changed = _update(catalog, tx, "mark_batch", update, values)
                if changed < size:  # some id changed nothing: it may name no row
                    _check_unknown(tx, "mark_batch", size, done)
                done.updated += changed
            written += size
            done.batches += 1
            if hi == INT64_MAX:
                break
            lo = hi + 1
    except KeyboardInterrupt:
        if not written:
            raise
        raise Interrupted(_stopped("mark interrupted", written, total, batch)) from None
    except DlindexError as e:
        if written:
            e.args = (_stopped(str(e), written, total, batch), *e.args[1:])
        raise
    finally:
        catalog.backend.end_temp_table(conn, "mark_batch")
    done.matched = total - done.unknown_ids
    return done


def _stopped(what: str, written: int, total: int, batch: int) -> str:
    return (
        f"{what}; {written:,} of {total:,} samples were already committed (a mark of more than {batch:,} "
        "commits in batches, in id order) and stay so: run the same mark again to finish, it changes only what is left"
    )


def _check_unknown(tx: Any, table: str, size: int, done: Applied) -> None:
    """Note the staged ids of ``table`` (``size`` of them) that name no row. Ids that fill a
    range (a batch that landed together) are all known if the catalog has as many rows in that
    range: one pass over its leaf pages instead of a second b-tree lookup per id."""
    lo, hi = tx.execute(_ID_RANGE.replace("{ids}", table)).fetchone()
    if lo is not None and hi - lo + 1 == size and int(tx.execute(_ROWS_IN, {"lo": lo, "hi": hi}).fetchone()[0]) == size:
        return
    _unknown_ids(tx, table, done)


def _unknown_ids(tx: Any, table: str, done: Applied) -> None:
    for (id_,) in tx.execute(_UNKNOWN_IDS.replace("{ids}", table)):
        done.note_unknown(str(id_), is_id=True)


def _resolve_paths(tx: Any, done: Applied) -> None:
    """Count the staged paths that name no sample, then add the samples the others name to
    temp.mark_ids."""
    if not tx.execute(_ANY_PATH).fetchone():
        return
    roots = {id_: text for id_, text, _ in tx.execute(_ROOTS)}
    for root_id, file_path in tx.execute(_UNKNOWN_PATHS):
        done.note_unknown(roots[root_id].rstrip("/") + "/" + file_path if root_id in roots else file_path, is_id=False)
    tx.execute(_RESOLVE_PATHS)


def _update(catalog: Catalog, tx: Any, table: str, update: str, values: dict[str, Any]) -> int:
    catalog.backend.lock_rows(tx, [_LOCK.replace("{ids}", table)])  # a server catalog's row locks, in id order
    return int(tx.execute(update.replace("{ids}", table), values).rowcount)
