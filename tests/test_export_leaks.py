"""leak_pairs over export and rule assignments: exactly the brute-force cross-split pairs."""

from __future__ import annotations

import csv
import io
import itertools
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from typer.testing import CliRunner

import dlindex.export.leaks as leaks_module
from dlindex import Catalog, mark_samples
from dlindex.errors import DlindexWarning
from dlindex.export.assignment import export_assignment, rule_assignment
from dlindex.export.leaks import leak_pairs
from dlindex.export.plan import ExportError
from dlindex.features.matrix import load_matrix
from dlindex.quality.duplicate_groups import DEFAULT_MAX_DISTANCE
from dlindex.quality.hashes import load_hashes

from .conftest import compute, export, invoke, scan

RULE = "train=0.6,val=0.4"


def pattern(seed: int, size: tuple[int, int] = (96, 72)) -> Image.Image:
    low = np.random.default_rng(seed).random((4, 5, 3)) * 255
    return Image.fromarray(low.astype(np.uint8)).resize(size, Image.Resampling.BICUBIC)


@pytest.fixture(scope="module")
def leaky(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 pictures with near copies (resized, JPEG q60, cropped) and byte copies; dhash computed."""
    tmp = tmp_path_factory.mktemp("leaks")
    root = tmp / "images"
    for s in range(30):
        d = root / f"c{s % 2}"
        d.mkdir(parents=True, exist_ok=True)
        pattern(s).save(d / f"p{s}.png")
        if s % 3 == 0:
            pattern(s).resize((48, 36), Image.Resampling.LANCZOS).save(d / f"p{s}_half.png")
        if s % 4 == 0:
            pattern(s).save(d / f"p{s}_q60.jpg", quality=60)
        if s % 5 == 0:
            pattern(s).crop((3, 3, 96, 72)).save(d / f"p{s}_crop.png")
            shutil.copyfile(d / f"p{s}.png", d / f"p{s}_copy.png")
    db = tmp / "c.db"
    scan(db, root)
    compute(db, "dhash", extractor="dhash")
    return db


def brute_force(db: Path, split: dict[int, str], k: int | None) -> set[tuple[int, int, str, str, float, str]]:
    """Every pair compared in Python: exact by content, near by popcount of the packed dhash."""
    conn = sqlite3.connect(db)
    content = dict(conn.execute("SELECT id, xxh3_128 FROM image_metadata"))
    conn.close()
    hashes: dict[int, int] = {}
    if k is not None:
        with Catalog(db) as c:
            ids, h = load_hashes(c, "dhash")
        hashes = dict(zip(ids.tolist(), h.tolist(), strict=True))
    out = set()
    for a, b in itertools.combinations(sorted(split), 2):
        if split[a] == split[b]:
            continue
        if content[a] == content[b]:
            out.add((a, b, split[a], split[b], 0.0, "exact"))
        elif k is not None and a in hashes and b in hashes and bin(hashes[a] ^ hashes[b]).count("1") <= k:
            out.add((a, b, split[a], split[b], float(bin(hashes[a] ^ hashes[b]).count("1")), "near"))
    return out


def read_export(out: Path) -> dict[int, str]:
    """id -> split, read without dlindex's readers."""
    index = json.loads((out / "index.json").read_text())
    shards = index["dlindex_shards"]
    if index["format"] == "wds":
        ids = np.fromfile(out / "ids.i64", dtype="<i8").tolist()
        splits = [s["split"] for s in shards for _ in range(s["samples"])]
        return dict(zip(ids, splits, strict=True))
    if index["format"] == "csv":
        return {
            int(r["id"]): s["split"] for s in shards for r in csv.DictReader(io.StringIO((out / s["file"]).read_text()))
        }
    return {json.loads(line)["id"]: s["split"] for s in shards for line in (out / s["file"]).read_text().splitlines()}


def found(db: Path, assignment: object, **options: object) -> set[tuple[int, int, str, str, float, str]]:
    with Catalog(db) as c:
        search = leak_pairs(c, assignment, **options)  # type: ignore[arg-type]
        return {(x.a, x.b, x.split_a, x.split_b, x.distance, x.kind) for x in search}


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "wds"])
def test_export_leaks_equal_brute_force(leaky: Path, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / "out"
    export(leaky, out, format=fmt, split=RULE)
    with Catalog(leaky) as c:
        assignment = export_assignment(c, out)
        rule = rule_assignment(c, RULE)
    split = read_export(out)
    assert {i: assignment.split_of(i) for i in split} == split
    assert (rule.ids.tolist(), rule.codes.tolist(), rule.splits) == (
        assignment.ids.tolist(), assignment.codes.tolist(), assignment.splits)  # fmt: skip
    near = found(leaky, assignment, feature_type="dhash")
    assert near == brute_force(leaky, split, DEFAULT_MAX_DISTANCE)
    assert {kind for *_, kind in near} == {"near"}  # the content-hash split keeps byte copies together
    assert found(leaky, assignment) == set() == brute_force(leaky, split, None)
    assert found(leaky, assignment, feature_type="dhash", max_distance=20) == brute_force(leaky, split, 20)


def test_exact_copies_leak_across_other_splits_and_summary(leaky: Path) -> None:
    with Catalog(leaky) as c:
        base = rule_assignment(c, RULE)
    # a split by id parity: byte copies land apart
    parity = type(base)(("even", "odd"), base.ids, (base.ids % 2).astype(np.int16), "parity")
    split = {int(i): ("even", "odd")[int(i) % 2] for i in base.ids}
    want = brute_force(leaky, split, DEFAULT_MAX_DISTANCE)
    with Catalog(leaky) as c:
        search = leak_pairs(c, parity, feature_type="dhash")
        got = {(x.a, x.b, x.split_a, x.split_b, x.distance, x.kind) for x in search}
        (summary,) = search.summaries
    assert got == want and any(kind == "exact" for *_, kind in got)
    assert (summary.pairs, summary.exact) == (len(want), sum(1 for *_, k in want if k == "exact"))
    assert summary.samples_a == len({p[0] if p[2] == "even" else p[1] for p in want})
    assert summary.samples_b == len({p[1] if p[2] == "even" else p[0] for p in want})


def test_bad_input(leaky: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    export(leaky, out, split=RULE)
    with Catalog(leaky) as c:
        assignment = export_assignment(c, out)
        for options, message in [
            ({"feature_type": "nope"}, "unknown feature type"),
            ({"feature_type": "dhash", "threshold": 0.1}, "use --max-distance"),
            ({"feature_type": "dhash", "max_distance": 65}, "from 0 to 64"),
            ({"max_distance": 3}, "needs a feature type"),
        ]:
            with pytest.raises(Exception, match=message):
                leak_pairs(c, assignment, **options)  # type: ignore[arg-type]
        with pytest.raises(ExportError, match="not a dlindex export"):
            export_assignment(c, tmp_path)


def tampered(out: Path, how: str) -> None:
    index = json.loads((out / "index.json").read_text())
    if how == "outside":
        index["dlindex_shards"][0]["file"] = "../../etc/passwd.jsonl"
    elif how == "manifest":
        name = index["dlindex_shards"][0]["file"]
        (out / name).write_text((out / name).read_text().splitlines()[0] + "\n")
    elif how == "ids":
        (out / "ids.i64").write_bytes((out / "ids.i64").read_bytes()[:-8])
    (out / "index.json").write_text(json.dumps(index))


@pytest.mark.parametrize(("fmt", "how", "message"), [
    ("jsonl", "outside", "'..' part"), ("jsonl", "catalog", "was exported from the catalog .*other.db, not"),
    ("jsonl", "manifest", "does not match its hash"), ("wds", "ids", "ids.i64"),
])  # fmt: skip
def test_tampered_export_is_one_error(leaky: Path, tmp_path: Path, fmt: str, how: str, message: str) -> None:
    out = tmp_path / "out"
    source = leaky
    if how == "catalog":  # another catalog, even one with the same samples
        source = tmp_path / "other.db"
        shutil.copyfile(leaky, source)
    export(source, out, format=fmt, split=RULE)
    tampered(out, how)
    with Catalog(leaky) as c, pytest.raises(ExportError, match=message):
        export_assignment(c, out)


def test_samples_gone_from_the_catalog_are_counted(leaky: Path, tmp_path: Path) -> None:
    db = tmp_path / "copy.db"
    shutil.copyfile(leaky, db)
    out = tmp_path / "out"
    export(db, out, split=RULE)
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("DELETE FROM image_metadata WHERE id IN (1, 2)")
    conn.close()
    with Catalog(db) as c:
        assignment = export_assignment(c, out)
    assert assignment.missing == 2 and assignment.split_of(1) is None


def test_samples_set_aside_after_the_export_are_still_checked(leaky: Path, tmp_path: Path) -> None:
    db = tmp_path / "copy.db"
    shutil.copyfile(leaky, db)
    out = tmp_path / "out"
    export(db, out, split=RULE)

    def pairs() -> set[tuple[int, int]]:
        with Catalog(db) as c:
            return {(x.a, x.b) for x in leak_pairs(c, export_assignment(c, out), feature_type="dhash")}

    before = pairs()
    with Catalog(db) as c:  # the export still holds them: they still leak
        mark_samples(c, [str(i) for pair in before for i in pair], excluded=True)
    assert before and pairs() == before


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_index_or_manifest_is_an_export_error_or_reads(leaky: Path, tmp_path_factory: pytest.TempPathFactory,
                                                               data: st.DataObject) -> None:  # fmt: skip
    out = tmp_path_factory.mktemp("fuzz") / "out"
    if not out.exists():
        export(leaky, out, split=RULE)
    name = data.draw(st.sampled_from(["index.json", "train-000000.jsonl"]))
    raw = bytearray((out / name).read_bytes())
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at : at + data.draw(st.integers(0, 4))] = data.draw(st.binary(max_size=4))
    (out / name).write_bytes(bytes(raw))
    with Catalog(leaky) as c:
        try:
            export_assignment(c, out)
        except ExportError as e:
            assert "\n" not in str(e)


def test_embedding_leaks_equal_brute_force(leaky: Path, tmp_path: Path) -> None:
    db = tmp_path / "thumb.db"
    shutil.copyfile(leaky, db)
    compute(db, "thumb", extractor="thumb")
    with Catalog(db) as c:
        assignment = rule_assignment(c, RULE)
        matrix = load_matrix(c, "thumb")
        vectors = {int(i): np.asarray(v, dtype=np.float64) for i, v in zip(matrix.ids, matrix.vectors, strict=True)}
    split = {int(i): assignment.splits[int(k)] for i, k in zip(assignment.ids, assignment.codes, strict=True)}
    content = dict(sqlite3.connect(db).execute("SELECT id, xxh3_128 FROM image_metadata"))
    for threshold in (0.01, 0.05):
        want = set()
        for a, b in itertools.combinations(sorted(split), 2):
            va, vb = vectors[a], vectors[b]
            d = 1.0 - float(va @ vb / np.sqrt((va @ va) * (vb @ vb)))
            if split[a] != split[b] and content[a] != content[b] and d <= threshold:
                want.add((a, b, split[a], split[b], round(d, 6), "near"))
        got = {(a, b, sa, sb, round(d, 6), k) for a, b, sa, sb, d, k in found(db, assignment, feature_type="thumb",
                                                                              threshold=threshold)}  # fmt: skip
        assert got == want and got


def test_plain_pictures_are_not_near_leaks(tmp_path: Path) -> None:
    """Two blank pages of different sizes hash alike (dhash 0) but are not copies: dups' rule."""
    root = tmp_path / "images" / "c"
    root.mkdir(parents=True)
    Image.new("RGB", (80, 60), "white").save(root / "white.png")
    Image.new("RGB", (64, 64), "white").save(root / "white_square.png")
    pattern(1).save(root / "p.png")
    pattern(1).save(root / "p_q60.jpg", quality=60)
    db = tmp_path / "plain.db"
    scan(db, tmp_path / "images")
    compute(db, "dhash", extractor="dhash")
    with Catalog(db) as c:
        base = rule_assignment(c, RULE)
        apart = type(base)(("a", "b"), base.ids, (np.arange(base.ids.size) % 2).astype(np.int16), "apart")
        names = dict(c.conn.execute("SELECT id, file_path FROM image_metadata"))
        with pytest.warns(DlindexWarning, match="too plain"):
            pairs = list(leak_pairs(c, apart, feature_type="dhash"))
    assert [(names[x.a], names[x.b]) for x in pairs] == [("c/p.png", "c/p_q60.jpg")]


def test_a_split_rule_selects_what_export_would(tmp_path: Path) -> None:
    """Files directly under ROOT have no class: export leaves them out, and so does the rule."""
    root = tmp_path / "tree"
    (root / "cat").mkdir(parents=True)
    for n in range(6):
        Image.new("RGB", (8, 8), (n * 30, 0, 0)).save(root / "cat" / f"{n}.png")
        Image.new("RGB", (8, 8), (0, n * 30, 0)).save(root / f"loose{n}.png")
    db = tmp_path / "c.db"
    scan(db, root)
    out = export(db, tmp_path / "out", split="train=0.5,val=0.5")
    with Catalog(db) as catalog:
        rule = rule_assignment(catalog, "train=0.5,val=0.5")
        exported = export_assignment(catalog, tmp_path / "out")
    assert out.samples == 6 and sum(rule.counts().values()) == 6
    assert rule.ids.tolist() == exported.ids.tolist() and rule.codes.tolist() == exported.codes.tolist()


def test_exact_leaks_of_a_rule_hold_only_the_samples_of_shared_content(
    leaky: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#34: `leaks --split` without --type keeps the samples whose content another shares, not
    every selected one (an id and a split per row: ~2 GB at 10^8); same pairs, summaries, counts."""
    db = tmp_path / "c.db"
    with sqlite3.connect(leaky) as source, sqlite3.connect(db) as target:
        source.backup(target)
    # content hashes that are not hex put copies in splits by id: exact copies then leak
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE image_metadata SET xxh3_128 = 'zz' || substr(xxh3_128, 3) WHERE xxh3_128 IS NOT NULL")
    with Catalog(db) as c:
        full, shared = rule_assignment(c, RULE), rule_assignment(c, RULE, shared_only=True)
        whole, part = leak_pairs(c, full), leak_pairs(c, shared)
        assert list(part) == list(whole) and part.summaries == whole.summaries
        assert [s.exact for s in part.summaries] == [len(list(leak_pairs(c, full)))] != [0]
    assert shared.counts() == full.counts() and shared.missing == full.missing == 0
    assert 0 < shared.ids.size < full.ids.size / 4

    held: list[int] = []
    real = leaks_module.leak_pairs

    def spy(catalog: Catalog, assignment: Any, **kwargs: Any) -> Any:
        held.append(assignment.ids.size)
        return real(catalog, assignment, **kwargs)

    monkeypatch.setattr(leaks_module, "leak_pairs", spy)
    result = invoke(CliRunner(), "leaks", "--split", RULE, "--format", "jsonl", "--no-log", "--db", str(db))
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == part.summaries[0].pairs
    assert held == [shared.ids.size]
    assert f"{RULE}: {full.counts()['train']} train, {full.counts()['val']} val" in result.stderr
