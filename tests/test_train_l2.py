"""The Redis L2 cache against a real redis-server: hits, invalidation, eviction, outages, garbage."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import tracemalloc
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

redis = pytest.importorskip("redis")
torch = pytest.importorskip("torch")

from dlindex import Catalog, ScanOptions, mark_samples, scan_tree  # noqa: E402
from dlindex.errors import DlindexWarning, InputError  # noqa: E402
from dlindex.loader import l2  # noqa: E402
from dlindex.loader.row_cache import RowCache  # noqa: E402
from dlindex.torch import DataLoader  # noqa: E402

from .conftest import make_jpeg  # noqa: E402

REDIS = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(REDIS is None, reason="redis-server is not installed (apt-get install redis-server)")
N = 40


class RedisServer:
    """A throwaway redis-server on a free port, no persistence; ``stop()`` kills it (an outage)."""

    def __init__(self, tmp: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        assert REDIS is not None
        self.proc = subprocess.Popen([REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(tmp)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        self.client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    # Our own server per test (tests/servers.py's shared one must not be killed mid-test).
    made = RedisServer(tmp_path)
    yield made
    made.stop()


@pytest.fixture(autouse=True)
def _warn_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(l2, "_warned", False)  # the warning is once per process


@pytest.fixture
def db(tmp_path: Path) -> Path:
    root = tmp_path / "imgs"
    for i in range(N):
        make_jpeg(root / ("ant", "bee")[i % 2] / f"{i:03d}.jpg", (20, 16), (i * 5 % 255, 40, 90))
    path = tmp_path / "train.db"
    with Catalog(path, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    return path


def loader(db: Path | str, url: str, **options: Any) -> DataLoader:
    # windows of 4 samples: every window asks L2 for its rows
    return DataLoader(database_path=db, batch_size=4, shuffle_buffer=4, image_size=8, l2="on", l2_url=url, **options)


def epoch(dl: DataLoader, number: int = 0) -> list[int]:
    dl.set_epoch(number)
    return sorted(int(i) for batch in dl for i in batch["id"])


def all_ids(db: Path | str, **filters: Any) -> list[int]:
    return epoch(DataLoader(database_path=db, batch_size=4, image_size=8, l2="off", **filters))


def l2_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, DlindexWarning) and "L2" in str(w.message)]


def test_the_second_reader_gets_the_selection_and_rows_from_l2(db: Path, server: RedisServer) -> None:
    first = loader(db, server.url, per_label=7, seed=3)
    ids = epoch(first, 2)
    assert not first.stats()["l2_hit"] and first.stats()["l2_misses"] == 14 and first.stats()["l2_hits"] == 0
    second = loader(db, server.url, per_label=7, seed=3)  # another rank or host: same epoch
    assert epoch(second, 2) == ids
    stats = second.stats()
    assert stats["l2_hit"] and stats["l2_hits"] == 14 and stats["l2_misses"] == 0
    other = loader(db, server.url, per_label=7, seed=3)
    assert epoch(other, 3) != ids and not other.stats()["l2_hit"]  # another epoch, another draw


def test_a_write_between_epochs_is_never_answered_from_an_older_entry(db: Path, server: RedisServer) -> None:
    dl = loader(db, server.url, processed=False)
    before = epoch(dl)
    assert before == all_ids(db) and len(before) == N
    with Catalog(db) as catalog:
        mark_samples(
            catalog, [f"ant/{i:03d}.jpg" for i in range(0, 10, 2)], processed=True, by="path"
        )  # moves the change counter
    after = epoch(loader(db, server.url, processed=False))
    assert after == all_ids(db, processed=False) and len(after) == N - 5
    again = loader(db, server.url, processed=False)
    assert epoch(again) == after and again.stats()["l2_hit"]


def test_flushall_mid_run_reads_the_catalog_without_a_warning(db: Path, server: RedisServer) -> None:
    epoch(loader(db, server.url))  # fills L2
    dl = loader(db, server.url)
    dl.set_epoch(0)
    seen = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k, batch in enumerate(dl):
            seen += batch["id"].tolist()
            if k == 0:
                server.client.flushall()  # evicted: a miss like any other
    assert sorted(seen) == all_ids(db)
    assert l2_warnings(caught) == [] and dl.stats()["l2_misses"] > 0


def test_redis_killed_mid_iteration_warns_once_and_reads_every_id(db: Path, server: RedisServer) -> None:
    epoch(loader(db, server.url))
    dl = loader(db, server.url)
    dl.set_epoch(0)
    seen = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k, batch in enumerate(dl):
            seen += batch["id"].tolist()
            if k == 1:
                server.stop()
        assert sorted(seen) == all_ids(db)
        assert epoch(dl, 1) == all_ids(db)  # the next epoch too, from the catalog
        assert epoch(loader(db, server.url), 2) == all_ids(db)
    assert len(l2_warnings(caught)) == 1, l2_warnings(caught)
    assert "reading the catalog instead" in l2_warnings(caught)[0]


def test_redis_down_from_the_start(db: Path, server: RedisServer) -> None:
    server.stop()
    with pytest.warns(DlindexWarning, match="L2 cache at redis://127.0.0.1"):
        assert epoch(loader(db, server.url)) == all_ids(db)


@pytest.mark.parametrize("damage", ["garbage", "flip", "truncate", "huge", "other_counter"])
def test_a_damaged_value_is_a_miss(db: Path, server: RedisServer, damage: str) -> None:
    epoch(loader(db, server.url, per_label=5))
    keys = sorted(server.client.keys("dlindex:l2:*"))
    assert len(keys) == 3 + 10  # manifest, two labels, ten rows
    if damage == "other_counter":
        with Catalog(db) as catalog:
            mark_samples(catalog, ["1"], processed=True)  # one transaction: the counter moves by one
            state = catalog.state()
    for key in keys:
        value = server.client.get(key)
        assert value is not None
        if damage == "garbage":
            value = b"\x00" * len(value)
        elif damage == "flip":
            value = value[:30] + bytes([value[30] ^ 1]) + value[31:]
        elif damage == "truncate":
            value = value[:-1]
        elif damage == "huge":
            value = value + b"x" * (l2.MAX_MANIFEST_BYTES + 1)
        else:  # a valid value moved under the key of the state the write made
            parts = key.split(b":")
            parts[4:6] = [str(state.changes).encode(), state.token.encode()]
            key = b":".join(parts)
        server.client.set(key, value)
    dl = loader(db, server.url, per_label=5)
    assert epoch(dl) == all_ids(db, per_label=5)
    stats = dl.stats()
    assert not stats["l2_hit"] and stats["l2_hits"] == 0 and stats["l2_misses"] == 10


def test_a_planted_value_is_bounded_before_it_is_allocated(db: Path, server: RedisServer) -> None:
    with Catalog(db) as catalog:
        cache = l2.L2Cache(server.url, l2.catalog_identity(catalog))
        state = catalog.state()
        rows = RowCache(catalog, 0, cache, state)
        rows.get_many([1, 2])  # stored in L2
    key = cache._key(state, "row", 1)
    server.client.set(key, b"y" * (64 << 20))
    tracemalloc.start()
    try:
        found = cache.load_rows([1, 2], state)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert set(found) == {2} and peak < 1 << 20, peak


def test_two_catalogs_never_share_entries(db: Path, server: RedisServer, tmp_path: Path) -> None:
    copy = tmp_path / "copy.db"
    shutil.copy(db, copy)
    with Catalog(copy) as catalog:
        mark_samples(catalog, ["ant/000.jpg"], processed=True, by="path")
    with Catalog(db) as catalog:
        mark_samples(catalog, ["bee/001.jpg"], processed=True, by="path")  # the same change counter in both
    first = loader(db, server.url, processed=False)
    assert epoch(first) == all_ids(db, processed=False)
    second = loader(copy, server.url, processed=False)
    assert epoch(second) == all_ids(copy, processed=False) != all_ids(db, processed=False)
    assert not second.stats()["l2_hit"]


def test_l2_is_on_by_default_only_for_a_server_catalog_with_a_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "redis://cache:6379/0"
    assert l2.wanted("auto", url, "train.db") is None  # local SQLite beats a round trip
    assert l2.wanted("auto", url, "postgresql://db.example/train") == url
    assert l2.wanted("auto", None, "postgresql://db.example/train") is None
    assert l2.wanted("on", url, "train.db") == url
    assert l2.wanted("off", url, "postgresql://db.example/train") is None
    monkeypatch.setenv("DLINDEX_L2", url)
    assert l2.wanted("auto", None, "postgresql://db.example/train") == url
    with pytest.raises(InputError, match="not a Redis URL"):
        l2.wanted("on", "http://user:secret@cache", "train.db")
    monkeypatch.delenv("DLINDEX_L2")
    with pytest.raises(InputError, match="needs a Redis URL"):
        l2.wanted("on", None, "train.db")
    with pytest.raises(InputError, match="l2 must be one of"):
        l2.wanted("sometimes", url, "train.db")


def test_loaded_selection_matches_the_database_bit_for_bit(db: Path, server: RedisServer) -> None:
    from dlindex.loader.selection import epoch_spec, resolve
    from dlindex.query.spec import QuerySpec

    spec = epoch_spec(QuerySpec(per_label=6), seed=1, epoch=4)
    with Catalog(db) as catalog:
        cache = l2.L2Cache(server.url, l2.catalog_identity(catalog))
        cold = resolve(catalog, spec, cache)
        warm = resolve(catalog, spec, cache)
        plain = resolve(catalog, spec)
    assert warm.l2_hit and not cold.l2_hit
    for a, b in ((warm, cold), (warm, plain)):
        assert np.array_equal(a.ids, b.ids) and np.array_equal(a.labels, b.labels)
        assert np.array_equal(a.sizes, b.sizes) and a.hashes.tobytes() == b.hashes.tobytes()
        assert (a.digest, a.classes, a.changes) == (b.digest, b.classes, b.changes)


def test_dataloader_workers_share_l2(db: Path, server: RedisServer) -> None:
    epoch(loader(db, server.url, num_workers=2))
    dl = loader(db, server.url, num_workers=2)
    assert epoch(dl) == all_ids(db)
    stats = dl.stats()
    assert stats["l2_hit"] and stats["l2_hits"] == N and stats["l2_misses"] == 0


def test_on_a_server_catalog_auto_turns_l2_on(tmp_path: Path, pg_url: str, redis_url: str) -> None:
    """A PostgreSQL catalog with a Redis URL: L2 is on by default, the second reader's epoch
    comes from it, and it equals the catalog's own answer."""
    root = tmp_path / "imgs"
    for i in range(N):
        make_jpeg(root / ("ant", "bee")[i % 2] / f"{i:03d}.jpg", (20, 16), (i * 5 % 255, 40, 90))
    with Catalog(pg_url, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    options: dict[str, Any] = {"batch_size": 4, "shuffle_buffer": 4, "image_size": 8, "per_label": 7, "seed": 1}
    plain = epoch(DataLoader(database_path=pg_url, l2="off", **options), 1)
    first = DataLoader(database_path=pg_url, l2_url=redis_url, **options)
    assert epoch(first, 1) == plain and first.stats()["l2"] and not first.stats()["l2_hit"]
    second = DataLoader(database_path=pg_url, l2_url=redis_url, **options)
    assert epoch(second, 1) == plain
    assert second.stats()["l2_hit"] and second.stats()["l2_hits"] == 14


def restore_test_marks(catalog: Catalog, label: str, count: int) -> None:
    mark_samples(catalog, [f"{label}/{i:03d}.jpg" for i in range(label == "bee", 2 * count, 2)], processed=True,
                 by="path")  # fmt: skip


def test_a_catalog_restored_from_a_backup_never_meets_the_lost_states_entries(
    db: Path, server: RedisServer, tmp_path: Path
) -> None:
    """``cp backup.db train.db``: the same path and inode, the counter goes back, and the next
    write repeats a counter the lost history had, with other content: never answered from L2."""
    backup = tmp_path / "backup.db"
    shutil.copy(db, backup)
    inode = db.stat().st_ino
    with Catalog(db) as catalog:
        restore_test_marks(catalog, "ant", 8)  # state A
        lost = catalog.changes()
    assert epoch(loader(db, server.url, processed=False)) == all_ids(db, processed=False)  # A, stored in L2
    subprocess.run(["cp", str(backup), str(db)], check=True)
    assert db.stat().st_ino == inode and not Path(f"{db}-wal").exists()
    with Catalog(db) as catalog:
        restore_test_marks(catalog, "bee", 8)  # state B: another content at the same counter
        assert catalog.changes() == lost
    truth = all_ids(db, processed=False)
    assert len(truth) == N - 8
    restored = loader(db, server.url, processed=False)
    assert epoch(restored) == truth
    assert not restored.stats()["l2_hit"] and restored.stats()["l2_hits"] == 0
    again = loader(db, server.url, processed=False)
    assert epoch(again) == truth and again.stats()["l2_hit"]  # B's own entries serve B


def test_a_server_catalog_restored_from_a_dump_never_meets_the_lost_states_entries(
    tmp_path: Path, pg_url: str, redis_url: str
) -> None:
    """The same on PostgreSQL: a data-only pg_dump restored into the same tables (the same
    catalog identity) with psql brings the counter back."""
    from dlindex.catalog.postgres.local_server import find_bindir

    psycopg = pytest.importorskip("psycopg")
    root = tmp_path / "imgs"
    for i in range(N):
        make_jpeg(root / ("ant", "bee")[i % 2] / f"{i:03d}.jpg", (20, 16), (i * 5 % 255, 40, 90))
    with Catalog(pg_url, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    bins, dump = find_bindir(), tmp_path / "backup.sql"
    subprocess.run([bins / "pg_dump", "--data-only", "--file", dump, pg_url], check=True, capture_output=True)
    with Catalog(pg_url) as catalog:
        restore_test_marks(catalog, "ant", 8)
        lost = catalog.changes()
    assert epoch(loader(pg_url, redis_url, processed=False)) == all_ids(pg_url, processed=False)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        tables = [t for (t,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]
        conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY")  # names from the catalog
    done = subprocess.run([bins / "psql", "-q", "-v", "ON_ERROR_STOP=1", "-f", dump, pg_url], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    with Catalog(pg_url) as catalog:
        restore_test_marks(catalog, "bee", 8)
        assert catalog.changes() == lost
    truth = all_ids(pg_url, processed=False)
    restored = loader(pg_url, redis_url, processed=False)
    assert epoch(restored) == truth and len(truth) == N - 8
    assert not restored.stats()["l2_hit"] and restored.stats()["l2_hits"] == 0
