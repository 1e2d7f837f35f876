"""`dlindex.torch.DataLoader(texts=True, tokenizer=...)`: batches carry each sample's texts and
their token ids from a real HF tokenizer made in the test (nothing downloaded); a tokenizer that
raises or returns the wrong shape is one clear error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from dlindex import Catalog, ScanOptions, scan_tree  # noqa: E402
from dlindex.errors import InputError  # noqa: E402
from dlindex.loader.texts import TokenizerError  # noqa: E402
from dlindex.text.importer import import_texts  # noqa: E402
from dlindex.torch import CatalogDataset, DataLoader  # noqa: E402

from .backends import ON_BOTH_BACKENDS, Location, where  # noqa: E402
from .conftest import make_jpeg  # noqa: E402

pytestmark = ON_BOTH_BACKENDS
N = 12
WORDS = ("red", "car", "blue", "dog", "sky", "a")


def caption(i: int) -> list[str]:
    return [] if i % 4 == 3 else [f"a {WORDS[i % 5]} {WORDS[(i + 1) % 5]}"] + (["second one"] if i % 4 == 0 else [])


@pytest.fixture
def db(tmp_path: Path) -> Location:
    root = tmp_path / "imgs"
    for i in range(N):
        make_jpeg(root / ("x", "y")[i % 2] / f"{i:03d}.jpg", (16, 12), (i * 20, 40, 90))
    location = where(tmp_path / "t.db")
    with Catalog(location, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
        (tmp_path / "caps.jsonl").write_text("".join(
            json.dumps({"path": f"{('x', 'y')[i % 2]}/{i:03d}.jpg", "caption": caption(i)}) + "\n"
            for i in range(N) if caption(i)
        ))  # fmt: skip
        import_texts(catalog, tmp_path / "caps.jsonl")
        ids = {path: ident for ident, path in catalog.conn.execute("SELECT id, file_path FROM image_metadata")}
    return location, {ids[f"{('x', 'y')[i % 2]}/{i:03d}.jpg"]: caption(i) for i in range(N)}  # type: ignore[return-value]


def by_id(batches: list[dict[str, Any]], key: str) -> dict[int, Any]:
    return {int(i): v for b in batches for i, v in zip(b["id"], b[key], strict=True)}


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_carry_each_samples_texts(db: Any, workers: int) -> None:
    location, expected = db
    loader = DataLoader(database_path=location, batch_size=5, num_workers=workers, image_size=8, texts=True)
    batches = list(loader)
    assert by_id(batches, "texts") == expected
    assert by_id(batches, "text") == {i: t[0] if t else "" for i, t in expected.items()}
    assert all(b["image"].shape[0] == len(b["text"]) for b in batches)


def test_an_hf_tokenizer_gives_token_ids_per_batch(db: Any) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: k + 2 for k, w in enumerate(WORDS)}}
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=model, pad_token="[PAD]", unk_token="[UNK]")

    def tokenize(texts: list[str]) -> Any:
        return hf(texts, padding="max_length", max_length=6, truncation=True, return_tensors="np")

    location, expected = db
    loader = DataLoader(database_path=location, batch_size=4, num_workers=2, images=False, tokenizer=tokenize)
    batches = list(loader)
    assert "image" not in batches[0] and batches[0]["input_ids"].dtype == torch.int64
    got = by_id(batches, "input_ids")
    for ident, texts in expected.items():
        words = texts[0].split() if texts else []
        assert got[ident].tolist() == [vocab[w] for w in words] + [0] * (6 - len(words))
    assert by_id(batches, "attention_mask")[next(iter(expected))].sum() == len(
        expected[next(iter(expected))][0].split()
    )


def test_a_plain_function_of_token_lists_is_padded(db: Any) -> None:
    location, expected = db
    dataset = CatalogDataset(
        location, batch_size=6, images=False, tokenizer=lambda ts: [[len(w) for w in t.split()] for t in ts]
    )
    batches = list(dataset)
    ids, mask = by_id(batches, "input_ids"), by_id(batches, "attention_mask")
    for ident, texts in expected.items():
        lengths = [len(w) for w in texts[0].split()] if texts else []
        assert ids[ident][: len(lengths)].tolist() == lengths and int(mask[ident].sum()) == len(lengths)
    single = next(iter(CatalogDataset(location, images=False, texts=True)))  # torch's own batching: one sample
    assert single["texts"] == expected[single["id"]]


@pytest.mark.parametrize(("tokenizer", "message"), [
    (lambda ts: 1 / 0, "the tokenizer raised ZeroDivisionError"),
    (lambda ts: [[1, 2]], "returned list for a batch of 3 texts"),
    (lambda ts: {"input_ids": [[1]] * (len(ts) + 1)}, "has 4 rows for a batch of 3"),
    (lambda ts: {"id": [[1]] * len(ts)}, "'id', which the batch already has"),
    (lambda ts: [["x"]] * len(ts), "row 0 is not a list of whole numbers"),
    (lambda ts: ["abc"] * len(ts), "row 0 is not a list of token ids"),
])  # fmt: skip
def test_a_tokenizer_that_fails_is_one_clear_error(db: Any, tokenizer: Any, message: str) -> None:
    location, _ = db
    with pytest.raises(TokenizerError, match=message):
        list(CatalogDataset(location, batch_size=3, images=False, tokenizer=tokenizer))


def test_texts_options_are_checked(db: Any) -> None:
    location, _ = db
    with pytest.raises(InputError, match="callable"):
        DataLoader(database_path=location, tokenizer="bert-base-uncased")
    with pytest.raises(InputError, match="not with at="):
        DataLoader(database_path=location, texts=True, at="1")
    with pytest.raises(InputError, match="feature_type or texts=True"):
        DataLoader(database_path=location, images=False)


def test_a_resumed_epoch_carries_the_texts_too(db: Any) -> None:
    location, expected = db
    first = DataLoader(database_path=location, batch_size=3, images=False, texts=True, seed=2)
    seen = [next(iter(first))]
    again = DataLoader(database_path=location, batch_size=3, images=False, texts=True, seed=2)
    again.load_state_dict(first.state_dict())
    rest = list(again)
    assert by_id(seen + rest, "texts") == expected
