"""Run folders of ``--engine ray`` jobs (``CATALOG.parts/``, ``OUT.parts/``): made, resumed and removed by dlindex only.

A folder dlindex makes holds ``dlindex-run.json``, naming the job (kind, catalog, subject,
part count, options) and every entry dlindex writes in it. A rerun of the same job resumes
the folder; a run of another job discards the entries the file lists and starts afresh. A
folder without that file (or with one dlindex cannot read) is someone else's: the job refuses
it in one line and touches nothing in it. Removal takes the listed entries only, then the
folder if that leaves it empty. See docs/scale-out.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlindex.errors import InputError

MANIFEST = "dlindex-run.json"
_KIND = "dlindex run folder"
_VERSION = 1
_PARTIAL = MANIFEST + ".tmp"  # a manifest being written


def options_digest(options: object) -> str:
    """A digest of a job's options (their repr): a rerun with other options does not resume."""
    return hashlib.sha256(repr(options).encode()).hexdigest()[:16]


def check_run_folder(folder: Path) -> dict[str, Any] | None:
    """The manifest of the run folder ``folder``; None if there is none yet (or it is empty).

    Raises:
        InputError: ``folder`` exists and dlindex did not make it (nothing in it is touched).
    """
    manifest = folder / MANIFEST
    if not folder.exists() and not folder.is_symlink():
        return None
    if not folder.is_dir():
        raise InputError(f"{folder} is in the way of the run folder: it is not a folder; move it away, then run again")
    if manifest.exists() or any(p.name != _PARTIAL for p in folder.iterdir()):  # else nothing in it to lose
        return _read(manifest, folder)
    return None


def claim_run_folder(folder: Path, job: dict[str, Any], entries: Sequence[str]) -> bool:
    """Make ``folder`` for ``job``, whose files are ``entries`` (names inside it), or take it
    back from an earlier run: True if it is the same job's, to resume.

    Raises:
        InputError: ``folder`` exists and dlindex did not make it (nothing in it is touched).
    """
    earlier = check_run_folder(folder)
    if earlier is not None:
        if earlier["job"] == job and earlier["entries"] == list(entries):
            return True
        _remove(folder, earlier["entries"])  # dlindex's own, of another job: a resume would mix them
    folder.mkdir(exist_ok=True)
    _write(folder / MANIFEST, {"kind": _KIND, "version": _VERSION, "job": job, "entries": list(entries)})
    return False


def discard_entries(folder: Path) -> None:
    """Remove the entries the manifest lists, keeping the manifest: a fresh start of its job."""
    _remove(folder, _read(folder / MANIFEST, folder)["entries"])


def remove_run_folder(folder: Path) -> None:
    """Remove what dlindex wrote in ``folder``, the manifest last, then the folder if empty."""
    manifest = folder / MANIFEST
    if not manifest.exists():
        return
    _remove(folder, _read(manifest, folder)["entries"])
    manifest.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty: what is left there is not dlindex's
        folder.rmdir()


def _read(manifest: Path, folder: Path) -> dict[str, Any]:
    refusal = InputError(
        f"{folder} exists and dlindex did not make it (no {MANIFEST} in it); nothing in it was touched: "
        "move it away (or remove it), then run again"
    )
    try:
        data = json.loads(manifest.read_bytes())
    except (OSError, ValueError):
        raise refusal from None
    if (
        not isinstance(data, dict)
        or data.get("kind") != _KIND
        or data.get("version") != _VERSION
        or not isinstance(data.get("job"), dict)
        or not isinstance(data.get("entries"), list)
        or not all(isinstance(e, str) and e and os.sep not in e and e not in (".", "..") for e in data["entries"])
    ):
        raise refusal
    return data


def _write(manifest: Path, data: dict[str, Any]) -> None:
    partial = manifest.with_name(_PARTIAL)
    partial.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(partial, manifest)  # a folder with a half-written manifest would be refused


def _remove(folder: Path, entries: Sequence[str]) -> None:
    """Remove ``entries``, and the temporaries dlindex writes beside them (dlindex.export.outdir)."""
    temporaries = tuple(f".{name}.dlindex-" for name in entries)
    for path in [folder / name for name in entries] + [p for p in folder.iterdir() if p.name.startswith(temporaries)]:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
