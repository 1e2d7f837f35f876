"""``dlindex export OUT --append``: add what changed in the catalog since OUT was written.

The rows to add and remove come from the catalog's history (dlindex.catalog.diff), never from
a scan of the catalog or of the export: only samples whose row changed between the export's
recorded state and now are read, each at both states, through the export's own filters.

- **added**: selected now and not then, or selected at both with a value the export carries
  changed (content, label, path, tree split): their shards are written by the export code
  itself (same format, options, splits, ranks, groups) into a folder inside OUT, then renamed
  in after the export's last shard of each split.
- **removed**: selected then and not now, or re-added above: their ids go to
  ``_removed-{generation:06d}.json``; a copy in a shard of an earlier generation is skipped by
  dlindex's readers (dlindex.exported.appended), and the clients' recipes do the same.

Nothing already in OUT is rewritten except its index files (index.json, wds's none, mds's
split indexes), each replaced by a rename. A journal makes the last step restartable: a killed
append leaves the old export whole, and the next ``--append`` completes it (dlindex.export.graft).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlindex.catalog.diff import changed_between
from dlindex.errors import InputError
from dlindex.export.graft import apply_journal, clear_staging, held_export, stage
from dlindex.export.options import ExportOptions, NothingSelected
from dlindex.export.outdir import check_old_export
from dlindex.export.plan import ExportError
from dlindex.export.registry import record_export
from dlindex.exported.formats import get
from dlindex.exported.reader import load_index
from dlindex.query.rows import prepare
from dlindex.query.spec import QuerySpec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

# What an export writes of a sample besides its id: a change to one of these makes the exported
# copy wrong, so it is removed and written again.
EXPORTED = ("id", "xxh3_128", "label", "root", "file_path", "split")
_BATCH = 50_000  # ids per membership query (one JSON parameter each)


@dataclass(frozen=True)
class AppendSummary:
    out_dir: str
    format: str
    generation: int  # 1 for the first append; 0: nothing had changed, nothing written
    from_state: int
    to_state: int
    added: int  # samples written (repeats included)
    removed: int  # exported copies now skipped
    shards: int  # files added
    bytes: int
    skipped: dict[str, int]
    seconds: float
    completed: int | None = None  # the generation an interrupted append left, completed first

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def describe(self) -> str:
        done = f"completed the interrupted append {self.completed}; " if self.completed else ""
        if not self.generation:
            return f"{done}{self.out_dir}: the catalog has not changed since state {self.from_state}; nothing to append"
        return (
            f"{done}appended generation {self.generation} to {self.out_dir} ({self.format}, state {self.from_state} "
            f"-> {self.to_state}) in {self.seconds:.2f} s: {self.added} samples added in {self.shards} files "
            f"({self.bytes} bytes), {self.removed} removed"
        )


def append_export(
    catalog: Catalog,
    out_dir: str | os.PathLike[str],
    *,
    read_threads: int = 0,
    progress: Callable[[int], None] | None = None,
    warn: Callable[[str], None] | None = None,
    note: Callable[[str], None] | None = None,
) -> AppendSummary:
    """Append to the export in ``out_dir`` what changed in ``catalog`` since its recorded state.

    ExportError (nothing written) when ``out_dir`` is no export, was edited by hand, comes from
    another catalog, or was selected in a way an append cannot continue (``--limit``,
    ``--per-label``: a sample's place there depends on the whole selection).
    """
    started = time.perf_counter()
    out = Path(out_dir)
    if catalog.pinned is not None:
        raise ExportError("--append adds what changed up to now; it takes no --at")
    with held_export(out):
        completed = apply_journal(out)  # a killed append first: its export is the one to extend
        index = load_index(out)
        fmt = get(index["format"])
        _check_source(catalog, out, index)
        spec, options = recorded_options(index, read_threads)
        try:
            check_old_export(out)
        except ExportError as e:
            raise ExportError(str(e).replace("refusing to replace", "refusing to append to", 1)) from None
        before, after = int(index["catalog"]["changes"]), catalog.changes()
        if after == before:
            return AppendSummary(str(out), fmt.name, 0, before, after, 0, 0, 0, 0, {}, _since(started), completed)
        try:
            added, removed = changed_membership(catalog, spec, before, after)
        except ExportError:
            raise
        except InputError as e:  # its state is older than the history the catalog keeps
            raise ExportError(
                f"cannot append to {out}: it was written at state {before}, which the catalog no longer keeps "
                f"({str(e).rsplit('(', 1)[-1].rstrip(')')}; see dlindex versions); export it again instead"
            ) from None
        generation = 1 + max((int(a["generation"]) for a in index.get("appends", [])), default=0)
        staging = clear_staging(out, create=True)
        try:
            delta = None
            if added:
                delta = _write_delta(catalog, staging, options, spec, added, progress, warn, note)
            journal = stage(out, index, staging, generation, removed, (before, after), delta)
        except BaseException:
            clear_staging(out)
            raise
        apply_journal(out)
    record_export(catalog, out, fmt.name, journal.samples, after)  # best effort, as export's
    return AppendSummary(
        str(out), fmt.name, generation, before, after, journal.added, len(removed), journal.files, journal.bytes,
        delta.skipped if delta is not None else {}, _since(started), completed,
    )  # fmt: skip


def recorded_options(index: dict[str, Any], read_threads: int = 0) -> tuple[QuerySpec, ExportOptions]:
    """The selection and options index.json records, as the export was written with them."""
    filters, options = index.get("filters") or {}, index["options"]
    for name, option in (("limit", "--limit"), ("per_label", "--per-label")):
        if filters.get(name) is not None:
            raise ExportError(
                f"cannot append to an export made with {option}: which samples it keeps depends on the whole "
                "selection; export it again instead"
            )
    if filters.get("text") is not None or options.get("texts"):
        raise ExportError(
            "cannot append to an export made with --text or --texts: texts keep no history yet, so the samples "
            "whose texts changed since cannot be found; export it again instead"
        )
    spec = QuerySpec(
        labels=filters.get("labels") or (), split=filters.get("split") or (), classes=filters.get("classes", "selected"),
        has_class=True, status=filters.get("status") or (), processed=filters.get("processed"),
        processing_status=filters.get("processing_status") or (), excluded=filters.get("excluded", False),
        since=filters.get("since"), until=filters.get("until"), min_width=filters.get("min_width"),
        min_height=filters.get("min_height"), columns=("id",), cache=False,
    )  # fmt: skip
    group = options.get("group") or {}
    hashed = group.get("threshold") is None
    export = ExportOptions(
        format=index["format"], query=spec, shard_size=options.get("shard_size"),
        shard_bytes=options.get("shard_bytes"), shuffle=bool(options.get("shuffle")), seed=int(options.get("seed", 0)),
        split=options.get("split") or None, world_size=int(options.get("world_size", 1)),
        drop_last=bool(options.get("drop_last")), features=options.get("features"),
        absolute_paths=bool(options.get("absolute_paths")), read_threads=read_threads,
        workers=int(options.get("workers") or 8), group=group.get("mode") if group.get("mode") != "column" else None,
        group_by=group.get("column"), group_type=group.get("type"),
        group_max_distance=group.get("max_distance") if hashed else None, group_threshold=group.get("threshold"),
        appending=tuple(index.get("classes") or ()),
    )  # fmt: skip
    return spec, export


def changed_membership(catalog: Catalog, spec: QuerySpec, before: int, after: int) -> tuple[list[int], list[int]]:
    """(ids to add, ids to remove): among the samples whose row changed between the states,
    those the selection may take now and did not then (or whose exported values changed; a
    sample new since is passed on, the export of the added samples applying the filters), and
    those it took then and does not now (or that are written again)."""
    from dlindex.catalog.connection import Catalog as Opened

    added: list[int] = []
    removed: list[int] = []
    then = Opened(catalog.url, at=f"state:{before}", log=False)  # refused first if that state was pruned
    try:
        changed, existed = changed_between(catalog, before, after)
        earlier = set(existed)  # the others were added since: the export cannot hold them
        for batch in _batches(changed):
            old = [i for i in batch if i in earlier]
            was = _selected(then, spec, old) if old else {}
            now = _selected(catalog, spec, old) if old else {}
            for i in batch:
                if i not in earlier:  # new since: the added samples' export applies the filters itself
                    added.append(i)
                    continue
                if i in now and was.get(i) != now[i]:  # selected since, or its exported values changed
                    added.append(i)
                if i in was and now.get(i) != was[i]:
                    removed.append(i)
    finally:
        then.close()
    return added, removed


def _selected(catalog: Catalog, spec: QuerySpec, ids: list[int]) -> dict[int, tuple[Any, ...]]:
    """Of ``ids``, those the selection takes, each with the values an export writes of it."""
    try:
        prepared = prepare(catalog, replace(spec, ids=ids, columns=EXPORTED))
    except InputError:  # a --label that did not exist at that state: it selected nothing then
        return {}
    return {int(row[0]): tuple(row[1:]) for row in catalog.read(prepared.sql, prepared.params)}


def _batches(ids: list[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), _BATCH):
        yield ids[start : start + _BATCH]


def _write_delta(
    catalog: Catalog, staging: Path, options: ExportOptions, spec: QuerySpec, added: list[int], progress: Any,
    warn: Any, note: Any,
) -> Any:  # fmt: skip
    """The added samples as an export of their own in the staging folder (None: all skipped)."""
    from dlindex.export.run import export_catalog

    delta = replace(options, query=replace(spec, ids=added, columns=QuerySpec().columns))
    try:
        return export_catalog(catalog, staging / "delta", delta, progress, warn, note)
    except NothingSelected:
        return None  # every added file was skipped (the warnings said why): only removals this time


def _check_source(catalog: Catalog, out: Path, index: dict[str, Any]) -> None:
    written_from = str(index["catalog"].get("path", ""))
    if not catalog.backend.is_location(written_from):
        raise ExportError(
            f"{out} was exported from {written_from}, not from {catalog.path}; append from the catalog it came from"
        )
    changes = index["catalog"].get("changes")
    if not isinstance(changes, int) or isinstance(changes, bool) or changes < 0:
        raise ExportError(f"{out}: its index records no catalog state, so what changed since is unknown")


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 3)
