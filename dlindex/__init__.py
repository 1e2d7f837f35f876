"""dlindex: an SQLite catalog for deep-learning image datasets.

    from dlindex import Catalog, scan_tree
    with Catalog("train.db", create=True) as catalog:
        summary = scan_tree(catalog, "data/train")

Names are imported from their modules on first use, so `import dlindex` (and every CLI
command's start-up) pays only for what it touches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "Catalog": "catalog",
    "open_catalog": "catalog",
    "CatalogError": "errors",
    "CatalogBusyError": "errors",
    "DamagedCatalogError": "errors",
    "DiskFullError": "errors",
    "DlindexWarning": "errors",
    "ReadOnlyCatalogError": "errors",
    "CheckReport": "check",
    "check_catalog": "check",
    "recover_catalog": "check",
    "DlindexError": "errors",
    "ExitCode": "errors",
    "InputError": "errors",
    "Interrupted": "errors",
    "MarkResult": "mark",
    "mark_samples": "mark",
    "Probe": "probe",
    "ProbeOptions": "probe",
    "probe_file": "probe",
    "sniff_header": "probe",
    "QuerySpec": "query",
    "clear_log": "logview",
    "import_log": "logview",
    "log_summary": "logview",
    "ScanOptions": "scan",
    "ScanSummary": "scan",
    "scan_tree": "scan",
    "CatalogStats": "stats",
    "catalog_stats": "stats",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


if TYPE_CHECKING:
    from .catalog import Catalog, open_catalog
    from .check import CheckReport, check_catalog, recover_catalog
    from .errors import (
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
    from .mark import MarkResult, mark_samples
    from .probe import Probe, ProbeOptions, probe_file, sniff_header
    from .query import QuerySpec
    from .logview import clear_log, import_log, log_summary
    from .scan import ScanOptions, ScanSummary, scan_tree
    from .stats import CatalogStats, catalog_stats
