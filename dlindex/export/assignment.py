"""Which split each sample is in: read back from an export, or given by a split rule.

An export's assignment comes from its own files, read as ``--verify`` and the loader read
them (everything confined to the export, sizes bounded by index.json, manifests checked
against their hashes): the manifest rows' ids for jsonl, csv, parquet and dali, and
``ids.i64`` for wds. A rule (``train=0.8,val=0.2``) gives the split ``dlindex export
--split`` would give each selected sample: ``plan.split_of``, by content hash.
"""

from __future__ import annotations

import array
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from dlindex.export.plan import HASH, ID, ExportError, parse_split, select_rows, split_of
from dlindex.exported.confine import ConfineError, hash_regular, resolve_inside
from dlindex.exported.formats import FORMATS, MANIFEST_SUFFIXES, get, listing
from dlindex.exported.ids import wds_ids
from dlindex.exported.index import listed_shards
from dlindex.exported.reader import absolute_paths, load_index, manifest_rows
from dlindex.query.spec import QuerySpec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.features.blobs import Ids

Codes = npt.NDArray[np.int16]
MAX_SPLITS = 1 << 12  # split names an index.json may list; real exports have 2 or 3
_ALL_IDS = "SELECT id FROM image_metadata ORDER BY id"
_RECORDED = "SELECT format, samples, catalog_changes FROM exports WHERE path = :path"
# The selected rows whose content another catalog sample shares, ordered by content: the only
# samples an exact copy can be among. The database groups (externally, beyond its cache).
_SHARED_OF_QUERY = """SELECT * FROM ({query}) AS selected WHERE xxh3_128 IN
    (SELECT xxh3_128 FROM image_metadata WHERE xxh3_128 IS NOT NULL GROUP BY xxh3_128 HAVING count(*) > 1)
    ORDER BY xxh3_128, id"""


@dataclass(frozen=True)
class Assignment:
    """Samples and their splits: ``ids`` ascending and unique, ``codes[k]`` the index in
    ``splits`` of ``ids[k]``'s split. Only samples the catalog has; ``missing`` counts the
    export's samples it no longer has."""

    splits: tuple[str, ...]
    ids: Ids
    codes: Codes
    source: str  # the export folder, or the rule as given
    missing: int = 0
    # Set by rule_assignment(shared_only=True), where ``ids`` hold only the samples whose content
    # another sample shares: the samples per split of the whole selection, and per position a
    # number shared by the samples of the same content.
    totals: tuple[int, ...] | None = None
    content: npt.NDArray[np.int64] | None = None

    def split_of(self, sample_id: int) -> str | None:
        """The split of one sample, None if it is in none."""
        at = int(np.searchsorted(self.ids, sample_id))
        if at < self.ids.size and int(self.ids[at]) == sample_id:
            return self.splits[int(self.codes[at])]
        return None

    def counts(self) -> dict[str, int]:
        """Samples per split, in split order."""
        if self.totals is not None:
            return dict(zip(self.splits, self.totals, strict=True))
        per = np.bincount(self.codes.astype(np.intp), minlength=len(self.splits))
        return {name: int(n) for name, n in zip(self.splits, per.tolist(), strict=True)}


def rule_assignment(
    catalog: Catalog, rule: str | Mapping[str, float], spec: QuerySpec | None = None, *, shared_only: bool = False
) -> Assignment:
    """The split ``dlindex export --split RULE`` gives each sample ``spec`` selects (default: status ok).

    ``shared_only``: only the samples whose content another catalog sample shares (all exact
    copies are among them), with ``totals`` and ``content`` set; the rest of the selection is
    counted as it streams by, never held (memory grows with the copies, not the catalog).
    """
    fractions = parse_split(rule)
    assert fractions is not None
    assign = split_of(fractions)
    code = {name: k for k, name in enumerate(fractions)}
    # has_class: as export, which leaves out files with no class (directly under ROOT)
    spec = replace(spec or QuerySpec(), order="id", has_class=True)
    shown = rule if isinstance(rule, str) else ",".join(f"{k}={v:g}" for k, v in fractions.items())
    ids = array.array("q")
    codes = array.array("h")
    if not shared_only:
        rows, _ = select_rows(catalog, spec, False, 0)
        for row in rows:
            ids.append(row[ID])
            codes.append(code[assign(row)])
        return _assignment(tuple(fractions), np.frombuffer(ids, np.int64), np.frombuffer(codes, np.int16), shown, None)
    totals = dict.fromkeys(fractions, 0)
    rows, _ = select_rows(catalog, spec, False, 0)
    for row in rows:
        totals[assign(row)] += 1
    groups = array.array("q")
    previous, number = None, -1
    rows, _ = select_rows(catalog, spec, False, 0, wrap=(_SHARED_OF_QUERY, {}))
    for row in rows:  # ordered by content: equal ones are neighbours
        if row[HASH] != previous:
            previous, number = row[HASH], number + 1
        ids.append(row[ID])
        codes.append(code[assign(row)])
        groups.append(number)
    by_id = np.argsort(np.frombuffer(ids, np.int64), kind="stable")
    return Assignment(
        tuple(fractions),
        np.ascontiguousarray(np.frombuffer(ids, np.int64)[by_id]),
        np.ascontiguousarray(np.frombuffer(codes, np.int16)[by_id]),
        shown,
        totals=tuple(totals.values()),
        content=np.ascontiguousarray(np.frombuffer(groups, np.int64)[by_id]),
    )


def export_assignment(catalog: Catalog, out_dir: str | os.PathLike[str]) -> Assignment:
    """The splits of the samples an export holds; ExportError (one line) if OUT_DIR is not an
    export, is damaged or altered, holds no sample ids dlindex can read, or was written from
    another catalog."""
    shown = os.fsdecode(out_dir)
    index = load_index(out_dir)
    _check_owner(catalog, shown, index)
    shards = listed_shards(index)
    splits = tuple(dict.fromkeys(s["split"] for s in shards))
    if len(splits) > MAX_SPLITS:
        raise ExportError(f"{shown}: index.json lists {len(splits)} splits; it is damaged")
    code = {name: k for k, name in enumerate(splits)}
    fmt = get(index["format"])
    if fmt.manifest is not None:
        ids, codes = _manifest_ids(out_dir, index, shards, code)
    elif fmt.ids_file:
        found = wds_ids(out_dir, index)
        if found is None:
            raise ExportError(f"{shown} has no ids.i64 (written before dlindex 0.2); export it again")
        ids = np.frombuffer(found, dtype=np.int64)
        counts = [int(s["samples"]) for s in shards]
        codes = np.repeat(np.array([code[s["split"]] for s in shards], dtype=np.int16), counts)
    else:
        readable = listing(tuple(f.name for f in FORMATS.values() if f.manifest is not None or f.ids_file))
        raise ExportError(
            f"{shown} is an {fmt.name} export, which lists no sample ids outside its shards; "
            f"leaks reads {readable} exports (or give the rule: --split train=0.8,val=0.2)"
        )
    return _assignment(splits, ids, codes, shown, catalog)


def _manifest_ids(
    out_dir: str | os.PathLike[str], index: Mapping[str, Any], shards: list[dict[str, Any]], code: dict[str, int]
) -> tuple[Ids, Codes]:
    """The id and split code of every manifest row, each manifest checked against index.json first."""
    base = os.fsencode(out_dir)
    classes = len(index["labels"])
    absolute = absolute_paths(index)
    ids = array.array("q")
    codes = array.array("h")
    for entry in shards:
        name = entry["file"]
        if not name.endswith(MANIFEST_SUFFIXES):
            continue  # dali's file lists: its jsonl manifests hold the same samples
        shown = os.path.join(os.fsdecode(out_dir), name)
        try:
            _, digest = hash_regular(resolve_inside(base, name, what="manifest"), entry["bytes"])
        except FileNotFoundError:
            raise ExportError(f"{shown}: missing; the export is incomplete (see dlindex export --verify)") from None
        except ConfineError as e:
            raise ExportError(f"{os.fsdecode(out_dir)}: {e}") from None
        except OSError as e:
            raise ExportError(f"cannot read {shown}: {e.strerror}") from None
        if digest != entry["xxh3_128"]:
            raise ExportError(f"{shown} does not match its hash in index.json; the export was altered")
        rows = 0
        for row in manifest_rows(out_dir, name, max_bytes=entry["bytes"], classes=classes, absolute_paths=absolute):
            ids.append(row["id"])
            rows += 1
        if rows != entry["samples"]:
            raise ExportError(f"{shown} has {rows} rows where index.json lists {entry['samples']}; it is damaged")
        codes.extend([code[entry["split"]]] * rows)
    return np.frombuffer(ids, dtype=np.int64), np.frombuffer(codes, dtype=np.int16)


def _check_owner(catalog: Catalog, shown: str, index: Mapping[str, Any]) -> None:
    """The export must come from this catalog: index.json names its file, or (a catalog
    moved since) the catalog's own record of the export matches index.json."""
    written_from = index["catalog"]["path"]
    if catalog.backend.is_location(written_from):
        return
    here = os.fsdecode(os.path.abspath(shown))
    record = catalog.conn.execute(_RECORDED, {"path": here}).fetchone()
    counts = index.get("counts")
    samples = counts.get("samples") if isinstance(counts, dict) else None
    if record is not None and tuple(record) == (index["format"], samples, index["catalog"].get("changes")):
        return
    raise ExportError(
        f"{shown} was exported from the catalog {written_from}, not {catalog.path}; give --db {written_from}"
    )


def _assignment(splits: tuple[str, ...], ids: Ids, codes: Codes, source: str, catalog: Catalog | None) -> Assignment:
    """One split per id (repeats of --world-size padding collapse); with ``catalog``, only
    the ids it still has (the rest counted as missing)."""
    order = np.argsort(ids, kind="stable")
    ids, codes = ids[order], codes[order]
    first = np.ones(ids.size, dtype=bool)
    first[1:] = ids[1:] != ids[:-1]
    clash = ~first & (codes != np.roll(codes, 1))
    if clash.any():
        at = int(np.flatnonzero(clash)[0])
        raise ExportError(
            f"{source}: sample {int(ids[at])} is in both {splits[int(codes[at - 1])]!r} and "
            f"{splits[int(codes[at])]!r}; the export is damaged"
        )
    ids, codes = ids[first], codes[first]
    missing = 0
    if catalog is not None:
        known = np.fromiter((row[0] for row in catalog.read(_ALL_IDS)), dtype=np.int64)
        present = np.isin(ids, known, assume_unique=True)
        missing = int(ids.size - present.sum())
        ids, codes = ids[present], codes[present]
    return Assignment(splits, np.ascontiguousarray(ids), np.ascontiguousarray(codes), source, missing)
