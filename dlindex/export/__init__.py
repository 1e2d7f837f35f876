"""Exports: manifests and packed shards for training loaders, their index.json, and verify.

from dlindex import Catalog
from dlindex.export import ExportOptions, export_catalog, verify_export
with Catalog("train.db") as catalog:
    summary = export_catalog(catalog, "out/", ExportOptions(format="wds", shuffle=True, seed=1))
assert verify_export("out/").ok

A --part export: part I of N per machine (ExportOptions(shard="I/N")), then
merge_exports(["out0/", "out1/", ...], "out/").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlindex._lazy import lazy_exports

__all__ = [
    "FORMATS",
    "ExportError",
    "ExportOptions",
    "ExportSummary",
    "MergeSummary",
    "VerifyResult",
    "export_catalog",
    "load_index",
    "manifest_files",
    "manifest_rows",
    "merge_exports",
    "parse_size",
    "parse_split",
    "source_path",
    "verify_export",
]

# public name -> module that defines it (a submodule, or a full name: the read side is dlindex.exported)
_EXPORTS = {
    "ExportError": "dlindex.exported",
    "parse_split": "plan",
    "load_index": "dlindex.exported.reader",
    "manifest_files": "dlindex.exported.reader",
    "manifest_rows": "dlindex.exported.reader",
    "source_path": "dlindex.exported.reader",
    "ExportOptions": "options",
    "ExportSummary": "options",
    "parse_size": "options",
    "FORMATS": "run",
    "export_catalog": "run",
    "VerifyResult": "dlindex.exported.verify",
    "MergeSummary": "merge",
    "merge_exports": "merge",
    "verify_export": "dlindex.exported.verify",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


if TYPE_CHECKING:
    from dlindex.export.merge import MergeSummary, merge_exports
    from dlindex.export.options import ExportOptions, ExportSummary, parse_size
    from dlindex.export.plan import parse_split
    from dlindex.export.run import FORMATS, export_catalog
    from dlindex.exported import ExportError
    from dlindex.exported.reader import load_index, manifest_files, manifest_rows, source_path
    from dlindex.exported.verify import VerifyResult, verify_export
