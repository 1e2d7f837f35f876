"""export --features: the error counts every sample without a vector, not one batch's worth."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from dlindex.export import ExportError

from .test_export import _feature_cache, export, mixed_db  # noqa: F401 -- the fixture

__all__ = ["mixed_db"]


@pytest.mark.parametrize("split", [None, "train=0.5,val=0.5"])
def test_missing_count_spans_every_batch(
    mixed_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: str | None
) -> None:  # noqa: F811
    _feature_cache(mixed_db)
    monkeypatch.setattr("dlindex.export.manifest._BATCH", 3)  # 20 samples: seven batches
    with sqlite3.connect(mixed_db) as conn:
        conn.execute("DELETE FROM image_features WHERE image_id % 2 = 0")  # half, in every batch
        (lacking,) = conn.execute("SELECT count(*) FROM image_metadata WHERE status = 'ok' AND id % 2 = 0").fetchone()
    conn.close()
    assert lacking > 3
    kwargs = {"split": split} if split else {}
    with pytest.raises(ExportError) as raised:
        export(mixed_db, tmp_path / "f", format="jsonl", features="tiny", **kwargs)
    message = str(raised.value)
    if split is None:
        assert message.startswith(f"{lacking} sample(s) have no 'tiny' features (id ")
    else:
        assert " in split " in message and "have no 'tiny' features" in message
