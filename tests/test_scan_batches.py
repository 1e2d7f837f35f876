"""How the scan cuts its work into tasks: a task's result is held in memory whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dlindex.scan import quick
from dlindex.scan import run as scan_run
from dlindex.scan.tasks import WorkerPool

from .conftest import make_png, scan


def test_units_go_several_to_a_task_only_up_to_the_files_a_task_holds(
    tmp_path: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Folders of 1,000+ files went eight to a task (16,000 files' results at once): the peak RSS
    # of a 2M-file scan was twice that of a 200k one. A task now holds about _FILES_PER_TASK files.
    root = tmp_path / "images"
    for c in range(40):
        for i in range(3):
            make_png(root / f"c{c:02d}" / f"{i}.png", color=(c, i, 0))
    units_per_task: list[int] = []
    submit = WorkerPool.submit
    monkeypatch.setattr(quick, "gnu_find", lambda: None)  # the rescan walks every unit

    def counting(self: WorkerPool, kind: str, fn: Any, args: tuple[Any, ...]) -> None:
        if kind == "diff":
            units_per_task.append(len(args[1]))
        submit(self, kind, fn, args)

    monkeypatch.setattr(WorkerPool, "submit", counting)
    monkeypatch.setattr(scan_run, "_FILES_PER_TASK", 3)  # one folder's worth
    assert scan(db_path, root).new == 120
    assert units_per_task and max(units_per_task) == 1
    units_per_task.clear()
    monkeypatch.setattr(scan_run, "_FILES_PER_TASK", 2048)
    assert scan(db_path, root).unchanged == 120
    assert max(units_per_task) > 1  # small folders still share a task
