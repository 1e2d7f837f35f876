"""The loaders bench_loader.py compares, and its page-cache, RSS and decode-rate helpers.

Every case is a function ``(Source, Params) -> iterable of batches``; a batch is whatever the
loader yields, and ``batch_samples`` counts it. All cases decode, resize to 224x224 and
return uint8 tensors [B, 3, 224, 224] (SPDL: [B, 224, 224, 3] permuted, a view).
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import mmap
import os
import random
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SIZE = (224, 224)
CASES = {
    "a": "torchvision ImageFolder + torch DataLoader, loose files",
    "b": "webdataset WebDataset + WebLoader, dlindex wds export",
    "c": "MosaicML StreamingDataset + torch DataLoader, dlindex mds export",
    "d": "SPDL 0.8.0 thread pipeline (spdl.io decode), loose files",
    "e": "dlindex.torch.DataLoader, loose files",
    "f": "dlindex.torch.DataLoader, dlindex wds export",
}
# What `pip install ffcv` (1.0.2, sdist only) did on this machine, measured once: its setup.py
# asks pkg-config for opencv4 and libturbojpeg before compiling anything.
FFCV_BUILD = "pip install ffcv (1.0.2 sdist) fails in ~5 s: setup.py needs opencv4 + libturbojpeg via pkg-config"


@dataclass(frozen=True)
class Source:
    tree: Path  # loose class-folder tree
    db: Path  # its catalog
    wds: Path  # dlindex export --format wds
    mds: Path  # dlindex export --format mds


@dataclass(frozen=True)
class Params:
    workers: int
    batch_size: int
    seed: int = 0


# --------------------------------------------------------------------------- the cases
def _pil_to_tensor() -> Callable[[Any], Any]:
    from torchvision import transforms as T

    return T.Compose([T.Resize(SIZE), T.PILToTensor()])  # type: ignore[no-untyped-call]


def case_a(src: Source, p: Params, epoch: int) -> Iterable[Any]:
    import torch
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(str(src.tree), transform=_pil_to_tensor())
    g = torch.Generator().manual_seed(p.seed + epoch)
    return torch.utils.data.DataLoader(
        dataset, batch_size=p.batch_size, shuffle=True, num_workers=p.workers, generator=g
    )


def case_b(src: Source, p: Params, epoch: int) -> Iterable[Any]:
    import webdataset as wds

    urls = [str(t) for t in sorted(src.wds.glob("*.tar"))]
    transform = _pil_to_tensor()
    dataset = (
        wds.WebDataset(urls, nodesplitter=wds.split_by_node, shardshuffle=len(urls), seed=p.seed + epoch)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg;png;webp", "cls")
        .map_tuple(transform, int)
        .batched(p.batch_size)
    )
    return wds.WebLoader(dataset, batch_size=None, num_workers=p.workers)


def case_c(src: Source, p: Params, epoch: int) -> Iterable[Any]:
    import torch
    from PIL import Image
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()  # streaming keeps state in /dev/shm; a killed run leaves it behind
    transform = _pil_to_tensor()

    class Decoded(StreamingDataset):  # type: ignore[misc]
        def __getitem__(self, i: int) -> tuple[Any, int]:
            sample = super().__getitem__(i)
            return transform(Image.open(io.BytesIO(sample["image"])).convert("RGB")), int(sample["label"])

    dataset = Decoded(local=str(src.mds / "train"), batch_size=p.batch_size, shuffle=True, shuffle_seed=p.seed)
    return torch.utils.data.DataLoader(dataset, batch_size=p.batch_size, num_workers=p.workers)


def case_d(src: Source, p: Params, epoch: int) -> Iterable[Any]:
    import spdl.io
    from spdl.pipeline import PipelineBuilder

    classes = sorted(e.name for e in os.scandir(src.tree) if e.is_dir())
    items = [(str(src.tree / c / f), k) for k, c in enumerate(classes) for f in sorted(os.listdir(src.tree / c))]
    random.Random(p.seed + epoch).shuffle(items)
    filter_desc = spdl.io.get_video_filter_desc(scale_width=SIZE[1], scale_height=SIZE[0], scale_mode=None)

    def decode(item: tuple[str, int]) -> tuple[Any, int]:
        return spdl.io.decode_packets(spdl.io.demux_image(item[0]), filter_desc=filter_desc), item[1]

    def collate(batch: list[tuple[Any, int]]) -> tuple[Any, Any]:
        import torch

        images = spdl.io.to_torch(spdl.io.convert_frames([f for f, _ in batch]))  # [B, H, W, C]
        return images.permute(0, 3, 1, 2), torch.tensor([k for _, k in batch])

    pipeline = (
        PipelineBuilder()
        .add_source(items)
        .pipe(decode, concurrency=p.workers)
        .aggregate(p.batch_size)
        .pipe(collate)
        .add_sink(3)
        .build(num_threads=p.workers)
    )
    return _run_pipeline(pipeline)


def _run_pipeline(pipeline: Any) -> Iterator[Any]:
    with pipeline.auto_stop():
        yield from pipeline.get_iterator()


def _dlindex(source: str, src: Source, p: Params, epoch: int) -> Iterable[Any]:
    from dlindex.torch import DataLoader

    loader = DataLoader(
        database_path=str(src.db), batch_size=p.batch_size, num_workers=p.workers, image_size=SIZE, source=source,
        seed=p.seed,
    )  # fmt: skip
    loader.set_epoch(epoch)
    return loader  # type: ignore[no-any-return]


def case_e(src: Source, p: Params, epoch: int) -> Iterable[Any]:
    return _dlindex("files", src, p, epoch)


def case_f(src: Source, p: Params, epoch: int) -> Iterable[Any]:
    return _dlindex(str(src.wds), src, p, epoch)


MAKERS: dict[str, Callable[[Source, Params, int], Iterable[Any]]] = {
    "a": case_a, "b": case_b, "c": case_c, "d": case_d, "e": case_e, "f": case_f,
}  # fmt: skip


def unavailable(case: str) -> str | None:
    """Why ``case`` cannot run here, or None."""
    try:
        if case == "d":
            import spdl.io  # noqa: F401  (its FFmpeg bindings load on first decode: spdl_decoder_check)
        elif case in "ef":
            import dlindex.torch  # noqa: F401
        elif case == "b":
            import webdataset  # noqa: F401
        elif case == "c":
            import streaming  # noqa: F401
    except Exception as e:  # any import failure: report it, skip the case
        return f"{type(e).__name__}: {str(e)[:300]}"
    return None


def spdl_decoder_check(path: Path) -> str | None:
    """spdl.io loads FFmpeg (libavutil etc.) only on first decode: try one file."""
    try:
        import spdl.io

        spdl.io.decode_packets(spdl.io.demux_image(str(path)))
    except Exception as e:  # any failure to decode: report it, skip the case
        return f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return None


def batch_samples(batch: Any) -> tuple[int, Any]:
    """(samples, image tensor) of one batch of any case."""
    images = batch["image"] if isinstance(batch, dict) else batch[0]
    return int(images.shape[0]), images


# --------------------------------------------------------------------------- page cache
def source_files(case: str, src: Source) -> list[Path]:
    """Every file the case reads (cold runs evict them all)."""
    if case in "ade":
        files = [Path(d) / f for d, _, fs in os.walk(src.tree) for f in fs]
        return files + ([src.db] if case == "e" else [])
    if case in "bf":
        return sorted(src.wds.glob("*.tar")) + ([src.db] if case == "f" else [])
    return sorted((src.mds / "train").glob("*.mds"))


def evict(files: list[Path]) -> None:
    os.sync()  # dirty pages cannot be dropped
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(files: list[Path]) -> None:
    for path in files:
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass


def resident_fraction(files: list[Path]) -> tuple[float, str]:
    """(resident bytes / total bytes, how measured): fincore (util-linux) if present, else mincore."""
    if shutil.which("fincore"):
        res = size = 0
        for start in range(0, len(files), 2000):
            out = subprocess.run(
                ["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE", *map(str, files[start : start + 2000])],
                check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
            for line in out.splitlines():
                r, s = map(int, line.split())
                res, size = res + min(r, s), size + s  # whole pages: a small file's last one counts once
        return res / max(1, size), "fincore"
    return _mincore_fraction(files), "mincore"


def _mincore_fraction(files: list[Path]) -> float:
    """Resident share of ``files`` by mmap + mincore(2) through ctypes (no util-linux needed)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = mmap.PAGESIZE
    res = total = 0
    for path in files:
        n = path.stat().st_size
        if n == 0:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, n, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap {path}")
            vec = (ctypes.c_ubyte * ((n + page - 1) // page))()
            try:
                if libc.mincore(addr, n, vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore {path}")
            finally:
                libc.munmap(addr, n)
        finally:
            os.close(fd)
        res += min(n, sum(v & 1 for v in vec) * page)
        total += n
    return res / max(1, total)


# --------------------------------------------------------------------------- RSS and decode rate
class TreeRss:
    """Peak RSS of this process and all its descendants, sampled every ``interval`` s."""

    def __init__(self, interval: float = 0.05) -> None:
        import psutil

        self.me = psutil.Process()
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        total = 0
        for proc in [self.me, *self.me.children(recursive=True)]:
            with contextlib.suppress(Exception):  # a worker exiting between listing and reading
                total += proc.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.interval)

    def __enter__(self) -> TreeRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def one_core_rate(paths: list[Path], seconds: float = 2.0) -> tuple[float, str]:
    """Samples/s one core decodes and resizes to 224x224 (bytes already in memory)."""
    blobs = [p.read_bytes() for p in paths]
    from dlindex.loader.decode import ImageSpec
    from dlindex.loader.decode import one_core_rate as rate

    return float(rate(blobs, ImageSpec(size=SIZE), seconds=seconds)), "dlindex.loader.decode.one_core_rate"
