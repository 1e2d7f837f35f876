"""One row per file across units: files reached through symbolic links, held until the end.

Units of the tree are walked in parallel, so two links in different units may lead to one
file (same st_dev, st_ino). Each file keeps its first path in catalog order, the same
choice on every scan; the other paths are duplicates and their rows, if any, go missing.
Only files reached through a link are held, so a tree without links pays nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlindex.scan.diff import ToProbe
from dlindex.scan.probe import Probe


@dataclass(frozen=True)
class Kept:
    """What the scan does with the held files once every unit is walked."""

    to_probe: list[ToProbe] = field(default_factory=list)  # first paths still to probe
    probed: list[tuple[Probe, ToProbe]] = field(default_factory=list)  # first paths probed already
    duplicates: int = 0  # other paths: counted as skipped 'duplicate', not as seen
    unchanged_duplicates: int = 0  # of those, counted as unchanged by their unit
    missing: list[int] = field(default_factory=list)  # rows of other paths, to mark missing


# What is held of one path: a ToProbe still to probe, a (Probe, ToProbe) pair probed
# already, or the row id of an unchanged file.
Held = ToProbe | tuple[Probe, ToProbe] | int


class LinkedFiles:
    """Files reached through links, by (st_dev, st_ino)."""

    def __init__(self) -> None:
        self.files: dict[tuple[int, int], list[tuple[str, Held]]] = {}  # -> [(file_path, held)]
        self.missing_rows: set[int] = set()  # ids of held files whose row is already 'missing'

    def __bool__(self) -> bool:
        return bool(self.files)

    def add_unchanged(self, unchanged: list[tuple[int, int, str, int]], missing_rows: list[int]) -> None:
        """Hold unchanged files reached through links: (st_dev, st_ino, file_path, id)."""
        for dev, ino, key, row_id in unchanged:
            self.files.setdefault((dev, ino), []).append((key, row_id))
        self.missing_rows.update(missing_rows)

    def hold(
        self, to_probe: list[ToProbe], probed: list[tuple[Probe, ToProbe]]
    ) -> tuple[list[ToProbe], list[tuple[Probe, ToProbe]]]:
        """Keep the items reached through links; return the others."""
        for item in to_probe:
            if item.ident:
                self.files.setdefault(item.ident, []).append((item.key, item))
        for pair in probed:
            if pair[1].ident:
                self.files.setdefault(pair[1].ident, []).append((pair[1].key, pair))
        return [i for i in to_probe if not i.ident], [p for p in probed if not p[1].ident]

    def resolve(self) -> Kept:
        """The first path of each file goes on; the others are duplicates."""
        files, self.files = self.files, {}
        kept = Kept()
        duplicates = unchanged_duplicates = 0
        for entries in files.values():
            entries.sort(key=lambda entry: entry[0])
            first = entries[0][1]
            if isinstance(first, ToProbe):
                kept.to_probe.append(first)
            elif not isinstance(first, int):
                kept.probed.append(first)
            for _, held in entries[1:]:
                duplicates += 1
                row_id: int | None
                if isinstance(held, int):
                    unchanged_duplicates += 1
                    row_id = held
                else:
                    row_id = (held if isinstance(held, ToProbe) else held[1]).known_id
                if row_id is not None and row_id not in self.missing_rows:
                    kept.missing.append(row_id)
        return Kept(kept.to_probe, kept.probed, duplicates, unchanged_duplicates, kept.missing)
