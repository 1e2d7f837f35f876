"""A synthetic class-per-folder image tree, so every feature can be tried on a fresh machine."""

from __future__ import annotations

import io
import random
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

DEMO_CLASSES = ("airplane", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck", "automobile")


@dataclass(frozen=True)
class DemoTree:
    root: Path
    images: int
    corrupt: int
    created: bool


def make_demo_tree(root: Path, images: int = 2000, seed: int = 0) -> DemoTree:
    """Write ``images`` small JPEG/PNG/WebP files under root/CLASS/, about 1% of them broken.

    An existing complete tree (marked by ``.complete``) is reused as it is.
    """
    marker = root / ".complete"
    corrupt = max(3, images // 100)
    if marker.exists():
        return DemoTree(root, images, corrupt, created=False)
    rng = random.Random(seed)
    for index in range(images):
        label = DEMO_CLASSES[index % len(DEMO_CLASSES)]
        folder = root / label
        folder.mkdir(parents=True, exist_ok=True)
        fmt = rng.choices(("JPEG", "PNG", "WEBP"), weights=(85, 10, 5))[0]
        data = _render(rng, fmt)
        name = f"{label}_{index:05d}.{ {'JPEG': 'jpg', 'PNG': 'png', 'WEBP': 'webp'}[fmt] }"
        if index < corrupt:
            data = _break(data, index)
            name = f"broken_{index:03d}.jpg"
        (folder / name).write_bytes(data)
    # Names a real crawl meets: spaces, quotes, a leading dash, unicode.
    for odd in ("with space.png", "quote'\"d.png", "-leading-dash.png", "ünïcødé.png"):
        (root / "cat" / odd).write_bytes(_render(rng, "PNG"))
    marker.write_text("ok\n")
    return DemoTree(root, images + 4, corrupt, created=True)


def _render(rng: random.Random, fmt: str) -> bytes:
    width, height = rng.randint(48, 160), rng.randint(48, 160)
    image = Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(image)
    for _ in range(4):
        box = sorted(rng.sample(range(width), 2)), sorted(rng.sample(range(height), 2))
        draw.ellipse((box[0][0], box[1][0], box[0][1], box[1][1]), fill=tuple(rng.randrange(256) for _ in range(3)))
    buffer = io.BytesIO()
    image.save(buffer, fmt, quality=rng.randint(60, 95)) if fmt != "PNG" else image.save(buffer, fmt)
    return buffer.getvalue()


def _break(data: bytes, index: int) -> bytes:
    kind = index % 3
    if kind == 0:
        return data[: len(data) // 2]  # truncated mid-scan
    if kind == 1:
        return b"not an image at all\n"
    return b""
