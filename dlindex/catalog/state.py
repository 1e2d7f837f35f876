"""The catalog's state: its change counter with the random token every write transaction draws.

The counter alone says whether the catalog changed since a cache entry was made, inside one
file's history. It does not name a state: a file restored from a backup (``cp backup.db
train.db``: same path, same inode) goes back to an older counter, and its next write reaches a
counter the lost history already had, with other content. The token is drawn anew by every
write transaction (schema version 12), so a restored file carries its own older token, and the
pair (counter, token) it reaches next never equals a state the catalog had before. Caches that
live outside the catalog, and so survive a restore (the L2 cache in Redis), key on the pair;
caches inside it (the result cache) are restored with it and keep keying on the counter.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

BUMP = "UPDATE catalog_changes SET counter = counter + 1, token = :token WHERE id = 1"
READ = "SELECT counter, token FROM catalog_changes WHERE id = 1"


@dataclass(frozen=True)
class CatalogState:
    """One state of a catalog's content: equal states, equal content (for dlindex's writes)."""

    changes: int  # the change counter: moves by one with each write transaction
    token: str  # 32 hex digits, drawn anew with each write transaction

    @property
    def key(self) -> str:
        """The state as one key part: ``<changes>.<token>``."""
        return f"{self.changes}.{self.token}"


def new_token() -> str:
    """A write transaction's token: 128 random bits, so no two states ever share one."""
    return secrets.token_hex(16)


def read_state(conn: Any) -> CatalogState:
    """The state of the catalog behind ``conn`` (a sqlite3 or PostgreSQL connection), in one read."""
    counter, token = conn.execute(READ).fetchone()
    return CatalogState(int(counter), str(token))
