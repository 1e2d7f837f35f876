"""Classes and splits: how a file's folder becomes its class and split, and what ``label_id`` means.

One rule everywhere a user sees it (query, the library's rows, exports, ``index.json``, the
loaders): ``label_id`` is the index of the label in a *class list*, a sorted list of label
names. The catalog's class list is the names of the labels that at least one catalogued
file has (missing files too, until ``scan --prune`` deletes them), sorted like Python sorts ``str`` (code point order), which is how
torchvision's ``ImageFolder`` orders its classes. A selection restricted with ``--label``
numbers the named labels only, unless ``classes="catalog"`` asks for the catalog's list.
The ``labels.id`` row id is internal and never shown as ``label_id``.

A tree is *pre-split* when every folder directly under ROOT is named like a split
(``train``, ``val``, ``test``... as Hugging Face ``imagefolder`` recognises them): then the
class is the folder under the split folder, and the split is recorded in its own column.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from dlindex.errors import InputError

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

# Hugging Face datasets' SPLIT_KEYWORDS and NON_WORDS_CHARS (datasets/data_files.py): a folder
# is a split folder when its name is a keyword, alone or set off by one of these characters
# ("train", "val2017", "imagenet-val"); each split has one canonical name, HF's own.
SPLIT_KEYWORDS: dict[str, tuple[str, ...]] = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
SPLITS = tuple(SPLIT_KEYWORDS)
_SEP = "[-._ 0-9]"
_SPLIT_FOLDER = {
    split: re.compile(f"^(?:.*{_SEP})?(?:{'|'.join(words)})(?:{_SEP}.*)?$", re.S)
    for split, words in SPLIT_KEYWORDS.items()
}
CLASS_LISTS = ("selected", "catalog")

# scan keeps in labels only the labels that rows have (dlindex/scan/batch_writer.py), so the table is the list.
_CATALOG_CLASSES = "SELECT name FROM labels"
_LABEL_ROWS = "SELECT id, name FROM labels"
_PRESPLIT_ROOT = "SELECT 1 FROM roots WHERE presplit = 1 LIMIT 1"


def folder_split(name: str) -> str | None:
    """The canonical split a folder name stands for ("val2017" -> "validation"), or None."""
    for split, pattern in _SPLIT_FOLDER.items():  # train, validation, test: HF's order
        if pattern.match(name):
            return split
    return None


def is_presplit(first_level_folders: Iterable[str]) -> bool:
    """A tree is pre-split when it has folders under ROOT and every one is a split folder."""
    names = list(first_level_folders)
    return bool(names) and all(folder_split(name) is not None for name in names)


def enter_folder(label: str | None, split: str | None, presplit: bool, name: str) -> tuple[str | None, str | None]:
    """(label, split) of the files in subfolder ``name`` of a folder whose files have (label, split).

    Files directly under ROOT (or directly under a split folder) have no class: None.
    """
    if label is not None:
        return label, split
    if presplit and split is None:
        found = folder_split(name)
        if found is not None:
            return None, found
    return name, split


def canonical_splits(names: Sequence[str]) -> tuple[str, ...]:
    """Split names as a user types them ("val", "validation", "dev") -> canonical names, in SPLITS order."""
    chosen = set()
    for name in names:
        for split, words in SPLIT_KEYWORDS.items():
            if name == split or name in words:
                chosen.add(split)
                break
        else:
            known = ", ".join(w for words in SPLIT_KEYWORDS.values() for w in words)
            raise InputError(f"unknown split {name!r}; tree splits are: {known}")
    return tuple(s for s in SPLITS if s in chosen)


def has_presplit_root(catalog: Catalog) -> bool:
    """Did the last scan of some root find a pre-split tree?"""
    return bool(list(catalog.read(_PRESPLIT_ROOT)))


def check_split_folders(catalog: Catalog, names: Sequence[str]) -> None:
    """Refuse a tree split on a catalog without split folders: it would select nothing, silently."""
    if names and not has_presplit_root(catalog):
        raise InputError(
            f"split {', '.join(names)}: this catalog has no split folders (no scanned root holds only "
            "train/, val/ or test/ folders), so no file is in a split; split by content hash with "
            "dlindex export OUT --split train=0.9,val=0.1 (the loader reads one with source=OUT, split='train')"
        )


def catalog_classes(catalog: Catalog) -> tuple[str, ...]:
    """The catalog's class list: labels that a catalogued file has, sorted like ImageFolder."""
    return tuple(sorted(str(name) for (name,) in catalog.read(_CATALOG_CLASSES)))


def class_list(catalog: Catalog, labels: Sequence[str], classes: str) -> tuple[tuple[str, ...], str]:
    """(class names in order, which list: "labels" or "catalog") for a selection.

    Args:
        labels: the selection's --label names (already checked to exist).
        classes: "selected" numbers only ``labels`` when given; "catalog" always the catalog's list.
    """
    if classes not in CLASS_LISTS:
        raise InputError(f"unknown class list {classes!r}; choose selected or catalog")
    if labels and classes == "selected":
        return tuple(sorted(set(labels))), "labels"
    return catalog_classes(catalog), "catalog"


def class_index(catalog: Catalog, names: Sequence[str]) -> dict[int, int]:
    """Internal label row id -> index in ``names``, for the labels in ``names``."""
    position = {name: k for k, name in enumerate(names)}
    return {int(i): position[n] for i, n in catalog.read(_LABEL_ROWS) if n in position}
