"""The L2 cache: an epoch's sample-id lists per (selection, label), and sample rows, in Redis.

Shared by every loader process on every host that reads one catalog. An entry's key carries
the catalog's identity and state (change counter and token, dlindex.catalog.state), so a write
to the catalog makes every older entry unreachable (it expires after ``ttl_s``), and so does a
restore from a backup: the restored file's next write repeats a counter, never a state. Each
value repeats the counter and ends with a digest of its key and bytes, so a garbage, truncated
or moved value is a miss. Every read is
bounded server-side (``GETRANGE``) before the client allocates it. Redis down or a key
evicted: the caller reads the catalog instead, and the process warns once.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import numpy.typing as npt

from dlindex.errors import DlindexWarning, InputError

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.catalog.state import CatalogState

ENV = "DLINDEX_L2"
MODES = ("auto", "on", "off")
TTL_S = 3600  # entries of older counters are unreachable at once; this frees their memory
TIMEOUT_S = 1.0  # a Redis that does not answer in this long is down: read the catalog
MAX_MANIFEST_BYTES = 4 << 20
MAX_LABEL_SAMPLES = 16 << 20  # per (selection, label) value: 32 bytes a sample, <= 512 MiB
MAX_ROW_BYTES = 8192  # size, hash, a path of up to PATH_MAX
_MAGIC = b"DLL2"
_VERSION = 2  # 2: keys carry the catalog's change token
_HEADER = struct.Struct("<4sBBxxqq")  # magic, version, kind, changes, count
_DIGEST = 16
_MANIFEST, _LABEL, _ROW = 1, 2, 3
_ROW_HEAD = struct.Struct("<qB")  # bytes (-1: unknown), hash length (255: no hash)
_LOCAL_HOSTS = ("", "localhost", "127.0.0.1", "::1")
# One round trip for many keys, each cut server-side to its bound: a value planted under a
# key never costs the reader more than that bound.
_BOUNDED_GET = """
local out = {}
for i, key in ipairs(KEYS) do out[i] = redis.call('GETRANGE', key, 0, tonumber(ARGV[i])) end
return out
"""

_warned = False
Row = tuple[bytes, int | None, str | None]  # path, bytes, xxh3_128: a dlindex.loader.row_cache.SampleRow


def wanted(mode: str, url: str | None, location: str) -> str | None:
    """The Redis URL to use, or None: ``auto`` uses L2 only for a server catalog (a URL such as
    ``postgresql://``) with a Redis URL configured, where a Redis round trip beats the
    catalog's; a local SQLite lookup (~6 us) beats a round trip (~100 us), measured in
    bench/bench_l2.py."""
    if mode not in MODES:
        raise InputError(f"l2 must be one of {', '.join(MODES)}, not {mode!r}")
    url = url or os.environ.get(ENV) or None
    if mode == "off" or url is None:
        if mode == "on":
            raise InputError(f"l2='on' needs a Redis URL: l2_url= or ${ENV}")
        return None
    if mode == "auto" and "://" not in location:
        return None
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise InputError(f"not a Redis URL: {_safe(url)!r}; use redis://HOST:PORT/DB")
    try:
        import redis  # noqa: F401
    except ImportError:
        raise InputError("the L2 cache needs redis-py: pip install 'dlindex[redis]'") from None
    return url


def catalog_identity(catalog: Catalog) -> str:
    """Which catalog an entry belongs to (``Catalog.identity``: two hosts' ``/data/train.db``,
    or a catalog dropped and remade at one URL, are different catalogs)."""
    return catalog.identity()


@dataclass
class Labelled:
    """One label's part of a selection: ids, sizes and 16-byte hashes, in id order."""

    label: int
    ids: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    hashes: npt.NDArray[np.void]


class L2Cache:
    """A Redis L2 in front of one catalog; every method degrades to a miss when Redis fails."""

    def __init__(self, url: str, identity: str, ttl_s: int = TTL_S) -> None:
        self.url, self.identity, self.ttl_s = url, identity, int(ttl_s)
        self.hits = self.misses = 0
        self.down = False
        self._client: Any = None
        self._script: Any = None

    def _redis(self) -> Any:
        if self._client is None:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            self._client = redis.Redis.from_url(self.url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S,
                                                retry=Retry(NoBackoff(), 0))  # fmt: skip
            self._script = self._client.register_script(_BOUNDED_GET)
        return self._client

    def _key(self, state: CatalogState, *parts: object) -> str:
        head = ("dlindex", "l2", str(_VERSION), self.identity, str(int(state.changes)), state.token)
        return ":".join((*head, *map(str, parts)))

    def _get(self, keys: Sequence[str], bounds: Sequence[int]) -> list[bytes] | None:
        """Values (b"": absent), each at most its bound + 1 bytes; None when Redis failed."""
        if self.down or not keys:
            return None if self.down else []
        from redis.exceptions import RedisError

        try:
            self._redis()
            got = self._script(keys=list(keys), args=[int(b) for b in bounds])
        except (RedisError, OSError) as e:
            self._failed(e)
            return None
        if not isinstance(got, list) or len(got) != len(keys):
            return None
        return [v if isinstance(v, bytes) else b"" for v in got]

    def _set(self, items: Iterable[tuple[str, bytes]]) -> None:
        if self.down:
            return
        from redis.exceptions import RedisError

        try:
            pipe = self._redis().pipeline(transaction=False)
            for key, value in items:
                pipe.set(key, value, ex=self.ttl_s)
            pipe.execute()
        except (RedisError, OSError) as e:
            self._failed(e)

    def _failed(self, error: BaseException) -> None:
        global _warned
        self.down = True  # the rest of this epoch reads the catalog; the next one tries again
        if not _warned:
            _warned = True
            warnings.warn(f"the L2 cache at {_safe(self.url)} failed ({type(error).__name__}: {error}); "
                          "reading the catalog instead", DlindexWarning, stacklevel=3)  # fmt: skip

    # -- an epoch's selection, one value per label -------------------------------------------

    def load_selection(self, key: str, state: CatalogState) -> list[Labelled] | None:
        """The selection stored for ``key`` in catalog ``state``, or None (a miss)."""
        changes = state.changes
        manifest_key = self._key(state, "sel", key)
        got = self._get([manifest_key], [MAX_MANIFEST_BYTES])
        payload = _open(manifest_key, got[0], _MANIFEST, changes, None) if got else None
        counts = _counts(payload)
        if counts is None:
            self.misses += 1
            return None
        keys = [self._key(state, "sel", key, label) for label, _ in counts]
        sizes = [_HEADER.size + 32 * n + _DIGEST for _, n in counts]
        values = self._get(keys, sizes)
        out: list[Labelled] = []
        for (label, n), k, v in zip(counts, keys, values or [], strict=False):
            body = _open(k, v, _LABEL, changes, n)
            if body is None or len(body) != 32 * n:
                break
            ids = np.frombuffer(body, dtype="<i8", count=n, offset=0).astype(np.int64)
            if n and not bool(np.all(ids[1:] > ids[:-1])):
                break
            sizes_ = np.frombuffer(body, dtype="<i8", count=n, offset=8 * n).astype(np.int64)
            hashes = np.frombuffer(body, dtype="V16", count=n, offset=16 * n).copy()
            out.append(Labelled(label, ids, sizes_, hashes))
        if len(out) != len(counts):
            self.misses += 1
            return None
        self.hits += 1
        return out

    def store_selection(self, key: str, state: CatalogState, parts: Sequence[Labelled]) -> None:
        changes = state.changes
        if any(p.ids.size > MAX_LABEL_SAMPLES for p in parts):
            return
        manifest = json.dumps({"labels": [[int(p.label), int(p.ids.size)] for p in parts]}).encode()
        if len(manifest) > MAX_MANIFEST_BYTES - _HEADER.size - _DIGEST:
            return
        items = []
        for p in parts:
            body = (p.ids.astype("<i8").tobytes() + p.sizes.astype("<i8").tobytes()
                    + np.ascontiguousarray(p.hashes, dtype="V16").tobytes())  # fmt: skip
            k = self._key(state, "sel", key, p.label)
            items.append((k, _seal(k, _LABEL, changes, int(p.ids.size), body)))
        k = self._key(state, "sel", key)
        items.append((k, _seal(k, _MANIFEST, changes, len(manifest), manifest)))  # last: no manifest without parts
        self._set(items)

    # -- sample rows (path, size, hash) by id ------------------------------------------------

    def load_rows(self, ids: Sequence[int], state: CatalogState) -> dict[int, Row]:
        """The rows of ``ids`` held in L2 for catalog ``state`` (absent ones are simply not in the result)."""
        changes = state.changes
        keys = [self._key(state, "row", i) for i in ids]
        values = self._get(keys, [MAX_ROW_BYTES] * len(keys))
        found: dict[int, Row] = {}
        for i, k, v in zip(ids, keys, values or [], strict=False):
            body = _open(k, v, _ROW, changes, None)
            if body is None or len(body) < _ROW_HEAD.size:
                continue
            size, hash_len = _ROW_HEAD.unpack_from(body)
            at = _ROW_HEAD.size + (0 if hash_len == 255 else hash_len)
            if at > len(body):
                continue
            digest = None if hash_len == 255 else body[_ROW_HEAD.size : at].decode("ascii", "replace")
            found[int(i)] = (body[at:], None if size < 0 else int(size), digest)
        self.hits += len(found)
        self.misses += len(ids) - len(found)
        return found

    def store_rows(self, rows: Mapping[int, Row], state: CatalogState) -> None:
        changes = state.changes
        items = []
        for i, (path, size, text) in rows.items():
            digest = (text or "").encode("ascii", "replace")[:254]
            body = _ROW_HEAD.pack(-1 if size is None else size, 255 if text is None else len(digest)) + digest + path
            k = self._key(state, "row", i)
            if _HEADER.size + len(body) + _DIGEST <= MAX_ROW_BYTES:
                items.append((k, _seal(k, _ROW, changes, len(body), body)))
        self._set(items)


def _seal(key: str, kind: int, changes: int, count: int, body: bytes) -> bytes:
    head = _HEADER.pack(_MAGIC, _VERSION, kind, int(changes), int(count))
    return head + body + hashlib.blake2b(key.encode() + head + body, digest_size=_DIGEST).digest()


def _open(key: str, value: bytes | None, kind: int, changes: int, count: int | None) -> bytes | None:
    """The body of a sealed value, or None: absent, cut at its bound, foreign or tampered."""
    if not value or len(value) < _HEADER.size + _DIGEST:
        return None
    magic, version, got_kind, got_changes, got_count = _HEADER.unpack_from(value)
    if (magic, version, got_kind, got_changes) != (_MAGIC, _VERSION, kind, changes):
        return None
    if count is not None and got_count != count:
        return None
    head, body, digest = value[: _HEADER.size], value[_HEADER.size : -_DIGEST], value[-_DIGEST:]
    if hashlib.blake2b(key.encode() + head + body, digest_size=_DIGEST).digest() != digest:
        return None
    return body


def _counts(payload: bytes | None) -> list[tuple[int, int]] | None:
    if payload is None:
        return None
    try:
        labels = json.loads(payload)["labels"]
        counts = [(int(label), int(n)) for label, n in labels]
    except (ValueError, KeyError, TypeError):
        return None
    if any(not 0 <= n <= MAX_LABEL_SAMPLES for _, n in counts) or len({label for label, _ in counts}) != len(counts):
        return None
    return counts


def _safe(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))
