"""The fuzz target of `dlindex features import`, run by test_features_importer_fuzz.py in a
subprocess under an address-space limit (so unbounded memory shows as a failure, not as a
machine that swaps).

Every example is a valid import file of one of the formats (npy + ids, npz stored or
deflated, Parquet, JSONL) or a .npy whose header says anything, damaged by a few edits:
bytes flipped, cut, inserted, or overwritten with large integers. Property, through the
CLI: exit 0 and the catalog holds exactly what numpy/pyarrow/json read from the file, or
exit 1 with one `Error:` line on stderr and nothing stored; never another exception.
"""

from __future__ import annotations

import io
import itertools
import json
import sqlite3
import struct
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dlindex.cli import app

MAX_BYTES = 1 << 20
_counter = itertools.count()


def seeds(work: Path) -> dict[str, tuple[str, bytes]]:
    """name -> (suffix, bytes) of valid files for ids 1..8."""
    vectors = np.arange(24, dtype=np.float32).reshape(8, 3) / 7
    ids = np.arange(1, 9)
    out: dict[str, tuple[str, bytes]] = {}
    for name, save in (("npz", np.savez), ("npz_deflated", np.savez_compressed)):
        buffer = io.BytesIO()
        save(buffer, ids=ids, vectors=vectors)
        out[name] = (".npz", buffer.getvalue())
    buffer = io.BytesIO()
    np.save(buffer, vectors.astype(np.float16))
    out["npy"] = (".npy", buffer.getvalue())
    out["jsonl"] = (
        ".jsonl",
        "".join(
            json.dumps({"id": int(i), "vector": v.tolist()}) + "\n" for i, v in zip(ids, vectors, strict=False)
        ).encode(),
    )
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return out
    for name, column in (
        ("parquet", pa.array(vectors.tolist(), pa.list_(pa.float32()))),
        ("parquet_fixed", pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), 3)),
    ):
        sink = io.BytesIO()
        pq.write_table(pa.table({"id": ids, "vector": column}), sink)
        out[name] = (".parquet", sink.getvalue())
    return out


def npy_with_header(descr: str, shape: tuple[int, ...], fortran: bool, data: bytes) -> bytes:
    header = repr({"descr": descr, "fortran_order": fortran, "shape": shape}).encode()
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data


edits = st.lists(
    st.one_of(
        st.tuples(st.just("flip"), st.floats(0, 1), st.integers(0, 255)),
        st.tuples(st.just("cut"), st.floats(0, 1)),
        st.tuples(st.just("insert"), st.floats(0, 1), st.binary(max_size=16)),
        st.tuples(st.just("int"), st.floats(0, 1), st.sampled_from([2**31 - 1, 2**32 - 1, 2**30, 10**9, 0])),
    ),
    max_size=4,
)
headers = st.tuples(
    st.sampled_from(["<f4", "<f8", "<f2", ">f4", "<i8", "|u1", "|O", "<U3", "<c8", "|V4", "<f16", "bogus"]),
    st.lists(st.integers(-3, 2**40), min_size=0, max_size=3).map(tuple),
    st.booleans(),
    st.binary(max_size=200),
)


def mutate(data: bytes, changes: list[tuple[Any, ...]]) -> bytes:
    buf = bytearray(data)
    for change in changes:
        at = min(len(buf), int(change[1] * len(buf)))
        if change[0] == "flip" and at < len(buf):
            buf[at] = change[2]
        elif change[0] == "cut":
            del buf[at:]
        elif change[0] == "insert":
            buf[at:at] = change[2]
        elif change[0] == "int" and at + 4 <= len(buf):
            struct.pack_into("<I", buf, at, change[2])
    return bytes(buf)


def reference(path: Path, ids_file: Path | None) -> dict[int, list[float]]:
    """What the file holds, read by the formats' own libraries."""
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            return {int(i): v.tolist() for i, v in zip(z["ids"], z["vectors"], strict=False)}
    if path.suffix == ".npy":
        assert ids_file is not None
        got = [int(line) for line in ids_file.read_text().split()]
        return {i: v.tolist() for i, v in zip(got, np.load(path, allow_pickle=False), strict=False)}
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path).to_pydict()
        return {int(i): list(v) for i, v in zip(table["id"], table["vector"], strict=False)}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            obj = json.loads(line)
            out[int(obj["id"])] = obj["vector"]
    return out


def stored(db: Path, name: str) -> dict[int, list[float]]:
    conn = sqlite3.connect(db)
    try:
        got = conn.execute("SELECT image_id, vector FROM image_features WHERE feature_type = ?", (name,)).fetchall()
    finally:
        conn.close()
    return {int(i): np.frombuffer(v, "<f4").tolist() for i, v in got}


def check(work: Path, db: Path, suffix: str, data: bytes) -> None:
    name = f"t{next(_counter)}_{uuid.uuid4().hex[:8]}"  # fresh, even in a catalog fuzzed before
    path = work / f"{name}{suffix}"
    path.write_bytes(data)
    args = ["features", "import", "-t", name, str(path), "--max-bytes", str(MAX_BYTES), "--db", str(db)]
    ids_file = None
    if suffix == ".npy":
        ids_file = work / "ids.txt"
        ids_file.write_text("".join(f"{i}\n" for i in range(1, 9)))
        args += ["--ids", str(ids_file)]
    result = CliRunner().invoke(app, args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a traceback: the bug this fuzzing is for
    if result.exit_code == 0:
        expected = reference(path, ids_file)
        got = stored(db, name)
        assert got.keys() == expected.keys(), (got.keys(), expected.keys())
        for key, vector in expected.items():
            assert np.allclose(got[key], np.asarray(vector, dtype=np.float32), equal_nan=False), key
    else:
        assert result.exit_code == 1, (result.exit_code, result.output)
        assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1, result.stderr
        assert stored(db, name) == {}, result.stderr
    path.unlink()


def run(work: Path, db: Path, max_examples: int) -> None:
    files = seeds(work)

    @settings(max_examples=max_examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(kind=st.sampled_from(sorted(files)), changes=edits)
    def damaged(kind: str, changes: list[tuple[Any, ...]]) -> None:
        suffix, data = files[kind]
        check(work, db, suffix, mutate(data, changes))

    @settings(max_examples=max_examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(header=headers, as_npz=st.booleans())
    def any_header(header: tuple[str, tuple[int, ...], bool, bytes], as_npz: bool) -> None:
        member = npy_with_header(*header)
        if not as_npz:
            check(work, db, ".npy", member)
            return
        import zipfile

        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("ids.npy", npy_with_header("<i8", (8,), False, np.arange(1, 9).astype("<i8").tobytes()))
            z.writestr("vectors.npy", member)
        check(work, db, ".npz", buffer.getvalue())

    damaged()
    any_header()


if __name__ == "__main__":
    import resource

    limit = int(sys.argv[4])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    run(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
    print("fuzzed", flush=True)
