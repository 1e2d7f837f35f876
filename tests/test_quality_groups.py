"""duplicate_pairs / duplicate_groups: exact copies by content hash, near ones by hash or embedding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlindex import Catalog, DlindexWarning, InputError, QuerySpec
from dlindex.features import import_features
from dlindex.quality.duplicate_groups import DuplicateGroup, Keep, Pair, duplicate_groups, duplicate_pairs, group_keys
from dlindex.quality.hashes import load_hashes

from .backends import ON_BOTH_BACKENDS, raw, where
from .conftest import compute, scan
from .synthetic import Row, make_catalog

pytestmark = ON_BOTH_BACKENDS


def catalog(tmp_path: Path, n: int, statuses: dict[int, str] | None = None) -> Path:
    statuses = statuses or {}
    return make_catalog(tmp_path / "c.db", [Row("a", status=statuses.get(i, "ok")) for i in range(1, n + 1)])


def update(db: Path, sql: str, rows: list[tuple[object, ...]]) -> None:
    with raw(db) as conn:
        conn.executemany(sql, rows)


def with_vectors(db: Path, tmp_path: Path, vectors: np.ndarray, name: str = "h") -> None:
    np.savez(tmp_path / f"{name}.npz", ids=np.arange(1, len(vectors) + 1), vectors=vectors)
    with Catalog(db) as c:
        import_features(c, name, tmp_path / f"{name}.npz")


def bits(value: int) -> np.ndarray:
    return np.array([(value >> i) & 1 for i in range(64)], dtype=np.float32)


@pytest.fixture
def exact_db(tmp_path: Path) -> Path:
    """Ids 1-3 and 7 share content a (7 is missing), 4-5 share b, 6 is alone."""
    db = catalog(tmp_path, 7, {7: "missing"})
    content = {1: "a", 2: "a", 3: "a", 4: "b", 5: "b", 6: "c", 7: "a"}
    update(db, "UPDATE image_metadata SET xxh3_128 = ? WHERE id = ?", [(v, k) for k, v in content.items()])
    return db


def test_exact_groups_by_content_hash_ok_only_by_default(exact_db: Path) -> None:
    with Catalog(exact_db) as c:
        assert duplicate_groups(c) == [DuplicateGroup((1, 2, 3), 1, "exact"), DuplicateGroup((4, 5), 4, "exact")]
        assert sorted(duplicate_pairs(c)) == [Pair(1, 2, 0), Pair(1, 3, 0), Pair(2, 3, 0), Pair(4, 5, 0)]
        everything = QuerySpec(status=("ok", "missing"))
        assert duplicate_groups(c, spec=everything)[0].ids == (1, 2, 3, 7)
        assert duplicate_groups(c, spec=QuerySpec(limit=4)) == [DuplicateGroup((1, 2, 3), 1, "exact")]


def test_keep_policies(exact_db: Path) -> None:
    # id: (width, height, bytes, mtime_ns)
    sizes = {
        1: (10, 10, 500, 30),
        2: (20, 5, 900, 10),
        3: (20, 5, 800, None),
        4: (8, 8, None, None),
        5: (8, 8, None, 7),
    }
    update(
        exact_db,
        "UPDATE image_metadata SET width = ?, height = ?, bytes = ?, mtime_ns = ? WHERE id = ?",
        [(*v, k) for k, v in sizes.items()],
    )
    with Catalog(exact_db) as c:
        kept = {keep: [g.kept for g in duplicate_groups(c, keep=keep)] for keep in Keep}
        rest = [g.rest for g in duplicate_groups(c, keep="oldest")]
    # largest: 100 pixels each in group 1, then most bytes; oldest: unknown mtime goes last
    assert kept == {Keep.largest: [2, 4], Keep.oldest: [2, 5], Keep.first: [1, 4]}
    assert rest == [(1, 3), (4,)]
    with Catalog(exact_db) as c, pytest.raises(InputError, match="choose largest, oldest or first"):
        duplicate_groups(c, keep="newest")


def test_near_groups_form_around_the_kept_sample_or_as_connected_components(tmp_path: Path) -> None:
    base = 0x0123456789ABCDEF
    hashes = [base, base ^ 0b111, base ^ 0b111111, ~base & (2**64 - 1), ~base & (2**64 - 1), base ^ (0b11 << 60), 2**40]
    db = catalog(tmp_path, len(hashes), {5: "corrupt"})
    with_vectors(db, tmp_path, np.stack([bits(h) for h in hashes]))
    with Catalog(db) as c:
        ids, packed = load_hashes(c, "h")
        assert ids.tolist() == [1, 2, 3, 4, 6, 7] and packed.tolist() == [hashes[i - 1] for i in ids.tolist()]
        # 1~2 (3 bits), 2~3 (3 bits), 1~6 (2 bits): connected, one chain although 1 and 3 are
        # 6 bits apart; around the kept 1, only its own near copies (3 is no copy of 1)
        connected = duplicate_groups(c, feature_type="h", max_distance=3, grouping="connected")
        assert connected == [DuplicateGroup((1, 2, 3, 6), 1, "near")]
        assert duplicate_groups(c, feature_type="h", max_distance=3) == [DuplicateGroup((1, 2, 6), 1, "near")]
        pairs = sorted(duplicate_pairs(c, feature_type="h", max_distance=3))
        assert pairs == [Pair(1, 2, 3), Pair(1, 6, 2), Pair(2, 3, 3)]
        everything = QuerySpec(status=("ok", "corrupt"))
        groups = duplicate_groups(c, feature_type="h", max_distance=0, spec=everything)
        assert groups == [DuplicateGroup((4, 5), 4, "near")]
        assert group_keys(
            duplicate_groups(c, feature_type="h", max_distance=6, spec=everything, grouping="connected")
        ) == {
            1: 1,
            2: 1,
            3: 1,
            6: 1,
            4: 4,
            5: 4,
        }


def test_identical_hashes_in_bulk_make_one_group(tmp_path: Path) -> None:
    hashes = [7] * 50 + [7 ^ (1 << 30)] * 3 + [2**63]
    db = catalog(tmp_path, len(hashes))
    with_vectors(db, tmp_path, np.stack([bits(h) for h in hashes]))
    with Catalog(db) as c:
        groups = duplicate_groups(c, feature_type="h", max_distance=1, keep=Keep.first)
        assert groups == [DuplicateGroup(tuple(range(1, 54)), 1, "near")]
        assert sum(1 for _ in duplicate_pairs(c, feature_type="h", max_distance=1)) == 53 * 52 // 2


def test_near_groups_by_embedding(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((30, 16)).astype(np.float32)
    vectors[9] = vectors[2] * 2 + 1e-3  # same direction: cosine distance ~0
    vectors[20] = 0  # a zero vector has no duplicates below distance 1
    db = catalog(tmp_path, 30)
    with_vectors(db, tmp_path, vectors, "emb")
    with Catalog(db) as c:
        assert duplicate_groups(c, feature_type="emb") == [DuplicateGroup((3, 10), 3, "near")]
        (pair,) = duplicate_pairs(c, feature_type="emb", threshold=0.01)
        assert (pair.a, pair.b) == (3, 10) and 0 <= pair.distance < 1e-4


def test_wrong_options_for_the_kind_are_input_errors(tmp_path: Path) -> None:
    db = catalog(tmp_path, 3)
    with_vectors(db, tmp_path, np.stack([bits(1), bits(2), bits(3)]))
    with_vectors(db, tmp_path, np.ones((3, 4), dtype=np.float32), "emb")
    with Catalog(db) as c:
        cases = {
            "is a 64-bit hash: use --max-distance": {"feature_type": "h", "threshold": 0.1},
            "is an embedding: use --threshold": {"feature_type": "emb", "max_distance": 3},
            "--max-distance needs a feature type": {"max_distance": 3},
            "--threshold needs a feature type": {"threshold": 0.1},
            "unknown feature type 'nope'": {"feature_type": "nope"},
            "compute it first: dlindex features compute --type dhash": {"feature_type": "dhash"},
            "whole number of bits": {"feature_type": "h", "max_distance": -1},
            "cosine distance from 0 to 2": {"feature_type": "emb", "threshold": 3.0},
        }
        for message, options in cases.items():
            with pytest.raises(InputError, match=message):
                duplicate_groups(c, **options)  # type: ignore[arg-type]
        with pytest.raises(InputError, match="is an embedding, not a 64-bit"):
            load_hashes(c, "emb")


def test_dhash_of_scanned_images(scanned_db: Path) -> None:
    compute(scanned_db, "dhash", extractor="dhash")
    with Catalog(scanned_db) as c:
        ids, hashes = load_hashes(c, "dhash")
        assert len(ids) == 6 and (hashes == 0).all()  # plain colours: no pixel brighter than its neighbour
        with pytest.warns(DlindexWarning, match="6 of 6 images are too plain for dhash"):
            assert duplicate_groups(c, feature_type="dhash") == []  # differently coloured squares are no copies


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.integers(0, 2**12 - 1), min_size=2, max_size=40),
    st.lists(st.integers(1, 5000), min_size=40, max_size=40),
    st.integers(0, 4),
    st.sampled_from(list(Keep)),
)
def test_every_member_is_a_near_copy_of_the_kept_one(
    tmp_path_factory: pytest.TempPathFactory, low_bits: list[int], widths: list[int], k: int, keep: Keep
) -> None:
    """Around-kept groups against their definition: disjoint, each member within k of the kept
    one, the kept one first by the policy among its group, each group inside one connected
    component, and no two ungrouped samples (or an ungrouped one and a leader) near each other."""
    tmp = tmp_path_factory.mktemp("kept")
    hashes = [0xF0F0F0F0F0F0F0F0 ^ v for v in low_bits]  # 12 free bits: many near pairs
    db = catalog(tmp, len(hashes))
    update(
        db,
        "UPDATE image_metadata SET width = ?, height = 1 WHERE id = ?",
        [(widths[i], i + 1) for i in range(len(hashes))],
    )
    with_vectors(db, tmp, np.stack([bits(h) for h in hashes]))
    distance = {
        (a, b): bin(hashes[a - 1] ^ hashes[b - 1]).count("1")
        for a in range(1, len(hashes) + 1)
        for b in range(1, len(hashes) + 1)
    }
    with Catalog(db) as c:
        groups = duplicate_groups(c, feature_type="h", max_distance=k, keep=keep)
        connected = group_keys(duplicate_groups(c, feature_type="h", max_distance=k, grouping="connected"))
    seen = [i for g in groups for i in g.ids]
    assert len(seen) == len(set(seen))
    order = {Keep.largest: lambda i: (-widths[i - 1], i), Keep.oldest: lambda i: (0, i), Keep.first: lambda i: (i,)}[
        keep
    ]
    for g in groups:
        assert all(distance[(g.kept, i)] <= k for i in g.ids)
        assert g.kept == min(g.ids, key=order) and len({connected[i] for i in g.ids}) == 1
    leaders = {g.kept for g in groups}
    free = [i for i in range(1, len(hashes) + 1) if i not in set(seen)]
    assert not any(distance[(a, b)] <= k for a in free for b in [*free, *leaders] if a != b)


def test_plain_pictures_are_left_out_of_dhash_near_groups(tmp_path: Path) -> None:
    """A blank canvas, a plain colour and a flat box on white (its subject is one colour) hash to
    ~0 by dhash: near each other, yet not copies. They are left out with one warning; a picture
    with structure is not."""
    from PIL import Image, ImageDraw

    root = tmp_path / "art" / "a"
    root.mkdir(parents=True)
    Image.new("RGB", (240, 240), "white").save(root / "mark0.png")
    Image.new("RGB", (200, 240), (90, 120, 200)).save(root / "mark1.png")
    image = Image.new("RGB", (240, 240), "white")
    ImageDraw.Draw(image).rectangle((60, 170, 90, 180), fill="black")
    image.save(root / "mark2.png")
    rich = np.random.default_rng(0).random((5, 6, 3)) * 255
    picture = Image.fromarray(rich.astype(np.uint8)).resize((240, 240), Image.Resampling.BICUBIC)
    picture.save(root / "picture.png")
    picture.resize((120, 120)).save(root / "picture_small.png")
    db = where(tmp_path / "art.db")
    scan(db, tmp_path / "art")
    compute(db, "dhash", extractor="dhash")
    with Catalog(db) as c, pytest.warns(DlindexWarning, match=r"^3 of 5 images are too plain for dhash"):
        groups = duplicate_groups(c, feature_type="dhash")
        names = {i: Path(p).name for i, p in c.conn.execute("SELECT id, file_path FROM image_metadata")}
    assert [sorted(names[i] for i in g.ids) for g in groups] == [["picture.png", "picture_small.png"]]
