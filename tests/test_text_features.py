"""Text feature types: `text:ngrams` and a user's model (`text:file.py:function`) computed per
sample from its texts, with their versions; stale on a new model version, dropped when a text
changes; `similar --to-text` (and across a CLIP-like pair of types made in the test), `dups` and
`leaks` by text; a model that raises or returns the wrong shape fails its samples only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from dlindex import Catalog
from dlindex.errors import InputError
from dlindex.features.text_extractors import NGRAMS_DIM, ngrams, sample_vectors
from dlindex.text.importer import import_texts

from .backends import ON_BOTH_BACKENDS, Location
from .conftest import captioned_catalog, compute, invoke, one_error_line

pytestmark = ON_BOTH_BACKENDS

COLOURS = {"red": (220, 10, 10), "green": (10, 200, 20), "blue": (10, 20, 230)}
CAPTIONS = {
    "a/red1.png": "a red fire engine on a street",
    "a/red2.png": "a red fire engine on a street",  # the same caption: a text duplicate
    "b/green1.png": "green leaves of a tall tree",
    "b/blue1.png": "the blue sea under a clear sky",
    "b/blue2.png": "blue water of the sea and sky",
}
# A tiny CLIP made in the test: images and texts in one 3-d colour space.
MODEL = """
import numpy as np
WORDS = {"red": 0, "green": 1, "blue": 2}
model_version = "colours-1"

def image(img):
    return np.asarray(img.convert("RGB"), dtype=np.float64).reshape(-1, 3).mean(axis=0) / 255.0

def text(texts):
    out = np.zeros((len(texts), 3))
    for i, t in enumerate(texts):
        if "boom" in t:
            raise ValueError("the model cannot read " + t)
        for w in t.split():
            if w in WORDS:
                out[i, WORDS[w]] += 1.0
    return out + 0.01

text.model_version = model_version
text.tokenizer_version = "split-1"

def flat(texts):
    return np.zeros(len(texts))
"""


@pytest.fixture
def db(tmp_path: Path, runner: CliRunner) -> Location:
    images = {name: ((12, 12), next((c for w, c in COLOURS.items() if w in name), (128, 128, 128)))
              for name in [*CAPTIONS, "b/plain.png"]}  # fmt: skip
    (tmp_path / "model.py").write_text(MODEL)
    return captioned_catalog(tmp_path, runner, images, CAPTIONS)


def ids(db: Location) -> dict[str, int]:
    with Catalog(db) as catalog:
        return {p: i for i, p in catalog.conn.execute("SELECT id, file_path FROM image_metadata")}


def similar(runner: CliRunner, db: Location, *args: str) -> list[dict[str, Any]]:
    done = invoke(runner, "similar", *args, "--format", "jsonl", "--db", str(db))
    assert done.exit_code == 0, done.output
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_ngrams_are_lexical_unit_vectors() -> None:
    out = ngrams(["A red car", "a RED car!", "penguins", "penguin", "", "ünïcode words"])
    assert out.shape == (6, NGRAMS_DIM) and out.dtype == np.float32
    assert np.allclose(np.linalg.norm(out[[0, 1, 2, 3, 5]], axis=1), 1.0) and not out[4].any()
    assert np.array_equal(out[0], out[1])  # case and punctuation do not count
    assert out[2] @ out[3] > 0.7  # shared trigrams: a plural is near its singular
    assert abs(out[0] @ out[2]) < 0.3


def test_ngrams_compute_similar_dups_and_leaks(db: Location, runner: CliRunner) -> None:
    summary = compute(db, "ngrams")
    assert (summary.computed, summary.no_text, summary.failed, summary.dim) == (5, 1, 0, NGRAMS_DIM)
    assert summary.extractor == "text:ngrams" and summary.extractor_version == "text:declared:ngrams/1"
    by = ids(db)
    near = similar(runner, db, str(by["a/red1.png"]), "--type", "ngrams", "-k", "2")
    assert near[0]["id"] == by["a/red2.png"] and near[0]["distance"] == pytest.approx(0.0, abs=1e-6)
    ranked = similar(runner, db, "--to-text", "the deep blue sea", "--type", "ngrams", "-k", "2")
    assert {r["path"].rsplit("/", 2)[-2] + "/" + r["path"].rsplit("/", 1)[-1] for r in ranked} == {
        "b/blue1.png", "b/blue2.png"
    } and ranked[0]["query"] == "the deep blue sea"  # fmt: skip
    dups = invoke(runner, "dups", "--type", "ngrams", "--format", "jsonl", "--db", str(db))
    groups = [json.loads(line) for line in dups.stdout.splitlines()]
    assert [sorted(g["ids"]) for g in groups] == [sorted([by["a/red1.png"], by["a/red2.png"]])]
    leaks = invoke(runner, "leaks", "--split", "tree", "--type", "ngrams", "--format", "jsonl", "--db", str(db))
    pairs = [json.loads(line) for line in leaks.stdout.splitlines()]
    assert pairs == []  # the two copies are in one folder: no leak between a/ and b/


def test_a_changed_text_drops_its_vectors_and_the_same_text_keeps_them(db: Location, tmp_path: Path) -> None:
    compute(db, "ngrams")
    by = ids(db)
    (tmp_path / "again.jsonl").write_text(
        json.dumps({"path": "a/red1.png", "caption": CAPTIONS["a/red1.png"]}) + "\n"
        + json.dumps({"path": "b/green1.png", "caption": "a red fire engine on a street"}) + "\n"
    )  # fmt: skip
    with Catalog(db) as catalog:  # the same source again: red1's text is as it was, green1's is new
        import_texts(catalog, tmp_path / "again.jsonl", source="caps")
        have = {r[0] for r in catalog.conn.execute("SELECT image_id FROM image_features WHERE feature_type = 'ngrams'")}
    assert by["a/red1.png"] in have and by["b/green1.png"] not in have and len(have) == 4
    assert compute(db, "ngrams").computed == 1


def test_a_users_model_records_its_versions_and_a_new_one_makes_vectors_again(db: Location, tmp_path: Path) -> None:
    spec = f"text:{tmp_path / 'model.py'}:text"
    first = compute(db, "colour_text", extractor=spec)
    assert first.computed == 5 and first.extractor_version == "text:model=colours-1;tokenizer=split-1"
    model = tmp_path / "model.py"
    model.write_text(MODEL.replace('"colours-1"', '"colours-2"'))
    again = compute(db, "colour_text")
    assert (again.stale, again.computed, again.extractor_version) == (5, 5, "text:model=colours-2;tokenizer=split-1")


def test_clip_like_types_rank_images_by_a_text(db: Location, tmp_path: Path, runner: CliRunner) -> None:
    compute(db, "colour_image", extractor=f"{tmp_path / 'model.py'}:image")
    compute(db, "colour_text", extractor=f"text:{tmp_path / 'model.py'}:text")
    ranked = similar(runner, db, "--to-text", "something green", "--type", "colour_image", "--text-type", "colour_text",
                     "-k", "1")  # fmt: skip
    assert ranked[0]["path"].endswith("b/green1.png")
    ranked = similar(runner, db, "--to-text", "red", "--type", "colour_image", "--text-type", "colour_text", "-k", "2")
    assert {r["path"].rsplit("/", 1)[-1] for r in ranked} == {"red1.png", "red2.png"}
    line = one_error_line(invoke(runner, "similar", "--to-text", "red", "--type", "colour_image", "--db", str(db)))
    assert "made from images" in line and "--text-type" in line
    (tmp_path / "model.py").write_text(MODEL.replace('"colours-1"', '"colours-2"'))
    line = one_error_line(invoke(runner, "similar", "--to-text", "red", "--type", "colour_text", "--db", str(db)))
    assert "changed since its vectors were made" in line


def test_a_model_that_raises_or_returns_the_wrong_shape_fails_its_samples(db: Location, tmp_path: Path) -> None:
    (tmp_path / "caps2.jsonl").write_text(json.dumps({"path": "b/blue2.png", "caption": "boom goes the sea"}) + "\n")
    with Catalog(db) as catalog:
        import_texts(catalog, tmp_path / "caps2.jsonl")
    summary = compute(db, "colour_text", extractor=f"text:{tmp_path / 'model.py'}:text", batch_size=8)
    assert (summary.computed, summary.failed) == (4, 1)  # the batch is retried sample by sample
    assert "raised ValueError: the model cannot read boom goes the sea" in summary.error_samples[0][1]
    flat = compute(db, "flat_text", extractor=f"text:{tmp_path / 'model.py'}:flat")
    assert flat.computed == 0 and flat.failed == 5
    assert all("the text extractor returned shape (" in e and "one vector per text" in e for _, e in flat.error_samples)


def test_sample_vectors_isolate_a_bad_text() -> None:
    def embed(texts: list[str]) -> Any:
        if "bad" in texts:
            raise RuntimeError("no")
        return np.ones((len(texts), 2)) * np.arange(1, len(texts) + 1)[:, None]

    vectors, errors = sample_vectors(embed, [["x", "y"], ["bad"], ["z"]])
    assert errors[0] is None and errors[1] == "the text extractor raised RuntimeError: no" and errors[2] is None
    assert vectors[0].tolist() == [1.5, 1.5] and vectors[1] is None


def test_text_types_refuse_what_they_cannot_do(db: Location, runner: CliRunner) -> None:
    compute(db, "ngrams")
    line = one_error_line(invoke(runner, "features", "auto", "--type", "ngrams", "--db", str(db)))
    assert "made from texts" in line
    both = invoke(runner, "similar", "1", "--to-text", "x", "--type", "ngrams", "--db", str(db))
    assert both.exit_code == 2 and "give one sample (ID or PATH), --ids FILE or --to-text TEXT" in both.output
    with pytest.raises(InputError, match="not with --engine ray"):
        compute(db, "ngrams", engine="ray")


@pytest.mark.timeout(120)
def test_many_long_named_samples_compute_without_a_stall(tmp_path: Path) -> None:
    """A text task is its ids: with the paths, 1,024 samples of 250-character names filled the
    pipe while the worker wrote its 2 MB result, and both waited for ever."""
    from .synthetic import Row, make_catalog

    n = 12 * 1024  # a dozen tasks: several wait in each worker's pipe
    db = make_catalog(tmp_path / "long.db", [Row("x" * 250) for _ in range(n)])
    (tmp_path / "caps.jsonl").write_text("".join(json.dumps({"id": i, "caption": f"caption {i}"}) + "\n"
                                                 for i in range(1, n + 1)))  # fmt: skip
    with Catalog(db) as catalog:
        import_texts(catalog, tmp_path / "caps.jsonl")
    done = compute(db, "ngrams", workers=2)
    assert (done.computed, done.failed) == (n, 0)
