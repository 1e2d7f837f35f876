"""What ``dlindex scan`` is asked (ScanOptions) and what it answers (ScanSummary).

Apart from the scan's machinery (dlindex.scan.run), so that ``dlindex scan`` can parse its
options and open the catalog before importing the worker pool, Pillow and the walk: the
catalog's check before the first write then runs while those imports do.
"""

from __future__ import annotations

import os
from dataclasses import InitVar, asdict, dataclass, field
from pathlib import Path
from typing import Any

from dlindex.engines.parts import Part, renamed_shard
from dlindex.errors import InputError
from dlindex.scan.listing import DEFAULT_EXTENSIONS

MAX_PIXELS = 89_478_485  # Pillow's MAX_IMAGE_PIXELS; twice this is a bomb


@dataclass(frozen=True)
class ScanOptions:
    """What ``scan_tree`` selects and how it judges files: the options of ``dlindex scan``."""

    extensions: tuple[str, ...] = DEFAULT_EXTENSIONS
    hidden: bool = False
    exclude: tuple[str, ...] = ()
    follow_symlinks: bool = True
    split_folders: bool = True  # ROOT/train/<class>/...: class under the split, split in its column
    labels_file: Path | None = None
    verify: bool = False
    max_pixels: int = MAX_PIXELS
    workers: int = 0  # 0: one per CPU
    io_threads: int = 16
    prune: bool = False
    force: bool = False
    texts: bool = False  # then the sidecar texts beside the images (dlindex.text.sidecar_pass)
    part: Part | None = None  # part I of N of the walk's units (docs/scale-out.md)
    shard: InitVar[Part | None] = None  # deprecated: the old name of ``part``

    def __post_init__(self, shard: Part | None) -> None:
        if shard is not None:
            object.__setattr__(self, "part", renamed_shard("ScanOptions", shard, self.part))
        if self.part is not None and self.prune:
            raise InputError(
                "--prune cannot go with --part: a part does not know which rows other parts keep; "
                "merge the parts, then run dlindex scan ROOT --prune on the merged catalog"
            )
        if self.part is not None and self.texts:
            raise InputError(
                "--texts cannot go with --part yet: merge the parts, then run dlindex scan ROOT --texts on the "
                "merged catalog (it reads only the sidecars, the images are unchanged)"
            )


@dataclass(frozen=True)
class ScanSummary:
    """What one scan did; ``corrupt`` counts corrupt files among those probed in this run."""

    scan_id: int
    root: str
    seen: int
    new: int
    changed: int
    unchanged: int
    missing: int
    corrupt: int
    skipped: int  # entries that got no row in this scan, all reasons together
    errors: int
    relabeled: int
    pruned: int
    seconds: float
    files_per_s: float
    reread: int = 0  # known files read again (--force, a new inode or ctime...) and found the same
    interrupted: bool = False
    error_samples: tuple[tuple[str, str], ...] = field(default=())
    skipped_by_reason: dict[str, int] = field(default_factory=dict)  # walk.SKIP_REASONS order
    texts: dict[str, Any] | None = None  # with --texts: sidecars read, unchanged, removed, skipped by reason
    unknown_label_paths: int = 0  # paths in the --labels file matching no image under the root
    unknown_label_examples: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        """The summary as ``--json`` prints it."""
        data = asdict(self)
        data["error_samples"] = [{"path": p, "error": e} for p, e in self.error_samples]
        data["unknown_label_examples"] = list(self.unknown_label_examples)
        return data


def check_root(root: str | os.PathLike[str]) -> bytes:
    """The real path of a scan root, in bytes; InputError if it is no readable folder."""
    path = os.fsencode(root)
    if not os.path.exists(path):
        raise InputError(f"root {os.fsdecode(path)!r} does not exist")
    if not os.path.isdir(path):
        raise InputError(f"root {os.fsdecode(path)!r} is not a folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise InputError(f"root {os.fsdecode(path)!r} is not readable")
    return os.path.realpath(path)
