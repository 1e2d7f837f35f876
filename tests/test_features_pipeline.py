"""features compute: built-in and user extractors, failures, retries, resume after kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dlindex import (
    Catalog,
    DlindexError,
    InputError,
    Interrupted,
    QuerySpec,
    ScanOptions,
    feature_vectors,
    query_rows,
    sample_ids,
    scan_tree,
)
from dlindex.features import ComputeOptions, compute_features
from dlindex.features.extractors import colorhist, dhash, thumb

from .backends import ON_BOTH_BACKENDS, where
from .conftest import compute, make_png, rows

pytestmark = ON_BOTH_BACKENDS


def extractor_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, name: str = "userfeat") -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    return name


def test_builtin_colorhist_on_every_ok_sample(scanned_db: Path) -> None:
    summary = compute(scanned_db, "colorhist")
    assert (summary.selected, summary.computed, summary.failed, summary.dim) == (6, 6, 0, 96)
    assert rows(scanned_db, "SELECT DISTINCT processing_status, error FROM image_metadata WHERE status = 'ok'") == [
        (None, None)
    ]
    assert rows(scanned_db, "SELECT count(*) FROM feature_state") == [(0,)]  # done: the vector says so
    with Catalog(scanned_db) as catalog:
        (path,) = [r["path"] for r in query_rows(catalog, labels=["cat"], columns=["path"], limit=1)]
        ids = sample_ids(catalog, labels=["cat"], limit=1)
        got = feature_vectors(catalog, ids, "colorhist")[0]
    with Image.open(path) as image:
        assert np.allclose(got, colorhist(image))
    assert np.allclose(got.reshape(3, 32).sum(axis=1), 1.0)
    again = compute(scanned_db, "colorhist")
    assert (again.already_done, again.computed) == (6, 0)


def test_builtins_shapes() -> None:
    image = Image.new("RGB", (40, 30), (10, 200, 30))
    assert colorhist(image).shape == (96,)
    assert thumb(image).shape == (256,) and 0 <= thumb(image).min() <= thumb(image).max() <= 1
    assert dhash(image).shape == (64,) and set(np.unique(dhash(image))) <= {0.0, 1.0}


def test_filters_select_what_is_computed(scanned_db: Path) -> None:
    summary = compute(scanned_db, "thumb", QuerySpec(labels=["dog"]), dtype="float16")
    assert (summary.computed, summary.dim, summary.dtype) == (3, 256, "float16")
    assert rows(scanned_db, "SELECT count(*) FROM image_features WHERE feature_type = 'thumb'") == [(3,)]


def test_user_extractor_failures_are_recorded_and_the_run_goes_on(
    scanned_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = extractor_module(
        tmp_path,
        monkeypatch,
        """
        import numpy as np
        def fn(image):
            w, h = image.size
            if w == 17:
                raise RuntimeError("no 17s")
            if w == 18:
                return np.zeros(3)         # the wrong shape for this type
            return np.array([w, h], dtype=np.float64)
        def bad_values(image):
            return [float("nan"), 1.0]
        def two_d(image):
            return np.zeros((2, 2))
    """,
    )
    summary = compute(scanned_db, "size", extractor=f"{module}:fn")
    assert (summary.computed, summary.failed, summary.dim) == (2, 4, 2)
    errors = dict(rows(scanned_db, "SELECT image_id, error FROM feature_state WHERE state = 'failed'"))
    assert sorted(errors.values()) == sorted(
        ["RuntimeError: no 17s"] * 2 + ["extractor returned 3 values; feature type 'size' has dim 2"] * 2
    )
    assert rows(
        scanned_db,
        "SELECT count(*) FROM image_metadata WHERE processing_status IS NOT NULL OR error IS NOT NULL AND status = 'ok'",
    ) == [(0,)]
    # failed samples are skipped on a rerun, retried with retry_failed
    assert compute(scanned_db, "size").skipped_failed == 4
    again = compute(scanned_db, "size", retry_failed=True)
    assert (again.computed, again.failed) == (0, 4)
    nan = compute(scanned_db, "nan", extractor=f"{module}:bad_values")
    assert nan.failed == 6 and "NaN" in nan.error_samples[0][1]
    flat = compute(scanned_db, "flat", extractor=f"{module}:two_d")
    assert flat.failed == 6 and "1-D" in flat.error_samples[0][1]


def test_extractor_from_a_file_path(scanned_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "feat_file.py"
    script.write_text("def width(image):\n    return [float(image.size[0])]\n")
    monkeypatch.chdir(tmp_path)
    summary = compute(scanned_db, "width", extractor="feat_file.py:width")
    assert summary.computed == 6
    assert rows(scanned_db, "SELECT extractor FROM feature_types") == [
        (f"{script}:width",)
    ]  # absolute: reruns work anywhere
    monkeypatch.chdir("/")
    assert compute(scanned_db, "width", extractor=f"{script}:width").already_done == 6
    assert sorted(v for (v,) in rows(scanned_db, "SELECT vector FROM image_features")) == sorted(
        np.float32(w).tobytes() for w in (16, 17, 18) for _ in range(2)
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz:fn", "cannot import extractor 'no_such_module_xyz:fn': ModuleNotFoundError"),
        ("os:no_such_function", "os has no attribute 'no_such_function'"),
        ("os:sep", "is not callable"),
        ("nonsense", "bad extractor spec"),
        ("/nowhere/x.py:fn", "no file /nowhere/x.py"),
        ("torchvision:resnet18", "torchvision needs torchvision:MODEL:WEIGHTS_FILE"),
    ],
)
def test_unusable_extractor_spec_writes_nothing(scanned_db: Path, spec: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        compute(scanned_db, "x", extractor=spec)
    assert rows(scanned_db, "SELECT count(*) FROM feature_types") == [(0,)]
    assert rows(scanned_db, "SELECT count(*) FROM feature_state") == [(0,)]


def test_new_type_needs_an_extractor_and_an_existing_one_keeps_its_own(scanned_db: Path) -> None:
    with pytest.raises(InputError, match="is new: give --extractor"):
        compute(scanned_db, "mine")
    compute(scanned_db, "hist", extractor="colorhist")
    with pytest.raises(InputError, match="was made with extractor 'colorhist', not 'dhash'"):
        compute(scanned_db, "hist", extractor="dhash")
    with pytest.raises(InputError, match="stores float32, not float16"):
        compute(scanned_db, "hist", dtype="float16")
    with pytest.raises(InputError, match="invalid feature type name"):
        compute(scanned_db, "bad-name", extractor="colorhist")


def test_a_crashing_extractor_fails_only_its_image(
    scanned_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = extractor_module(
        tmp_path,
        monkeypatch,
        """
        import os
        def fn(image):
            if image.size[0] == 17:
                os._exit(3)  # like a segfault in a C extension
            return [1.0]
    """,
        name="crashy",
    )
    summary = compute(scanned_db, "c", extractor=f"{module}:fn")
    assert (summary.computed, summary.failed) == (4, 2)
    assert {e for _, e in summary.error_samples} == {"the extractor crashed the worker process on this image"}


def test_corrupt_image_fails_when_selected(scanned_db: Path) -> None:
    summary = compute(scanned_db, "colorhist", QuerySpec(status=("corrupt",)))
    assert (summary.computed, summary.failed) == (0, 1)
    assert "UnidentifiedImageError" in summary.error_samples[0][1]
    assert rows(scanned_db, "SELECT status, processing_status FROM image_metadata WHERE status = 'corrupt'") == [
        ("corrupt", None)
    ]
    assert rows(scanned_db, "SELECT state FROM feature_state") == [("failed",)]


SLOW = """
import os, time
import numpy as np
def fn(image):
    with open(os.environ["PIDS_FILE"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(float(os.environ.get("SLOW_S", "0")))
    r, g, b = image.getpixel((0, 0))
    return np.array([r, g, b, image.size[0]], dtype=np.float32)
"""


@pytest.fixture
def many(tmp_path: Path) -> Path:
    root = tmp_path / "many"
    for i in range(120):
        make_png(root / f"l{i % 3}" / f"{i:03d}.png", (8 + i % 5, 8), (i, 255 - i, i % 7))
    db = where(tmp_path / "many.db")
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    return db


def _run_cli(db: Path, tmp_path: Path, slow: float) -> subprocess.Popen[bytes]:
    (tmp_path / "slowfeat.py").write_text(SLOW)
    repo = Path(__file__).resolve().parents[1]  # this checkout's dlindex, not an installed one
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{repo}",
        "PIDS_FILE": str(tmp_path / "pids"),
        "SLOW_S": str(slow),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "dlindex", "features", "compute", "--type", "slow", "--extractor", "slowfeat:fn",
         "--workers", "2", "--db", str(db), "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
    )  # fmt: skip


def _count(db: Path) -> int:
    return int(rows(db, "SELECT count(*) FROM image_features")[0][0])


def _wait_for(db: Path, at_least: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if _count(db) >= at_least:
                return
        except Exception:  # the migration may not have run yet
            pass
        time.sleep(0.05)
    raise AssertionError(f"no progress: {proc.poll()} {proc.stderr.read() if proc.stderr else ''}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split()[2] == "Z")


def test_kill_9_during_compute_then_resume_loses_and_duplicates_nothing(many: Path, tmp_path: Path) -> None:
    proc = _run_cli(many, tmp_path, slow=0.05)
    _wait_for(many, 10, proc)
    proc.kill()
    proc.wait()
    done_before = _count(many)
    assert 0 < done_before < 120
    workers = {int(p) for p in (tmp_path / "pids").read_text().split()}
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in workers), "workers outlived the killed parent"
    queued = rows(many, "SELECT count(*) FROM feature_state WHERE feature_type = 'slow' AND state = 'queued'")[0][0]
    assert queued == 120 - done_before  # every selected sample is queued or completed
    resumed = _run_cli(many, tmp_path, slow=0)
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    assert b'"computed": ' + str(120 - done_before).encode() in out
    assert _count(many) == 120
    assert rows(many, "SELECT count(DISTINCT image_id) FROM image_features") == [(120,)]
    assert rows(many, "SELECT count(*) FROM feature_state") == [(0,)]
    assert rows(many, "SELECT DISTINCT processing_status FROM image_metadata") == [(None,)]
    with Catalog(many) as catalog:
        got = {r["id"]: r["path"] for r in query_rows(catalog, columns=["id", "path"])}
        vectors = feature_vectors(catalog, list(got), "slow")
    for vector, path in zip(vectors, got.values(), strict=False):
        with Image.open(path) as image:
            assert vector.tolist() == [*image.getpixel((0, 0)), image.size[0]]


def test_sigterm_stops_cleanly_and_says_so(many: Path, tmp_path: Path) -> None:
    proc = _run_cli(many, tmp_path, slow=0.05)
    _wait_for(many, 5, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert b"Error: features compute interrupted after" in err and b"Traceback" not in err
    stored = _count(many)
    assert rows(many, "SELECT count(*) FROM feature_state WHERE state = 'queued'") == [(120 - stored,)]


def test_interrupted_is_raised_by_the_library(many: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}

    def progress(n: int) -> None:
        calls["n"] += n
        if calls["n"] >= 8:
            raise KeyboardInterrupt

    with Catalog(many) as catalog, pytest.raises(Interrupted, match="run the same command again"):
        compute_features(catalog, "colorhist", None, ComputeOptions(workers=1, batch_size=4), progress=progress)
    assert 0 < _count(many) < 120


def test_torch_model_from_a_local_file(scanned_db: Path, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
    torch.export.save(torch.export.export(net, (torch.zeros(1, 3, 224, 224),)), str(tmp_path / "tiny.pt2"))
    summary = compute(scanned_db, "tiny", extractor=f"torch:{tmp_path / 'tiny.pt2'}", workers=2)
    assert (summary.computed, summary.failed, summary.dim) == (6, 0, 4)
    with Catalog(scanned_db) as catalog:
        ids = sample_ids(catalog, limit=1)
        (path,) = [r["path"] for r in query_rows(catalog, limit=1, columns=["path"])]
        got = feature_vectors(catalog, ids, "tiny")[0]
    with Image.open(path) as image:
        rgb = np.asarray(image.convert("RGB").resize((224, 224), Image.Resampling.BILINEAR), dtype=np.float32) / 255
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    x = torch.from_numpy(((rgb - mean) / std).transpose(2, 0, 1).astype(np.float32)).unsqueeze(0)
    assert np.allclose(got, net(x).detach().numpy().reshape(-1), atol=1e-5)
    with pytest.raises(InputError, match=r"no model file .*never downloads"):
        compute(scanned_db, "other", extractor=f"torch:{tmp_path / 'missing.pt2'}")


def test_torchvision_needs_a_local_weights_file(scanned_db: Path, tmp_path: Path) -> None:
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError):
        with pytest.raises(InputError, match="needs torchvision, which cannot be imported"):
            compute(scanned_db, "rn", extractor=f"torchvision:resnet18:{tmp_path / 'w.pth'}")
        return
    with pytest.raises(InputError, match=r"never downloads weights|no model file"):
        compute(scanned_db, "rn", extractor=f"torchvision:resnet18:{tmp_path / 'w.pth'}")
    with pytest.raises(InputError, match="torchvision has no model"):
        compute(scanned_db, "rn", extractor=f"torchvision:not_a_model:{tmp_path / 'w.pth'}")


def test_workers_that_cannot_start_stop_the_run(scanned_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dlindex.features import workers

    def broken_init() -> None:
        os._exit(1)

    monkeypatch.setattr(workers, "_init", broken_init)
    with pytest.raises(DlindexError, match="die as they start"):
        compute(scanned_db, "colorhist")
