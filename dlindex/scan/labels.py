"""``scan --labels FILE.csv``: the path,label overrides and the extra columns kept as attributes.

Every column besides ``path`` and ``label`` is an attribute of the samples the file lists (a
source video, a patient id), stored in ``sample_attributes`` and read by ``export --group-by``.
Column names are identifiers; the file's size, its columns and each value are bounded before
anything is kept.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dlindex.errors import InputError

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

ATTRIBUTE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
RESERVED_COLUMNS = ("path", "label")
MAX_COLUMNS = 64  # attribute columns of one file
MAX_VALUE_CHARS = 1024  # one attribute value (a video name, a patient id), not a document
MAX_FIELD_CHARS = 1 << 16  # any one CSV field, path included: csv's own limit is 128 KiB
# One statement per listed path and column: the CSV's values replace the sample's earlier
# values of the same names; an empty cell removes that attribute.
_DELETE_ATTRIBUTE = """DELETE FROM sample_attributes WHERE name = :name AND image_id IN
    (SELECT id FROM image_metadata WHERE root_id = :root_id AND file_path = :path)"""
_SET_ATTRIBUTE = """INSERT OR REPLACE INTO sample_attributes (image_id, name, value)
    SELECT id, :name, :value FROM image_metadata WHERE root_id = :root_id AND file_path = :path"""
_ATTRIBUTE_NAMES = "SELECT DISTINCT name FROM sample_attributes ORDER BY name"
_ATTRIBUTE_VALUES = "SELECT image_id, value FROM sample_attributes WHERE name = ?"


@dataclass(frozen=True)
class LabelsFile:
    """A parsed ``--labels`` file: ``labels`` is None when the file has no label column."""

    labels: dict[str, str | None] | None
    columns: tuple[str, ...] = ()  # the attribute columns, in file order
    attributes: dict[str, dict[str, str]] = field(default_factory=dict)  # path -> column -> value ("" unset)


def check_attribute_name(name: str, where: str) -> str:
    """``name`` if it is an identifier dlindex can store and a user can type, else InputError."""
    if not ATTRIBUTE_NAME.match(name):
        raise InputError(
            f"{where}: column {name[:80]!r} is not a name: use letters, digits and _ "
            "(not starting with a digit, at most 64)"
        )
    return name


def read_labels_file(path: Path) -> LabelsFile:
    """Parse ``path``: a header row with ``path`` and ``label`` and/or attribute columns."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return _parse(f, str(path))
    except OSError as e:
        raise InputError(f"cannot read labels file {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"labels file {path} is not a UTF-8 CSV file: {e}") from None


def _parse(lines: Iterable[str], name: str) -> LabelsFile:
    limit = csv.field_size_limit()
    csv.field_size_limit(MAX_FIELD_CHARS)  # a field that never ends stops here, not in memory
    try:
        reader = csv.reader(lines)
        header = next(reader, None)
        columns = _columns(header, name)
        has_label = "label" in columns
        extra = tuple(c for c in columns if c not in RESERVED_COLUMNS)
        at = {c: i for i, c in enumerate(columns)}
        labels: dict[str, str | None] = {}
        attributes: dict[str, dict[str, str]] = {}
        for line, row in enumerate(reader, start=2):
            if not row:
                continue  # a blank line
            if len(row) < len(columns):
                raise InputError(f"labels file {name}, line {line}: {len(row)} field(s), the header has {len(columns)}")
            key = row[at["path"]].lstrip("/")
            if not key:
                raise InputError(f"labels file {name}, line {line}: empty path")
            if has_label:
                labels[key] = row[at["label"]] or None  # an empty label: no class
            if extra:
                values = {c: row[at[c]] for c in extra}
                for column, value in values.items():
                    if len(value) > MAX_VALUE_CHARS:
                        raise InputError(
                            f"labels file {name}, line {line}: the {column} value is longer than {MAX_VALUE_CHARS} characters"
                        )
                attributes[key] = values
        return LabelsFile(labels if has_label else None, extra, attributes)
    finally:
        csv.field_size_limit(limit)


def _columns(header: list[str] | None, name: str) -> tuple[str, ...]:
    if not header or "path" not in header or len(header) < 2:
        raise InputError(
            f"labels file {name} needs a header row with columns path,label (and any attribute columns), "
            "or path and attribute columns"
        )
    if len(header) > MAX_COLUMNS + len(RESERVED_COLUMNS):
        raise InputError(f"labels file {name} has {len(header)} columns; at most {MAX_COLUMNS} besides path,label")
    seen: set[str] = set()
    for column in header:
        if column not in RESERVED_COLUMNS:
            check_attribute_name(column, f"labels file {name}")
        if column in seen:
            raise InputError(f"labels file {name}: column {column!r} is named twice")
        seen.add(column)
    return tuple(header)


def write_attributes(catalog: Catalog, root_id: int, parsed: LabelsFile) -> None:
    """Store the file's attribute values for the root's samples it lists (one transaction)."""
    if not parsed.columns:
        return
    deletes: list[Mapping[str, object]] = []
    sets: list[Mapping[str, object]] = []
    for path, values in parsed.attributes.items():
        for column, value in values.items():
            params = {"root_id": root_id, "path": path, "name": column, "value": value}
            (sets if value else deletes).append(params)
    with catalog.write_transaction() as conn:
        conn.executemany(_DELETE_ATTRIBUTE, deletes)
        conn.executemany(_SET_ATTRIBUTE, sets)


def attribute_names(catalog: Catalog) -> list[str]:
    """The attribute names any sample of the catalog has, sorted."""
    return [str(name) for (name,) in catalog.read(_ATTRIBUTE_NAMES)]


def attribute_values(catalog: Catalog, name: str) -> dict[int, str]:
    """Sample id -> its value of attribute ``name`` (samples without one are left out)."""
    return {int(image_id): str(value) for image_id, value in catalog.read(_ATTRIBUTE_VALUES, (name,))}
