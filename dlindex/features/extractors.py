"""Extractors: a function from a PIL image to a 1-D vector, named by a spec string.

Specs: a built-in name (``colorhist``, ``thumb``, ``colorthumb``, ``dhash``); ``module:function`` or
``path/to/file.py:function`` for your own; ``torch:MODEL_FILE`` (a model saved with
``torch.export`` or TorchScript) or ``torchvision:MODEL:WEIGHTS_FILE`` for a torch model
from local files (torch is optional and nothing is ever downloaded).
The function receives the image as ``PIL.Image.open`` returns it (not yet decoded, so it
may call ``draft()``), and returns anything ``numpy.asarray`` makes a 1-D real vector of.
A built-in may also have ``from_file``: the same vector computed from the file's path by a
faster route (``colorhist`` decodes plain JPEGs with :mod:`.jpeg`); workers prefer it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageFilter

from dlindex.errors import InputError
from dlindex.features import jpeg, visible
from dlindex.features.extractor_versions import file_digest, function_version
from dlindex.features.text_extractors import BUILTIN_DIMS, BUILTIN_TEXT, PREFIX, declared_version

Vector = npt.NDArray[np.float32]  # what the built-ins return


class ExtractFn(Protocol):
    """An extractor's function: an image as ``PIL.Image.open`` returns it -> a 1-D real vector."""

    def __call__(self, image: Image.Image, /) -> npt.ArrayLike: ...


class FileExtractFn(Protocol):
    """The same vector as an ``ExtractFn``'s, computed from the image file's path."""

    def __call__(self, path: bytes, /) -> npt.ArrayLike: ...


@dataclass(frozen=True)
class Extractor:
    """An extractor resolved from its spec: the function to run, and what is known of it."""

    spec: str
    fn: ExtractFn
    dim: int | None = None  # known in advance for built-ins
    from_file: FileExtractFn | None = None  # the same vector from a path, faster
    gpu: bool = False  # a torch model: --engine ray gives each actor a GPU where the cluster has them
    # What makes its vectors (dlindex.features.extractor_versions): set for built-ins and model
    # files; None: worked out from the function.
    version: str | None = None
    # A text extractor (``text:`` specs, dlindex.features.text_extractors): ``embed`` takes a
    # list of texts and returns a vector per text; ``fn`` is then never called.
    embed: Callable[[list[str]], Any] | None = None
    dtype: str = "float32"  # what a new type of it stores without --dtype


def colorhist(image: Image.Image) -> Vector:
    """96 values: a 32-bin histogram of each of R, G and B, each summing to 1; pixels are
    weighed by their alpha (see :mod:`.visible`)."""
    if image.mode not in ("RGB", "RGBX") or "transparency" in image.info:
        over = visible.rgba(image)
        if over is not None:
            return visible.weighted_histogram(over)
        image = image.convert("RGB")
    counts = image.histogram()[:768]  # RGBX: drop the padding band
    # Fold 8 bins into one in C-level iterators: ~2x faster than numpy on a 768-int list.
    folded = np.fromiter(map(sum, zip(*[iter(counts)] * 8, strict=True)), dtype=np.float64, count=96)
    folded *= 1.0 / max(1, image.width * image.height)
    return folded.astype(np.float32)


def colorhist_file(path: bytes) -> Vector:
    """``colorhist`` of the file at ``path``: plain JPEGs decoded straight into one buffer
    (same pixels, ~20% less CPU than Pillow's path), everything else through Pillow."""
    image = None
    with open(path, "rb", buffering=0) as f:  # unbuffered: the whole read is one, sized by fstat
        if jpeg.may_decode(f.read(3)):  # other files go to Pillow unread here
            f.seek(0)
            image = jpeg.decode_rgbx(f.read())
    if image is not None:
        return colorhist(image)
    with Image.open(path) as image:  # Pillow's own decode, errors and messages
        return colorhist(image)


def thumb(image: Image.Image) -> Vector:
    """256 values in [0, 1]: the image as a 16 x 16 grayscale thumbnail, row by row
    (over a white background where it is transparent: see :mod:`.visible`)."""
    image.draft("L", (64, 64))  # JPEG: decode at reduced scale, as Image.thumbnail does
    small = visible.on_background(image).convert("L").resize((16, 16), Image.Resampling.BOX)
    return np.asarray(small, dtype=np.float32).reshape(-1) / 255.0


COLORTHUMB_SIDE = 12
# Blurred before it is sampled: a near copy cropped by a few percent moves every edge by up to
# half a cell, and a sharp thumbnail then decorrelates (recall 0.94 at 0.03 on bench_dups' planted
# copies without the blur, 0.996 with it; docs/commands/dups.md).
_COLORTHUMB_WORK = 2 * COLORTHUMB_SIDE
_COLORTHUMB_BLUR = 1.5  # Gaussian sigma in work pixels: 3/4 of a cell
# Below this spread (in 0-255 levels, per value) a thumbnail is plain: its pattern would be
# JPEG noise, which correlates with nothing, so it is stored as zeros (cosine distance 1 to all).
_PLAIN_STD = 1.0


def colorthumb(image: Image.Image) -> Vector:
    """432 values: the image's subject (``visible.subject``: over white, without its transparent or
    white margin) as a blurred 12 x 12 RGB thumbnail,
    each colour channel minus its own mean, scaled to unit length. The cosine of two is then the
    correlation of their pixel layout, unchanged by brightness, contrast and a colour cast (which
    would otherwise make every bluish picture alike); a plain (or nearly) image is all zeros."""
    side, work = COLORTHUMB_SIDE, _COLORTHUMB_WORK
    image.draft("RGB", (4 * work, 4 * work))
    small = visible.subject(image).convert("RGB").resize((work, work), Image.Resampling.BOX)
    small = small.filter(ImageFilter.GaussianBlur(_COLORTHUMB_BLUR)).resize((side, side), Image.Resampling.BOX)
    pixels: npt.NDArray[np.float64] = np.asarray(small, dtype=np.float64).reshape(-1, 3)
    v: npt.NDArray[np.float64] = (pixels - pixels.mean(axis=0)).reshape(-1)
    norm = float(np.sqrt(v @ v))
    if norm <= _PLAIN_STD * np.sqrt(v.size):
        return np.zeros(v.size, dtype=np.float32)
    return (v / norm).astype(np.float32)


def dhash(image: Image.Image) -> Vector:
    """64 values of 0 or 1: the difference hash (each pixel brighter than its right neighbour,
    on a 9 x 8 grayscale thumbnail of the image's subject: ``visible.subject``, over white,
    without its transparent or white margin). L2 distance squared is the Hamming distance."""
    image.draft("L", (64, 64))
    small = np.asarray(visible.subject(image).convert("L").resize((9, 8), Image.Resampling.BOX), dtype=np.int16)
    return (small[:, 1:] > small[:, :-1]).astype(np.float32).reshape(-1)


# A built-in's version: raise its number whenever its vectors change (stored ones become stale).
BUILTINS: dict[str, Extractor] = {
    "colorhist": Extractor("colorhist", colorhist, 96, colorhist_file, version="colorhist/1"),
    "thumb": Extractor("thumb", thumb, 256, version="thumb/1"),
    "colorthumb": Extractor("colorthumb", colorthumb, 3 * COLORTHUMB_SIDE**2, version="colorthumb/1"),
    "dhash": Extractor("dhash", dhash, 64, version="dhash/1"),
}
_SPEC_HELP = (
    "expected a built-in (colorhist, thumb, colorthumb, dhash), module:function, path/to/file.py:function, "
    "torch:MODEL_FILE, torchvision:MODEL:WEIGHTS_FILE, text:ngrams or text:module:function"
)


def canonical_spec(spec: str) -> str:
    """The spec as stored: file paths made absolute, so a rerun from elsewhere finds them."""
    spec = spec.strip()
    if spec.startswith(PREFIX):
        return PREFIX + canonical_spec(spec[len(PREFIX) :])
    if spec.startswith("torch:"):
        return "torch:" + _absolute(spec[len("torch:") :])
    if spec.startswith("torchvision:"):
        parts = spec.split(":", 2)
        return ":".join([*parts[:2], _absolute(parts[2])]) if len(parts) == 3 else spec
    module_name, sep, attr = spec.rpartition(":")
    if sep and module_name.endswith(".py"):
        return f"{_absolute(module_name)}:{attr}"
    return spec


def _absolute(path: str) -> str:
    return os.path.abspath(path) if path else path


def load_extractor(spec: str) -> Extractor:
    """Resolve a spec to its function now, in this process; InputError if it cannot be."""
    spec = canonical_spec(spec)
    if spec in BUILTINS:
        return BUILTINS[spec]
    if spec.startswith(PREFIX):
        return _text_extractor(spec)
    if spec.startswith("torchvision:"):
        return _torchvision(spec)
    if spec.startswith("torch:"):
        return _torch_file(spec)
    return Extractor(spec, _user_function(spec, spec))


def _user_function(spec: str, target: str) -> Any:
    """The function ``target`` (``module:function`` or ``file.py:function``) names."""
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr.isidentifier():
        raise InputError(f"bad extractor spec {spec!r}: {_SPEC_HELP}")
    try:
        module = _import(module_name)
    except InputError:
        raise
    except Exception as e:  # the user's module may raise anything on import
        raise InputError(f"cannot import extractor {spec!r}: {type(e).__name__}: {e}") from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise InputError(f"cannot import extractor {spec!r}: {module_name} has no attribute {attr!r}")
    if not callable(fn):
        raise InputError(f"extractor {spec!r} is not callable")
    return fn


def _text_extractor(spec: str) -> Extractor:
    """``text:ngrams`` or ``text:module:function`` (dlindex.features.text_extractors)."""
    target = spec[len(PREFIX) :]
    builtin = BUILTIN_TEXT.get(target)
    embed = builtin if builtin is not None else _user_function(spec, target)
    version = declared_version(embed) or function_version(embed)
    dtype = "float16" if builtin is not None else "float32"  # ngrams' unit vectors lose nothing that counts
    return Extractor(spec, _not_an_image, BUILTIN_DIMS.get(target), version=PREFIX + version, embed=embed, dtype=dtype)


def _not_an_image(image: Image.Image) -> Vector:
    raise TypeError("a text extractor takes texts, not images")


def _import(module_name: str) -> Any:
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise InputError(f"cannot import extractor: no file {module_name}")
        name = "dlindex_extractor_" + path.stem
        loader = importlib.util.spec_from_file_location(name, path)
        assert loader is not None and loader.loader is not None
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        loader.loader.exec_module(module)
        return module
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules in the working folder import
    return importlib.import_module(module_name)


def _torchvision(spec: str) -> Extractor:
    """``torchvision:resnet50:/models/resnet50.pth``: the model's penultimate layer (the
    classifier replaced by identity), ImageNet preprocessing, weights from a local file."""
    parts = spec.split(":", 2)
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise InputError(f"bad extractor spec {spec!r}: torchvision needs torchvision:MODEL:WEIGHTS_FILE")
    model_name, weights = parts[1], parts[2]
    torchvision = _import_optional("torchvision", spec)
    if model_name not in torchvision.models.list_models():
        raise InputError(f"torchvision has no model {model_name!r}")
    _check_weights(weights)
    version = f"torchvision:{model_name}:{_weights_digest(weights)}"
    return Extractor(spec, _TorchModel(lambda: _torchvision_model(model_name, weights)), gpu=True, version=version)


def _torch_file(spec: str) -> Extractor:
    """``torch:/models/encoder.pt2``: a model saved with ``torch.export.save`` (.pt2) or
    ``torch.jit.save`` (TorchScript), taking a (1, 3, 224, 224) ImageNet-normalised batch;
    its output, flattened, is the vector."""
    path = spec.split(":", 1)[1]
    if not path:
        raise InputError(f"bad extractor spec {spec!r}: torch needs torch:MODEL_FILE")
    _import_optional("torch", spec)
    _check_weights(path)

    def build() -> Any:
        import torch

        if path.endswith(".pt2"):
            return torch.export.load(path).module()
        return torch.jit.load(path, map_location="cpu").eval()

    return Extractor(spec, _TorchModel(build), gpu=True, version="torch:" + _weights_digest(path))


def _import_optional(name: str, spec: str) -> Any:
    try:
        return importlib.import_module(name)
    except (ImportError, RuntimeError, OSError) as e:  # a torchvision built for another torch raises RuntimeError
        raise InputError(
            f"extractor {spec!r} needs {name}, which cannot be imported ({e}); pip install 'dlindex[torch]'"
        ) from None


def _check_weights(path: str) -> None:
    if not os.path.isfile(path):
        raise InputError(f"no model file {path}; dlindex never downloads weights, give a local file")


def _weights_digest(path: str) -> str:
    """A model file's version: new weights, new vectors."""
    try:
        return file_digest(path)
    except OSError as e:
        raise InputError(f"cannot read model file {path}: {e.strerror or e}") from None


def use_gpu(extractor: Extractor) -> None:
    """Run ``extractor`` (a torch model, ``gpu`` true) on this process's CUDA device from now on;
    the Ray engine calls it in actors that were given a GPU. Local workers stay on the CPU."""
    if isinstance(extractor.fn, _TorchModel):
        extractor.fn.device = "cuda"


class _TorchModel:
    """A torch model applied to one image; built on first use, in the worker process."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self.build = build
        self.net: Any = None
        self.device = "cpu"

    def __call__(self, image: Image.Image) -> Vector:
        import torch

        if self.net is None:
            torch.set_num_threads(1)  # one worker process per core already
            self.net = self.build().to(self.device)
        rgb = np.asarray(image.convert("RGB").resize((224, 224), Image.Resampling.BILINEAR), dtype=np.float32)
        x = torch.from_numpy(np.ascontiguousarray(((rgb / 255.0 - _MEAN) / _STD).transpose(2, 0, 1)))
        with torch.inference_mode():
            out = self.net(x.unsqueeze(0).to(self.device)).reshape(-1)
            return np.asarray(out.cpu().numpy(), dtype=np.float32)


_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)  # ImageNet statistics, per RGB channel
_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def _torchvision_model(model_name: str, weights: str) -> Any:
    import torch
    import torchvision

    net = torchvision.models.get_model(model_name, weights=None)
    net.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    for head in ("fc", "classifier", "heads", "head"):
        if hasattr(net, head):
            setattr(net, head, torch.nn.Identity())  # the embedding, not the class scores
            break
    return net.eval()
