"""The test environment is the user's: the clients import as their docs say, with no stand-ins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def test_streaming_and_the_torchvision_extractor_import_as_documented(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    code = (
        "from streaming import StreamingDataset\n"  # docs/commands/export.md's mds recipe
        "import streaming.vision, torch, torchvision\n"
        "from PIL import Image\n"
        "from dlindex.features.extractors import load_extractor\n"
        f"weights = {str(tmp_path / 'resnet18.pth')!r}\n"
        "torch.save(torchvision.models.resnet18(weights=None).state_dict(), weights)\n"
        "extractor = load_extractor('torchvision:resnet18:' + weights)\n"  # docs/commands/features.md
        "vector = extractor.fn(Image.new('RGB', (64, 48), (200, 10, 10)))\n"
        "print(StreamingDataset.__name__, len(vector))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["StreamingDataset", "512"]


def test_no_test_puts_stand_in_modules_in_place_of_a_client() -> None:
    tests = Path(__file__).parent
    for path in tests.glob("*.py"):
        text = path.read_text()
        assert "types.ModuleType(" not in text or path.name == Path(__file__).name, path.name
