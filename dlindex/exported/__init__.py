"""An export on disk, read back: its index, confined reads, tars, ids.i64, checks and --verify.

The read side of ``dlindex.export``, for everything that opens an export it did not just write
(``--verify``, ``merge``, ``dlindex.loader``): it imports nothing from dlindex.catalog,
dlindex.query or dlindex.export, so reading an export back never loads the catalog layers.
"""

from __future__ import annotations

from dlindex.errors import InputError


class ExportError(InputError):
    """The export cannot be written as asked; nothing was left in OUT_DIR."""
