"""The feature matrix module and the dlindex.features facade that exports it."""

from __future__ import annotations

import importlib

import numpy as np

import dlindex.features
from dlindex.features import _EXPORTS
from dlindex.features.matrix import Matrix


def test_rows_of_marks_ids_without_a_vector() -> None:
    ids = np.array([2, 5, 9], dtype=np.int64)
    matrix = Matrix({}, ids, np.ones(3), np.ones((3, 2), np.float32))
    assert matrix.rows_of(np.array([9, 1, 2, 10, 5], dtype=np.int64)).tolist() == [2, -1, 0, -1, 1]
    empty = Matrix({}, np.zeros(0, np.int64), np.zeros(0), np.zeros((0, 2), np.float32))
    assert empty.rows_of(np.array([1, 2], dtype=np.int64)).tolist() == [-1, -1]


def test_every_public_name_comes_from_the_module_the_facade_names() -> None:
    assert sorted(_EXPORTS) == sorted(dlindex.features.__all__)
    for name, module in _EXPORTS.items():
        defined = importlib.import_module(f"dlindex.features.{module}")
        assert getattr(dlindex.features, name) is getattr(defined, name), name
