"""``scan``: walk a tree, diff it against the catalog, probe what changed, write in batches.

The main process plans the work and is the single writer (dlindex.scan.batch_writer); a pool of
worker processes walks units of the tree (diffing each against the catalog through a
read-only connection) and probes files (read, hash, sniff).
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from dlindex.catalog.connection import Catalog
from dlindex.catalog.paths import display_name
from dlindex.catalog.shard_runs import finish_shard_run, start_shard_run
from dlindex.catalog.versions import command_text, summary_of
from dlindex.engines.local import sigterm_as_interrupt
from dlindex.errors import Interrupted
from dlindex.scan import tasks as worker
from dlindex.scan.batch_writer import (
    BatchWriter,
    abandon_scan,
    drop_unused_labels,
    finish_scan,
    known_root,
    prune_missing,
    register_root,
    set_presplit,
    start_scan,
)
from dlindex.scan.diff import DiffOptions, ToProbe, UnitDiff
from dlindex.scan.labels import read_labels_file, write_attributes
from dlindex.scan.links import LinkedFiles
from dlindex.scan.listing import SKIP_REASONS, WalkOptions, WalkReport
from dlindex.scan.options import ScanOptions, ScanSummary, check_root
from dlindex.scan.probe import Probe, ProbeOptions
from dlindex.scan.quick import skip_unchanged, start_finds
from dlindex.scan.tasks import WorkerPool
from dlindex.scan.units import PartPlan, Unit, part_units, plan_units

# Paths of a --labels file that name no image of this root (a typo, a file not scanned).
_UNKNOWN_LABEL_PATHS = (
    "SELECT listed.value FROM json_each(:paths) AS listed WHERE NOT EXISTS (SELECT 1 FROM image_metadata "
    "WHERE image_metadata.root_id = :root_id AND image_metadata.file_path = listed.value "
    "AND image_metadata.status != 'missing')"
)
_LABEL_EXAMPLES = 5

_QUEUED_PROBES = 8192  # walk no further ahead than this many files waiting to be probed
# Units go several to a task up to about this many files: a task's result is held in memory
# whole, and units of big folders sent 8 at once made a scan's peak RSS grow with the folders.
_FILES_PER_TASK = 2048


@dataclass
class _Counts:
    seen: int = 0
    new: int = 0
    changed: int = 0
    reread: int = 0
    unchanged: int = 0
    missing: int = 0
    corrupt: int = 0
    relabeled: int = 0


def scan_tree(
    catalog: Catalog,
    root: str | os.PathLike[str],
    options: ScanOptions = ScanOptions(),
    progress: Callable[[int], object] | None = None,
) -> ScanSummary:
    """Bring the catalog in line with the tree under ``root``; see docs/commands/scan.md.
    What it changes is one catalog version (docs/versions.md).

    Args:
        progress: called with the number of files finished since the last call.
    """
    with catalog.versioned(command_text("scan", os.path.abspath(os.fsdecode(root)))) as version:
        summary = _scan_tree(catalog, root, options, progress)
        version.summary = summary_of(
            {k: getattr(summary, k) for k in ("new", "changed", "missing", "corrupt", "relabeled", "pruned")}
        )
        return summary


def _scan_tree(
    catalog: Catalog, root: str | os.PathLike[str], options: ScanOptions, progress: Callable[[int], object] | None
) -> ScanSummary:
    started = time.perf_counter()
    root_bytes = check_root(root)
    labels_file = read_labels_file(options.labels_file) if options.labels_file else None
    label_overrides = labels_file.labels if labels_file else None
    root_text, root_lossless = display_name(root_bytes)
    root_id = known_root(catalog, root_text)  # a rescan's root is read, not written
    if root_id is None:
        root_id = register_root(catalog, root_text, None if root_lossless else root_bytes)
    recorded = {k: (os.fspath(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()}
    report = WalkReport()
    counts = _Counts()
    writer = BatchWriter(catalog, root_id)
    # A rescan's find starts here and runs while the first write below waits for the catalog's check.
    pipeline = _Pipeline(catalog, root_bytes, root_id, options, label_overrides, report, counts, writer, progress)
    try:
        scan_id = start_scan(catalog, root_id, recorded)
    except BaseException:
        pipeline.close()
        raise
    interrupted = False
    pruned = 0
    texts: dict[str, object] | None = None
    shard_run: int | None = None
    restore = sigterm_as_interrupt()
    try:
        if options.part is not None and pipeline.part_plan is not None:
            shard_run = start_shard_run(
                catalog, "scan", root_text, options.part.index, options.part.count, pipeline.part_plan.digest
            )
        set_presplit(catalog, root_id, pipeline.presplit)
        pipeline.run()
        writer.flush()
        if labels_file is not None:
            write_attributes(catalog, root_id, labels_file)
        if options.texts:
            from dlindex.text.sidecar_pass import scan_sidecars  # only for trees with texts

            texts = asdict(scan_sidecars(catalog, root_id, root_bytes))
        if options.prune:
            pruned = prune_missing(catalog, root_id)
        if pruned or counts.relabeled:
            drop_unused_labels(catalog)
    except KeyboardInterrupt:
        interrupted = True
    except BaseException:
        abandon_scan(catalog, scan_id)  # a full disk, a lost lock, a bug
        raise
    finally:
        restore()
        pipeline.close()
    if shard_run is not None:
        finish_shard_run(catalog, shard_run, completed=not interrupted)
    listed = (labels_file.labels or labels_file.attributes) if labels_file else None
    # A part holds only its own units' rows: the other paths are in the other parts.
    check_labels = listed and not interrupted and options.part is None
    unknown_labels = _unknown_label_paths(catalog, root_id, listed) if check_labels and listed else []
    seconds = time.perf_counter() - started
    summary = ScanSummary(
        scan_id=scan_id, root=root_text, seen=counts.seen, new=counts.new, changed=counts.changed,
        unchanged=counts.unchanged, missing=counts.missing, corrupt=counts.corrupt,
        skipped=report.skipped, errors=report.error_count, relabeled=counts.relabeled,
        pruned=pruned, seconds=round(seconds, 3),
        files_per_s=round(counts.seen / seconds, 1) if seconds > 0 else 0.0, reread=counts.reread,
        interrupted=interrupted, error_samples=tuple(report.errors[:20]),
        skipped_by_reason={r: report.skips[r] for r in SKIP_REASONS if report.skips.get(r)},
        unknown_label_paths=len(unknown_labels), unknown_label_examples=tuple(unknown_labels[:_LABEL_EXAMPLES]),
        texts=texts,
    )  # fmt: skip
    finish_scan(catalog, summary.as_dict())
    if interrupted:
        raise Interrupted(
            f"scan interrupted after {counts.new + counts.changed} files were written; "
            "the catalog is consistent, run the same scan again to finish"
        )
    return summary


class _Pipeline:
    """Feeds units to walk and batches to probe through one pool, bounded in flight."""

    def __init__(
        self,
        catalog: Catalog,
        root: bytes,
        root_id: int,
        options: ScanOptions,
        label_overrides: dict[str, str | None] | None,
        report: WalkReport,
        counts: _Counts,
        writer: BatchWriter,
        progress: Callable[[int], object] | None,
    ) -> None:
        self.root, self.root_id, self.report, self.counts = root, root_id, report, counts
        self.catalog = catalog
        self.writer, self.progress = writer, progress or (lambda n: None)
        walk_options = WalkOptions(
            options.extensions, options.hidden, options.exclude, options.follow_symlinks, options.split_folders, root
        )
        self.diff_options = DiffOptions(walk_options, options.force, label_overrides, options.max_pixels)
        self.workers = max(1, options.workers or os.cpu_count() or 1)
        # Forked once the fast path has counted what it could: not at all when that is everything.
        self.start_pool = functools.partial(
            WorkerPool, self.workers, ProbeOptions(options.verify, options.max_pixels, options.follow_symlinks),
            options.io_threads, catalog.url,
        )  # fmt: skip
        self.part_plan: PartPlan | None = None
        if options.part is not None:
            self.part_plan = part_units(root, walk_options, report, options.part.index, options.part.count)
            self.units: deque[Unit] = deque(self.part_plan.units)
            self.presplit = self.part_plan.presplit
        else:
            self.units = deque(plan_units(root, walk_options, report, self.workers))
            self.presplit = any(unit.presplit for unit in self.units)
        self.queued: deque[ToProbe] = deque()
        self.pending: dict[str, ToProbe] = {}
        self.diffs_in_flight = 0
        self.probes_in_flight = 0
        self.batches = 0
        self.walked = [0, 0]  # units diffed, files they held: how many units make a task
        self.linked = LinkedFiles()
        self.started = start_finds(catalog, root, root_id, self.units, self.diff_options)

    def close(self) -> None:
        """Stop what was started and not read (a scan that failed before its walk)."""
        started, self.started = self.started, None
        if started is not None:
            started.close()

    def run(self) -> None:
        """Walk, diff and probe the whole tree, handing results to the writer as they come."""
        self._count_unchanged()
        if not self.units:
            return
        self.pool = self.start_pool()
        try:
            while self.units or self.queued or self.pool.inflight:
                self._submit()
                for kind, result in self.pool.wait_any():
                    if kind == "diff":
                        self.diffs_in_flight -= 1
                        for diff in result:
                            self._on_diff(diff)
                    else:
                        self.probes_in_flight -= 1
                        self._on_probes(result)
                if self.linked and not self.units and not self.diffs_in_flight:
                    self._resolve_linked()  # every unit is walked: each file's first path is known
                self.writer.maybe_flush()
        except BaseException:
            self.pool.close(abort=True)
            raise
        self.pool.close()

    def _count_unchanged(self) -> None:
        """Count the units that find tells unchanged as a whole (dlindex.scan.quick): not walked."""
        started, self.started = self.started, None
        if started is None:
            return
        quick = skip_unchanged(self.catalog, self.root_id, self.units, self.diff_options, started)
        if quick is not None:
            self.units = deque(quick.units)
            self.counts.seen += quick.files
            self.counts.unchanged += quick.files
            for reason, n in quick.skips.items():
                self.report.skip(reason, n)
            self.progress(quick.files)

    def _submit(self) -> None:
        while self.units and self.diffs_in_flight < 2 * self.workers and len(self.queued) < _QUEUED_PROBES:
            # Many small units (a folder per class) go several to a task: less overhead per task.
            units_done, files = self.walked
            most = min(8, units_done * _FILES_PER_TASK // files) if files else 1  # one until sizes are known
            group = max(1, min(most, len(self.units) // (16 * self.workers)))
            units = [self.units.popleft() for _ in range(min(group, len(self.units)))]
            self.pool.submit("diff", worker.diff_task, (self.root_id, units, self.diff_options))
            self.diffs_in_flight += 1
        walking = bool(self.units) or self.diffs_in_flight > 0
        while self.queued and self.probes_in_flight < 3 * self.workers:
            # Small first batches get every worker busy at once; later ones amortise overhead.
            size = 32 if self.batches < 2 * self.workers else 256
            if walking and len(self.queued) < size:
                break
            batch = [self.queued.popleft() for _ in range(min(size, len(self.queued)))]
            for item in batch:
                self.pending[item.key] = item
            self.pool.submit("probe", worker.probe_task, ([(item.path, item.key) for item in batch],))
            self.probes_in_flight += 1
            self.batches += 1

    def _on_diff(self, diff: UnitDiff) -> None:
        self.report.absorb(diff.report)
        counts = self.counts
        counts.seen += diff.seen
        self.walked[0] += 1
        self.walked[1] += diff.seen
        counts.unchanged += diff.unchanged
        missing = [i for i, path in diff.missing if not any(path.startswith(u) for u in self.report.unlisted)]
        counts.missing += len(missing)
        counts.relabeled += len(diff.relabel)
        self.writer.missing.extend(missing)
        self.writer.relabel.extend(diff.relabel)
        self.writer.identified.extend(diff.identified)
        linked = self.linked
        if diff.linked_unchanged or diff.linked_missing:
            linked.add_unchanged(diff.linked_unchanged, diff.linked_missing)
        to_probe, probed = diff.to_probe, diff.probed
        if any(item.ident for item in to_probe) or any(i.ident for _, i in probed):
            to_probe, probed = linked.hold(to_probe, probed)  # until every unit is walked
        self.queued.extend(to_probe)
        self.progress(diff.unchanged)
        if probed:
            self._record(probed)

    def _resolve_linked(self) -> None:
        kept = self.linked.resolve()
        self.queued.extend(kept.to_probe)
        if kept.probed:
            self._record(kept.probed)
        self.report.skip("duplicate", kept.duplicates)
        self.counts.seen -= kept.duplicates
        self.counts.unchanged -= kept.unchanged_duplicates
        self.counts.missing += len(kept.missing)
        self.writer.missing.extend(kept.missing)

    def _on_probes(self, results: list[tuple[object, ...]]) -> None:
        probes = [tuple.__new__(Probe, fields) for fields in results]  # see worker.probe_task
        self._record([(probe, self.pending.pop(probe.key)) for probe in probes])

    def _record(self, results: list[tuple[Probe, ToProbe]]) -> None:
        counts, writer = self.counts, self.writer
        for probe, item in results:
            if probe.kind == "skipped":
                counts.seen -= 1
                self.report.skip(probe.error or "device")  # became a FIFO, socket or device
            elif probe.kind == "error":
                self.report.error(probe.key, probe.error or "unreadable")
                gone = bool(probe.error and "No such file" in probe.error)
                self.report.skip("vanished" if gone else "unreadable")
                if item.known_id is not None and gone:
                    writer.missing.append(item.known_id)  # vanished between the walk and the read
                    counts.missing += 1
            else:
                if item.known_id is None:
                    counts.new += 1
                elif item.before == (probe.xxh3_128, probe.bytes, probe.mtime_ns, probe.kind, probe.pixel_limit):
                    counts.reread += 1  # same bytes, same verdict: only its inode or ctime may be new
                else:
                    counts.changed += 1
                if probe.kind == "corrupt":
                    counts.corrupt += 1
                writer.rows.append((probe, item))
        self.progress(len(results))


def _unknown_label_paths(catalog: Catalog, root_id: int, listed: Mapping[str, object]) -> list[str]:
    rows = catalog.conn.execute(_UNKNOWN_LABEL_PATHS, {"paths": json.dumps(list(listed)), "root_id": root_id})
    return sorted(str(r[0]) for r in rows)
