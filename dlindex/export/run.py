"""``dlindex export``: select, plan and write one export, then its index.json."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlindex.catalog.as_of import present_rows
from dlindex.catalog.classes import SPLITS, check_split_folders, has_presplit_root
from dlindex.catalog.reachable import unreachable_roots
from dlindex.engines.local import sigterm_as_interrupt
from dlindex.engines.parts import Part as Shard  # export/ says Shard for a part until its restructuring settles
from dlindex.engines.parts import parse_part as parse_shard
from dlindex.export.classes import kept_classes
from dlindex.export.dealing import Dealing, OutsideSplit, write_dealt
from dlindex.export.describe import build_index, client_keys, describe_export, label_counts, written_per_split
from dlindex.export.files import packable
from dlindex.export.gcpause import paused_gc
from dlindex.export.groups import check_grouping, ensure_hashes, group_points, large_group_note
from dlindex.export.hashsplit import dealt_rows, halved, split_streams
from dlindex.export.options import ExportOptions, ExportSummary, check_bounds, check_selected, memory_budget, parse_size
from dlindex.export.outdir import OutputDir
from dlindex.export.part import owners, part_manifest, plan_digest, write_groups
from dlindex.export.plan import (
    DEFAULT_SPLIT,
    ExportError,
    UpperHalf,
    export_spec,
    make_plan,
    parse_split,
    select_halves,
    select_rows,
    tree_split_choice,
)
from dlindex.export.registry import record_export
from dlindex.export.shards import Context, ShardInfo
from dlindex.export.texts import text_source
from dlindex.export.vectors import feature_source
from dlindex.exported.formats import FORMATS as _REGISTRY
from dlindex.exported.formats import NAMES, Format, load
from dlindex.exported.index import PART_INDEX
from dlindex.features.extractor_versions import stale_warning
from dlindex.query.rows import any_in_split_folder, prepare, split_counts
from dlindex.query.spec import QuerySpec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

FORMATS = NAMES  # dlindex.export.FORMATS: the registry's (dlindex.exported.formats)
_ROOTS = "SELECT path FROM roots"
# The tree splits of a --limit selection: the ids are the selection's own statement, with its
# order and limit, so a limit of 20 reads about 20 rows (in id order) instead of them all.
_LIMITED_SPLIT_COUNTS = "SELECT split, count(*) FROM image_metadata WHERE id IN ({selection}) GROUP BY split"


@paused_gc()  # rows make no cycles; the collector cost 12-22% of an export (dlindex.export.gcpause)
def export_catalog(
    catalog: Catalog,
    out_dir: str | os.PathLike[str],
    options: ExportOptions | None = None,
    progress: Callable[[int], None] | None = None,
    warn: Callable[[str], None] | None = None,
    note: Callable[[str], None] | None = None,
) -> ExportSummary:
    """Write an export of the selected samples to ``out_dir``, atomically; raise ExportError
    (an InputError) before writing anything when an option or the selection is unusable.

    Args:
        progress: called with the number of samples written since the last call.
        warn: called with one line for each source file skipped (wds, mds: not a regular
            file, or not of its catalogued size); they are counted in ``skipped``.
        note: called with one line before long work the export does first (computing the
            dhash that ``group="near-dups"`` needs).
    """
    try:
        return _export(catalog, out_dir, options or ExportOptions(), progress, warn, note)
    except ExportError as e:
        if catalog.pinned is None or "run dlindex scan" not in str(e):
            raise
        # A past version's rows name the files as they are now: a rescan would not bring one back.
        raise ExportError(
            str(e).split("; run dlindex scan")[0]
            + f": it was deleted or changed after version {catalog.pinned.named}, "
            "and an export --at packs the files as they are now (a manifest format lists it instead)"
        ) from None


def _export(catalog: Catalog, out_dir: str | os.PathLike[str], options: ExportOptions, progress: Any, warn: Any,
            note: Any) -> ExportSummary:  # fmt: skip
    started = time.perf_counter()
    fmt = options.format
    shard = parse_shard(options.shard)
    record = _REGISTRY.get(fmt)
    if record is None:
        raise ExportError(f"unknown format {fmt!r}; choose from: {', '.join(FORMATS)}")
    if record.needs is not None:
        load(record.needs)()
    tree = tree_split_choice(options.split)
    split = None if tree is not None else parse_split(options.split)
    grouping = check_grouping(
        options.group, options.group_by, options.group_type, options.group_max_distance, options.group_threshold,
        fractions=bool(split),
    )  # fmt: skip
    shard_bytes = parse_size(options.shard_bytes)
    check_bounds(options, shard_bytes)
    if options.shard_size is None and shard_bytes is None:
        options = replace(options, shard_size=record.shard_size)
        shard_bytes = record.shard_bytes
    if not record.packed:  # a manifest names source files: they must be there to be read
        for problem in unreachable_roots(catalog.read, present_rows(catalog.pinned, catalog.backend.is_server)):
            raise ExportError(f"{problem}; a {fmt} export names the files there, so nothing was written")
    target = Path(out_dir)
    # Before anything is read: OUT_DIR must be safe to write (and to replace, with --overwrite).
    # The catalog file and its journals (a server catalog has none here) and the roots are never replaced.
    output = OutputDir(target, options.overwrite, catalog.backend.files(), [r for (r,) in catalog.read(_ROOTS, {})])
    skipped: Counter[str] = Counter()
    restore = sigterm_as_interrupt()  # a SIGTERM removes the temporary folder, as Ctrl-C does
    try:
        features = feature_source(catalog, options.features) if options.features else None
        say = warn or note
        if features is not None and features.stale and say is not None:
            say(stale_warning(features.name, features.stale))  # exported as they are, said once
        points = None
        if grouping is not None:
            ensure_hashes(catalog, grouping, note or (lambda line: None))
            points = group_points(catalog, grouping)
            large = large_group_note(catalog, points)
            if large is not None and say is not None:
                say(large)
        changes = catalog.changes()
        # A file without a class (directly under ROOT) has no label_id to train on: ImageFolder
        # leaves such files out too.
        query = replace(options.query, has_class=True, split=tree or options.query.split)
        # Only jsonl without shard limits is written in two halves (the writer appends the second
        # process's part); every other export reads its rows here.
        halves = (record.halves and options.shard_size is None and shard_bytes is None and features is None
                  and options.world_size == 1 and shard is None)  # fmt: skip
        # A manifest of a pre-split tree (jsonl, csv, parquet: the formats with a sink): one pass
        # deals each row to its split folder's shards, no count of the folders first
        # (dlindex.export.dealing).
        sinks = (record.sink is not None and features is None and options.world_size == 1 and shard is None
                 and grouping is None and not options.texts)  # fmt: skip
        by_folder = split is None and _deals_tree_folders(catalog, query, tree, halves or sinks)
        shares: dict[str, float] = {}  # each tree split's share of the selection
        if by_folder:
            tree_names = _tree_folders(catalog, query, tree)
        else:
            tree_names = (
                _tree_splits(catalog, query, tree, options.shuffle, options.seed, shares) if split is None else None
            )
        tree_rows: dict[str, Iterable[tuple[Any, ...]]] | None = None
        rows: Any = ()
        # --limit N caps the whole export, as `dlindex query --limit N` caps its rows: one statement
        # over the split folders (not N per split), each row going to its own folder's split.
        routed = tree_names is not None and query.limit is not None
        # Split fractions for one rank: a statement per split, narrowed by hash in the database
        # (dlindex.export.hashsplit), streamed to the writer like the tree's split folders.
        by_hash = (bool(split) and grouping is None and options.world_size == 1 and record.one_pass
                   and shard is None and catalog.backend.name == "sqlite")  # fmt: skip
        uppers: dict[str, UpperHalf] = {}
        # jsonl with fractions (one rank, one shard a split) or a tree's folders: one pass deals
        # each row to its split
        dealing = None
        if by_folder and tree_names is not None:
            dealing = Dealing(tuple(tree_names))
        elif by_hash and halves:
            assert split is not None
            dealing = Dealing(tuple(split), tuple(split.items()))
        dealt = dealing and dealt_rows(catalog, query, options.shuffle, options.seed, dict(dealing.fractions), halves)
        if dealt:
            assert dealing is not None
            prepared = dealt[1]
            tree_rows = {name: () for name in dealing.names}
        elif by_hash:
            assert split is not None
            streams, prepared, uppers = split_streams(catalog, query, options.shuffle, options.seed, split, halves)
            if record.packed:
                roots = {k: v[1] for k, v in (prepared.roots or {}).items()}
                streams = {name: packable(part, roots, skipped, warn) for name, part in streams.items()}
            tree_rows = dict(streams)
        elif routed:
            rows, prepared = select_rows(catalog, query, options.shuffle, options.seed, with_split=True)
            if record.packed:
                rows = packable(rows, {k: v[1] for k, v in (prepared.roots or {}).items()}, skipped, warn)
        elif tree_names is not None:
            tree_rows = {}
            for name in tree_names:
                one = replace(query, split=(name,))
                part, prepared, half = halved(
                    catalog, one, options.shuffle, options.seed, halves=halves, share=shares[name]
                )
                if half is not None:
                    uppers[name] = half
                if record.packed:  # these read every source: only regular files of their catalogued size
                    part = packable(part, {k: v[1] for k, v in (prepared.roots or {}).items()}, skipped, warn)
                tree_rows[name] = part  # read in turn by make_plan, one statement at a time
        else:
            if halves and not split:
                rows, prepared, upper = select_halves(catalog, query, options.shuffle, options.seed)
                if upper is not None:
                    uppers[DEFAULT_SPLIT] = upper
            else:  # --group-by: each row carries its value, the point of its group
                by = grouping.column or "" if grouping is not None else ""
                rows, prepared = select_rows(catalog, query, options.shuffle, options.seed, group_column=by)
            if record.packed:  # these read every source: only regular files of their catalogued size
                rows = packable(rows, {k: v[1] for k, v in (prepared.roots or {}).items()}, skipped, warn)
        plan = make_plan(
            rows, *kept_classes(catalog, options.appending, prepared), prepared.roots or {},
            class_list=prepared.class_list or "catalog", split=None if by_hash else split,
            points=None if points is None else points.points, tree_splits=tree_rows,
            tree_names=tree_names if routed else None,
            world_size=options.world_size, drop_last=options.drop_last, absolute_paths=options.absolute_paths,
            stream=record.one_pass and shard is None,  # a part digests every group's rows
            spill_dir=output.tmp, memory_budget=memory_budget(options.memory_budget),
        )  # fmt: skip
        del rows, tree_rows
        split_option: Any = "tree" if tree_names is not None else split
        ctx = Context.make(
            plan, output.tmp, shard_size=options.shard_size, shard_bytes=shard_bytes, features=features,
            progress=progress, read_threads=options.read_threads, upper=uppers if record.halves else None,
            texts=text_source(catalog.conn.execute, fmt, catalog.pinned) if options.texts else None,
        )  # fmt: skip
        shards: list[ShardInfo] = []
        if shard is not None:
            return _write_part(catalog, output, ctx, shard, record, options, query, split_option, shard_bytes, changes,
                               features, skipped, points, started, note)  # fmt: skip
        numbers: Counter[str] = Counter()
        writer = load(record.writer)
        if dealt:
            from dlindex.export.manifest import write_jsonl_splits  # writers are imported when used

            assert dealing is not None
            try:
                if halves:
                    shards = write_jsonl_splits(ctx, plan.groups, dealt[0], dealing, dealt[2], dealt[3])
                else:
                    assert record.sink is not None
                    shards = write_dealt(ctx, plan.groups, dealt[0], dealing, load(record.sink))
            except OutsideSplit:
                _named_splits(split_counts(catalog, query), tree)  # the count's own message
                raise
            if not dealing.fractions:  # tree folders: those that got samples, as a count would name
                plan = replace(plan, groups=tuple(g for g in plan.groups if plan.tally.samples[(g.split, 0)]))
        for group in () if dealt else plan.groups:
            written = writer(ctx, group, numbers[group.split])
            numbers[group.split] += len(written) // record.files_per_shard
            shards.extend(written)
        selected = plan.selected if plan.selected is not None else plan.samples
        check_selected(selected, skipped)
        extra: list[dict[str, Any]] = []
        if record.finish is not None:
            shards, extra = load(record.finish)(
                ctx.out, shards, plan.splits, world_size=options.world_size, workers=options.workers,
                features=features, shard_bytes=shard_bytes, texts=options.texts,
            )  # fmt: skip
        clients = client_keys(fmt, shards, plan.splits, ctx.seen, features, shard_bytes, options.texts)
        index = build_index(
            catalog, replace(options, query=query, split=split_option), fmt, shard_bytes, changes, plan, selected,
            shards, extra, features, clients, skipped,
            None if points is None or points.grouping is None else points.grouping.describe(points.groups),
        )  # fmt: skip
        (output.tmp / record.index).write_bytes(index)
        output.commit()
        if options.appending is None:  # an append's rows are recorded with the export they join
            record_export(catalog, target, fmt, plan.samples, changes)  # best effort: the export is done
    except BaseException:
        output.abort()  # never leave a half export that looks whole
        raise
    finally:
        restore()
    total = sum(s.bytes for s in shards) + sum(f["bytes"] for f in extra) + len(index)
    return ExportSummary(
        out_dir=str(target), format=fmt, samples=plan.samples, selected=selected, dropped=plan.dropped,
        padded=plan.padded, splits=written_per_split(plan), shards=len(shards), bytes=total,
        skipped=dict(sorted(skipped.items())), seconds=round(time.perf_counter() - started, 3),
    )  # fmt: skip


def _write_part(
    catalog: Catalog, output: OutputDir, ctx: Context, shard: Shard, record: Format, options: ExportOptions,
    query: QuerySpec, split_option: Any, shard_bytes: int | None, changes: int, features: Any,
    skipped: Counter[str], points: Any, started: float, note: Callable[[str], None] | None,
) -> ExportSummary:  # fmt: skip
    """Part ``shard`` of the export: its groups' shards and dlindex-part.json, no index.json
    (``merge_exports`` writes that); not recorded in the catalog, being no export yet."""
    plan = ctx.plan
    selected = plan.selected if plan.selected is not None else plan.samples
    check_selected(selected, skipped)
    owner = owners(plan, shard.count)
    if shard.index not in owner and note is not None:
        note(f"part {shard} has nothing to write: the export has {len(plan.groups)} (split, rank) group(s) "
             f"for {shard.count} parts; it writes only its part manifest")  # fmt: skip
    digest = plan_digest(plan)
    written = write_groups(ctx, shard, owner, load(record.writer))
    head = describe_export(
        catalog.location, replace(options, query=query, split=split_option), record.name,
        shard_bytes, changes, plan, selected, features, skipped,
        None if points is None or points.grouping is None else points.grouping.describe(points.groups),
    )  # fmt: skip
    manifest = part_manifest(
        shard,
        plan,
        owner,
        digest,
        catalog.backend.schema_version(catalog.conn),
        head,
        sorted(ctx.seen),
        label_counts(plan),
        written,
    )
    (output.tmp / PART_INDEX).write_bytes(manifest)
    output.commit()
    mine = [s for shards in written.values() for s in shards]
    samples = sum(plan.tally.samples.values())
    return ExportSummary(
        out_dir=str(output.out_dir), format=record.name, samples=samples, selected=selected, dropped=plan.dropped,
        padded=plan.padded, splits=written_per_split(plan), shards=len(mine),
        bytes=sum(s.bytes for s in mine) + len(manifest), skipped=dict(sorted(skipped.items())),
        seconds=round(time.perf_counter() - started, 3),
    )  # fmt: skip


def _tree_splits(
    catalog: Catalog,
    query: QuerySpec,
    tree: tuple[str, ...] | None,
    shuffle: bool,
    seed: int,
    shares: dict[str, float],
) -> list[str] | None:
    """The tree's split folders to export as splits, or None for one split (no split folders);
    ``shares`` gets each one's share of the selected samples."""
    if tree is None and not has_presplit_root(catalog):
        return None  # no need to count the selection's splits: there are none
    if tree is not None:
        check_split_folders(catalog, tree or ("tree",))  # --split tree or NAME on a tree without them
    # With --limit, only the samples the limit keeps: a limit of 20 reads ~20 rows.
    counts = (
        limited_split_counts(catalog, query, shuffle, seed) if query.limit is not None else split_counts(catalog, query)
    )
    named = _named_splits(counts, tree)
    if named is not None:
        total = sum(counts[s] for s in named)
        shares.update((s, counts[s] / total) for s in named)
    return named


def _named_splits(counts: dict[str | None, int], tree: tuple[str, ...] | None) -> list[str] | None:
    """The split folders with selected samples, in SPLITS order (None: one split); refuse a
    selection with samples outside them, or none in them."""
    named = [s for s in SPLITS if counts.get(s)]
    outside = counts.get(None, 0)
    if tree is None and not named:
        return None  # a tree without split folders: one split, as ever
    if not named:
        asked = ", ".join(tree or ()) or "tree"
        raise ExportError(f"--split {asked}: no selected sample is in such a split folder; nothing exported")
    if outside:
        hint = "select the split folders with --split NAME,... or" if tree is None else "use"
        raise ExportError(
            f"{outside} selected sample(s) are not in a split folder ({', '.join(named)}); "
            f"{hint} --split NAME=FRACTION to split every sample by content hash"
        )
    return named


def _deals_tree_folders(catalog: Catalog, query: QuerySpec, tree: tuple[str, ...] | None, dealable: bool) -> bool:
    """Is this a manifest of a pre-split tree that one pass can deal to its split folders?
    (Not with --limit or --per-label, which apply to the whole selection, not per folder.)"""
    plain = dealable and query.limit is None and query.per_label is None
    return plain and (tree is not None or has_presplit_root(catalog))


def _tree_folders(catalog: Catalog, query: QuerySpec, tree: tuple[str, ...] | None) -> list[str] | None:
    """The split folders a one-pass export deals rows to (those left empty are dropped after),
    or None for one split; a sample outside them is refused when it is met (OutsideSplit)."""
    if tree is not None:
        check_split_folders(catalog, tree or ("tree",))
    if not any_in_split_folder(catalog, query):  # the first row of a split folder ends this
        return _named_splits({}, tree)
    return [s for s in SPLITS if not tree or s in tree]


def limited_split_counts(catalog: Catalog, spec: QuerySpec, shuffle: bool, seed: int) -> dict[str | None, int]:
    """Samples per tree split (None: in no split folder) among those ``spec`` selects with its
    ``--limit`` and ``--per-label`` applied, in the export's order."""
    prepared = prepare(catalog, export_spec(spec, shuffle, seed, ("id",)))
    sql = _LIMITED_SPLIT_COUNTS.replace("{selection}", prepared.selection_sql)
    return {split: int(n) for split, n in catalog.read(sql, prepared.params)}
