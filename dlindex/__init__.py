"""dlindex: an SQLite catalog for deep-learning image datasets.

    from dlindex import Catalog, scan_tree
    with Catalog("train.db", create=True) as catalog:
        summary = scan_tree(catalog, "data/train")
"""

from .catalog import Catalog, open_catalog
from .errors import CatalogError, DlindexError, ExitCode, InputError, Interrupted
from .mark import MarkResult, mark_samples
from .probe import Probe, ProbeOptions, probe_file, sniff_header
from .query import QuerySpec
from .querylog import clear_log, import_log, log_summary
from .scan import ScanOptions, ScanSummary, scan_tree
from .stats import CatalogStats, catalog_stats

__version__ = "0.1.0"

__all__ = [
    "Catalog",
    "CatalogError",
    "CatalogStats",
    "DlindexError",
    "ExitCode",
    "InputError",
    "Interrupted",
    "MarkResult",
    "Probe",
    "ProbeOptions",
    "QuerySpec",
    "ScanOptions",
    "ScanSummary",
    "catalog_stats",
    "clear_log",
    "import_log",
    "log_summary",
    "mark_samples",
    "open_catalog",
    "probe_file",
    "scan_tree",
    "sniff_header",
]
