"""dlindex: an SQLite catalog for deep-learning image datasets.

    from dlindex import Catalog, query_rows, scan_tree
    with Catalog("train.db", create=True) as catalog:
        summary = scan_tree(catalog, "data/train")
        rows = list(query_rows(catalog, per_label=32, seed=0))

Names are imported from their modules on first use, so `import dlindex` (and every CLI
command's start-up) pays only for what it touches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlindex._lazy import lazy_exports
from dlindex.version import __version__ as __version__

__all__ = [
    "Catalog",
    "CatalogBusyError",
    "CatalogError",
    "CatalogStats",
    "CheckReport",
    "DamagedCatalogError",
    "DiskFullError",
    "DlindexError",
    "DlindexWarning",
    "ExitCode",
    "InputError",
    "Interrupted",
    "MarkResult",
    "Probe",
    "ProbeOptions",
    "QuerySpec",
    "ReadOnlyCatalogError",
    "ScanOptions",
    "ScanSummary",
    "catalog_stats",
    "check_catalog",
    "clear_log",
    "feature_vectors",
    "import_log",
    "log_summary",
    "mark_samples",
    "open_catalog",
    "probe_file",
    "query_rows",
    "recover_catalog",
    "sample_ids",
    "scan_tree",
    "sniff_header",
]

# public name -> module that defines it (tests/test_api.py checks it against __all__)
_EXPORTS = {
    "CheckReport": "catalog.check",
    "check_catalog": "catalog.check",
    "recover_catalog": "catalog.recover",
    "Catalog": "catalog.connection",
    "open_catalog": "catalog.connection",
    "CatalogBusyError": "errors",
    "CatalogError": "errors",
    "DamagedCatalogError": "errors",
    "DiskFullError": "errors",
    "DlindexError": "errors",
    "DlindexWarning": "errors",
    "ExitCode": "errors",
    "InputError": "errors",
    "Interrupted": "errors",
    "ReadOnlyCatalogError": "errors",
    "feature_vectors": "features.storage",
    "MarkResult": "query.mark",
    "mark_samples": "query.mark",
    "QuerySpec": "query.spec",
    "query_rows": "query.rows",
    "sample_ids": "query.rows",
    "clear_log": "querylog.views",
    "import_log": "querylog.views",
    "log_summary": "querylog.views",
    "Probe": "scan.probe",
    "ProbeOptions": "scan.probe",
    "probe_file": "scan.probe",
    "ScanOptions": "scan.options",
    "ScanSummary": "scan.options",
    "scan_tree": "scan.run",
    "sniff_header": "scan.sniff",
    "CatalogStats": "stats",
    "catalog_stats": "stats",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


if TYPE_CHECKING:
    from dlindex.catalog.check import CheckReport, check_catalog
    from dlindex.catalog.connection import Catalog, open_catalog
    from dlindex.catalog.recover import recover_catalog
    from dlindex.errors import (
        CatalogBusyError,
        CatalogError,
        DamagedCatalogError,
        DiskFullError,
        DlindexError,
        DlindexWarning,
        ExitCode,
        InputError,
        Interrupted,
        ReadOnlyCatalogError,
    )
    from dlindex.features.storage import feature_vectors
    from dlindex.query.mark import MarkResult, mark_samples
    from dlindex.query.rows import query_rows, sample_ids
    from dlindex.query.spec import QuerySpec
    from dlindex.querylog.views import clear_log, import_log, log_summary
    from dlindex.scan.options import ScanOptions, ScanSummary
    from dlindex.scan.probe import Probe, ProbeOptions, probe_file
    from dlindex.scan.run import scan_tree
    from dlindex.scan.sniff import sniff_header
    from dlindex.stats import CatalogStats, catalog_stats
