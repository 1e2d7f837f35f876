"""Where a job's work runs: local worker processes (the default) or a Ray cluster (``--engine ray``).

Each stage keeps its own pipeline and single writer and asks an engine only to run its pieces:
``features compute`` its (id, path) batches, ``scan`` and ``export`` their static parts (:mod:`dlindex.engines.parts`).
This package imports nothing of Ray until a job asks for it (:mod:`dlindex.engines.ray`).
"""

from __future__ import annotations

from dlindex.errors import InputError

ENGINES = ("local", "ray")


def check_engine(engine: str) -> str:
    """``engine`` if dlindex has it; InputError otherwise."""
    if engine not in ENGINES:
        raise InputError(f"unknown engine {engine!r}: expected one of {', '.join(ENGINES)}")
    return engine
