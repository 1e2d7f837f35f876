"""Every ```python block in README.md and docs/**/*.md runs as written.

Each block runs in a fresh Python process, in a copy of one prepared folder that holds what
the examples name (made once per session, see `prepared`):

    data/train/{cat,dog}/1.jpg ... 8.jpg   16 small JPEGs, two classes
    train.db                               `dlindex scan data/train --db train.db`, half the
                                           images marked processed, one query logged
    x.png                                  a small PNG
    trace.sql                              three logged SELECTs, as `dlindex log import` reads
    clip.npz, v.npy, ids.txt               512-d vectors for every sample (ids + vectors; a
                                           .npy with its ids file)
    shards/                                `dlindex export shards/ --format wds --split
                                           train=0.9,val=0.1 --shuffle --shard-size 1` (one
                                           rank; 14 train shards)
    mds/, balanced/                        the same split as MDS; `--format parquet --per-label 4`
    manifests/, csv/                       `--format jsonl`, `--format csv` (one split, train)

A block that cannot run here (a GPU, a library that is not installed, a cluster) is fenced
```python no-run and must say why in its first line, as a comment; the test counts them.
Blocks run with MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE set for one process, as `torchrun
--nproc-per-node 1` would, so a distributed example starts with one rank.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```\s*$", re.M | re.S)


@dataclass(frozen=True)
class Snippet:
    page: str
    line: int
    code: str
    run: bool

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def snippets() -> list[Snippet]:
    found = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        text = page.read_text()
        for match in FENCE.finditer(text):
            info = match.group(1).split()
            assert not info or info == ["no-run"], f"{page.name}: unknown fence options {info}"
            line = text.count("\n", 0, match.start()) + 1
            found.append(Snippet(str(page.relative_to(REPO)), line, match.group(2), run=not info))
    return found


ALL = snippets()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dlindex(cwd: Path, *args: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), DLINDEX_NO_LOG="")
    done = subprocess.run(
        [sys.executable, "-m", "dlindex", *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import numpy as np

    root = tmp_path_factory.mktemp("docs-examples")
    for label, shade in (("cat", 40), ("dog", 200)):
        for i in range(1, 9):
            (root / "data" / "train" / label).mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (48 + i, 40), (shade, 10 * i, 90)).save(
                root / "data" / "train" / label / f"{i}.jpg", quality=90
            )
    Image.new("RGBA", (20, 10), (1, 2, 3, 4)).save(root / "x.png")
    _dlindex(root, "scan", "data/train", "--db", "train.db", "--workers", "1", "-q")
    _dlindex(root, "query", "--db", "train.db", "--label", "cat", "--format", "paths")
    ids = list(range(1, 17))
    (root / "ids.txt").write_text("".join(f"{i}\n" for i in ids))
    half = root / "processed.txt"
    half.write_text("".join(f"{i}\n" for i in ids if i % 2))
    _dlindex(root, "mark", str(half), "--processed", "--db", "train.db", "-q")
    half.unlink()
    vectors = np.random.default_rng(0).random((len(ids), 512), dtype=np.float32)
    np.savez(root / "clip.npz", ids=np.array(ids, dtype=np.int64), vectors=vectors)
    np.save(root / "v.npy", vectors)
    (root / "trace.sql").write_text(
        "SELECT id FROM image_metadata WHERE label_id = 1;\n"
        "SELECT id, file_path FROM image_metadata WHERE processed = 1 AND status = 'ok';\n"
        "SELECT count(*) FROM image_metadata WHERE width >= 50;\n"
    )
    _dlindex(root, "export", "shards/", "--db", "train.db", "--format", "wds", "--split", "train=0.9,val=0.1", "--shuffle",
             "--shard-size", "1", "-q")  # fmt: skip
    _dlindex(root, "export", "mds/", "--db", "train.db", "--format", "mds", "--split", "train=0.9,val=0.1", "-q")
    _dlindex(root, "export", "balanced/", "--db", "train.db", "--format", "parquet", "--per-label", "4", "-q")
    _dlindex(root, "export", "manifests/", "--db", "train.db", "--format", "jsonl", "-q")
    _dlindex(root, "export", "csv/", "--db", "train.db", "--format", "csv", "-q")
    return root


def test_every_example_is_collected_and_no_run_ones_say_why() -> None:
    assert len(ALL) >= 10, [s.name for s in ALL]
    skipped = [s for s in ALL if not s.run]
    for s in skipped:
        first = s.code.lstrip().splitlines()[0]
        assert first.startswith("#") and len(first) > 10, f"{s.name}: a no-run block starts with a comment saying why"
    print(f"{len(ALL) - len(skipped)} examples run, {len(skipped)} marked no-run: {[s.name for s in skipped]}")
    assert len(skipped) <= 2, "most examples must run"


@pytest.mark.parametrize("snippet", ALL, ids=[s.name for s in ALL])
def test_example_runs_as_written(snippet: Snippet, prepared: Path, tmp_path: Path) -> None:
    if not snippet.run:
        pytest.skip(f"no-run: {snippet.code.lstrip().splitlines()[0]}")
    work = tmp_path / "work"
    shutil.copytree(prepared, work)
    script = work / "example.py"
    script.write_text(snippet.code)
    env = dict(os.environ, PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")  # fmt: skip
    env.pop("DLINDEX_DB", None)
    done = subprocess.run([sys.executable, str(script)], cwd=work, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, f"{snippet.name} failed:\n{done.stderr[-3000:]}"


def test_the_prepared_folder_is_what_the_docstring_says(prepared: Path) -> None:
    index = json.loads((prepared / "shards" / "index.json").read_text())
    assert set(index["counts"]["splits"]) == {"train", "val"}
    assert len(list((prepared / "data" / "train").rglob("*.jpg"))) == 16
