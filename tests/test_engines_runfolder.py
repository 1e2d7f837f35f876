"""Run folders of --engine ray jobs: dlindex uses and removes only folders and files it made (#32)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlindex.engines.runfolder import MANIFEST, check_run_folder, claim_run_folder, remove_run_folder
from dlindex.errors import InputError

JOB = {"job": "scan", "catalog": "/c.db", "root": "/images", "options": "x"}
ENTRIES = ["cut.db", "part-0.db", "part-1.db"]


def test_a_folder_dlindex_did_not_make_is_refused_and_left_alone(tmp_path: Path) -> None:
    folder = tmp_path / "c.db.parts"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / "part-0.db").write_bytes(b"a catalog of another tree")
    with pytest.raises(InputError, match="dlindex did not make it"):
        check_run_folder(folder)
    with pytest.raises(InputError, match="dlindex did not make it"):
        claim_run_folder(folder, JOB, ENTRIES)
    remove_run_folder(folder)  # no manifest: nothing of dlindex's to remove
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt", "part-0.db"]
    assert (folder / "part-0.db").read_bytes() == b"a catalog of another tree"


def test_a_broken_manifest_or_a_file_in_the_way_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "out.parts"
    folder.mkdir()
    (folder / MANIFEST).write_text('{"kind": "dlindex run folder", "version": 1, "job": {}, "entries": ["../x"]}')
    with pytest.raises(InputError, match="dlindex did not make it"):
        claim_run_folder(folder, JOB, ENTRIES)
    (tmp_path / "file.parts").write_text("x")
    with pytest.raises(InputError, match="not a folder"):
        claim_run_folder(tmp_path / "file.parts", JOB, ENTRIES)


def test_same_job_resumes_another_job_starts_afresh_and_removal_takes_only_its_own(tmp_path: Path) -> None:
    folder = tmp_path / "c.db.parts"
    folder.mkdir()  # empty: adopted
    assert claim_run_folder(folder, JOB, ENTRIES) is False
    for name in ENTRIES:
        (folder / name).write_bytes(b"dlindex's")
    assert claim_run_folder(folder, JOB, ENTRIES) is True  # a rerun of the killed job resumes
    (folder / "notes.txt").write_text("put here by hand")
    assert claim_run_folder(folder, {**JOB, "root": "/other"}, ENTRIES[:2]) is False
    assert sorted(p.name for p in folder.iterdir()) == [MANIFEST, "notes.txt"]  # the old job's parts went
    (folder / "part-0.db").write_bytes(b"dlindex's")
    remove_run_folder(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]  # and the folder stays for it
    (folder / "notes.txt").unlink()
    claim_run_folder(folder, JOB, ENTRIES)
    remove_run_folder(folder)
    assert not folder.exists()
