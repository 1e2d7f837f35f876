"""A dataset class that is torch's IterableDataset where torch is installed, a plain iterable where not."""

from __future__ import annotations

from typing import Any, Self, cast


class TorchOptionalIterable:
    """Base of the loader's iterable datasets: torch stays optional (``import dlindex.loader``
    never imports it), yet where torch is installed an instance is a real
    ``torch.utils.data.IterableDataset``, so DataLoader treats it as one (no sampler, workers
    split the stream)."""

    _torch_class: type | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        base = _torch_iterable()
        if base is not None and not issubclass(cls, base):
            # one subclass per dataset class, made once: (cls, IterableDataset)
            if cls._torch_class is None or cls._torch_class.__mro__[1] is not cls:
                cls._torch_class = type(cls.__name__, (cls, base), {"__module__": cls.__module__})
            cls = cls._torch_class
        return object.__new__(cls)


def _torch_iterable() -> type | None:
    try:
        from torch.utils.data import IterableDataset
    except ImportError:
        return None
    return cast(type, IterableDataset)  # torch is read as Any (pyproject's mypy overrides)
