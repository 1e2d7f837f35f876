"""The training loader: datasets over an export on disk, and over a catalog query (dlindex.torch).

    from dlindex.loader import ManifestDataset, WdsDataset    # an export read back, torch optional

``export_datasets`` reads an export back through ``dlindex.exported`` only, so importing this
package (or reading an export with it) loads neither the catalog nor the query layer. The
catalog-backed loader (``catalog_dataset``, ``epoch``, ``selection``, ``layout``, ``sources``,
``worker``, ``decode``, ``row_cache``, ``l2``) is what ``dlindex.torch.DataLoader`` runs.
Names are imported from their modules on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlindex._lazy import lazy_exports

__all__ = ["ManifestDataset", "MetadataCache", "SourceMissingError", "WdsDataset", "iter_tar", "rank_and_world"]

# public name -> module that defines it
_EXPORTS = {
    "ManifestDataset": "export_datasets",
    "MetadataCache": "export_datasets",
    "SourceMissingError": "export_datasets",
    "WdsDataset": "export_datasets",
    "rank_and_world": "export_datasets",
    "iter_tar": "dlindex.exported.tar",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


if TYPE_CHECKING:
    from dlindex.exported.tar import iter_tar
    from dlindex.loader.export_datasets import (
        ManifestDataset,
        MetadataCache,
        SourceMissingError,
        WdsDataset,
        rank_and_world,
    )
