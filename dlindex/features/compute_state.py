"""The per-type state of ``features compute``: ``feature_state(image_id, feature_type, state, error)``.

A sample is *done* for a type when it has a vector (``image_features``); otherwise
``feature_state`` says ``queued`` (selected by a run that has not finished it: an
interrupted run leaves these; or, for an automatic type, queued by the catalog's triggers when
the row was written: migrations.m018_auto_features) or ``failed`` (with the error), and no row
means never selected. compute writes only here and in ``image_features``: ``image_metadata``'s
``processed``, ``processing_status`` and ``error`` belong to ``dlindex mark`` and the scan.
Every write is set-based, one statement per batch of ids (a JSON array).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from dlindex.catalog.backend import Connection

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

STATES = ("queued", "failed")

FAILED_IDS = "SELECT image_id FROM feature_state WHERE feature_type = ? AND state = 'failed'"
_QUEUE = (
    "INSERT INTO feature_state (image_id, feature_type, state) SELECT value, :type, 'queued' "
    "FROM json_each(:ids) WHERE true ON CONFLICT (image_id, feature_type) DO UPDATE SET "
    "state = 'queued', error = NULL, updated_at = CURRENT_TIMESTAMP"
)
_DONE = "DELETE FROM feature_state WHERE feature_type = :type AND image_id IN (SELECT value FROM json_each(:ids))"
_FAIL = """INSERT INTO feature_state (image_id, feature_type, state, error) VALUES (?, ?, 'failed', ?)
    ON CONFLICT (image_id, feature_type) DO UPDATE SET state = 'failed', error = excluded.error,
    updated_at = CURRENT_TIMESTAMP"""
_COUNTS = "SELECT state, count(*) FROM feature_state WHERE feature_type = ? GROUP BY state"
_OF_IMAGE = "SELECT feature_type, state, error, updated_at FROM feature_state WHERE image_id = ? ORDER BY feature_type"
# The queue of a type as a compute reads it (--queued): ok, not set aside, in id order.
_QUEUED = """SELECT s.image_id, m.root_id, m.file_path, m.file_path_bytes FROM feature_state s
    JOIN image_metadata m ON m.id = s.image_id
    WHERE s.feature_type = ? AND s.state = 'queued' AND m.status = 'ok' AND m.excluded = 0 ORDER BY s.image_id"""
_ROWS = (
    "SELECT image_id, state, error, updated_at FROM feature_state "
    "WHERE feature_type = :type AND state IN (SELECT value FROM json_each(:states)) ORDER BY image_id"
)


def queue(conn: Connection, name: str, ids: Sequence[int]) -> None:
    conn.execute(_QUEUE, {"type": name, "ids": json.dumps(list(ids))})


def record(conn: Connection, name: str, done: Sequence[int], failed: Iterable[tuple[int, str]]) -> None:
    """Inside the caller's write transaction: ``done`` have their vector now, ``failed`` failed."""
    if done:
        conn.execute(_DONE, {"type": name, "ids": json.dumps(list(done))})
    conn.executemany(_FAIL, ((image_id, name, error) for image_id, error in failed))


def queued_samples(catalog: Catalog, name: str) -> Iterator[dict[str, Any]]:
    """The samples queued for type ``name`` as ``features compute`` takes them: ``id`` and the
    exact ``path`` (bytes), read from the queue alone (its cost follows the queue, not the catalog)."""
    from dlindex.query.lookups import roots_by_id

    roots = roots_by_id(catalog)
    for image_id, root_id, file_path, raw in catalog.read(_QUEUED, (name,)):
        yield {"id": image_id, "path": roots[root_id][1] + (bytes(raw) if raw is not None else file_path.encode())}


def counts(conn: Connection, name: str) -> dict[str, int]:
    """Samples per state (``queued``, ``failed``) of a type, zeros included."""
    found = {state: 0 for state in STATES}
    found.update((state, int(n)) for state, n in conn.execute(_COUNTS, (name,)))
    return found


def of_image(catalog: Catalog, image_id: int) -> list[tuple[str, str, str | None, str]]:
    """(type, state, error, updated_at) of every type with a state for one sample."""
    return [tuple(row) for row in catalog.read(_OF_IMAGE, (image_id,))]


def state_rows(catalog: Catalog, name: str, states: Sequence[str]) -> Iterator[dict[str, Any]]:
    """Output rows (id, state, error, updated_at, label, path) of a type's queued or failed samples."""
    from dlindex.features.samples import describe

    params = {"type": name, "states": json.dumps(list(states))}
    batch: list[tuple[Any, ...]] = []
    for row in catalog.read(_ROWS, params):
        batch.append(tuple(row))
        if len(batch) >= 10_000:
            yield from _described(catalog, batch, describe)
            batch = []
    yield from _described(catalog, batch, describe)


def _described(catalog: Catalog, batch: list[tuple[Any, ...]], describe: Any) -> Iterator[dict[str, Any]]:
    info = describe(catalog, (r[0] for r in batch))
    for image_id, state, error, updated_at in batch:
        label, path = info.get(image_id, (None, None))
        yield {"id": image_id, "state": state, "error": error, "updated_at": updated_at, "label": label, "path": path}
