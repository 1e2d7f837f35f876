"""The files ``features import`` reads, checked before anything is loaded into memory.

Every format is untrusted input, so each reader looks at what a file *claims* before it
allocates for it: an ``.npy`` header's dtype and shape against the file's real size; an
``.npz`` member's header against its uncompressed size in the zip directory, which must be
within ``max_bytes`` (a member is then inflated by ``zipfile``, which stops at that size
and checks the CRC, so an entry that lies cannot inflate further); a Parquet file's schema
types and its metadata's row count and uncompressed sizes; JSONL as it streams. The
``max_bytes`` cap (``DEFAULT_MAX_BYTES``, ``--max-bytes``) bounds what a reader holds in
memory; an ``.npy`` of vectors is memory-mapped, so only its header has to be consistent.
``max_rows`` (the catalog's sample count: each vector needs a sample of its own) bounds the
rows a file may claim, checked from its header before anything is inflated or decoded.
"""

from __future__ import annotations

import io
import lzma
import math
import os
import sys
import tokenize
import zipfile
import zlib
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt
from numpy.lib import format as npy_format

from dlindex.catalog.sqlite.connect import INT64_MAX, INT64_MIN
from dlindex.errors import InputError
from dlindex.features.loaded import Loaded, check_rows, one_line
from dlindex.features.vector_jsonl import read_jsonl

DEFAULT_MAX_BYTES = 8 << 30  # 8 GiB: 4,000,000 x 512 float32 vectors
FORMATS = (".npy", ".npz", ".parquet", ".jsonl")
_MAX_HEADER = 10_000  # numpy's own default limit for .npy headers
# Deflate's best ratio is 1032:1; a zip entry claiming more is lying (zipfile would find out
# only after the array's buffer was allocated and filled).
_MAX_DEFLATE_RATIO = 1032

Header = tuple[tuple[int, ...], bool, np.dtype[Any]]  # (shape, fortran order, dtype) of an .npy
# numpy's stubs leave numpy.lib.format untyped (and without max_header_size): typed here, once.
_read_magic: Callable[[IO[bytes]], tuple[int, int]] = npy_format.read_magic
_HEADER_READERS: dict[tuple[int, int], Callable[..., Header]] = {
    (1, 0): npy_format.read_array_header_1_0,
    (2, 0): npy_format.read_array_header_2_0,
    (3, 0): npy_format.read_array_header_2_0,
}
_read_array: Callable[..., npt.NDArray[Any]] = npy_format.read_array


def read_import_file(
    path: Path, ids_file: str | os.PathLike[str] | None, column: str, max_bytes: int, max_rows: int | None = None
) -> Loaded:
    """Read and check a file for ``features import``; InputError (one line) if it is unusable,
    or claims more than ``max_rows`` vectors."""
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise InputError(f"cannot import {path}: expected one of {', '.join(FORMATS)}")
    if not path.is_file():
        raise InputError(f"cannot read {path}: no such file")
    if ids_file is not None and suffix != ".npy":
        raise InputError("--ids is for .npy files; .npz, Parquet and JSONL files carry their own ids")
    if max_bytes < 1:
        raise InputError(f"--max-bytes must be at least 1 byte, not {max_bytes}")
    try:
        if suffix == ".npy":
            if ids_file is None:
                raise InputError(f"{path} has no ids: give --ids FILE (one id per line, or an integer .npy)")
            return _read_npy(path, Path(ids_file), max_bytes, max_rows)
        if suffix == ".npz":
            try:
                return _read_npz(path, max_bytes, max_rows)
            except (
                RuntimeError,
                NotImplementedError,
                zlib.error,
                lzma.LZMAError,
            ) as e:  # encrypted, odd methods, bad data
                raise InputError(f"cannot read {path}: {one_line(e)}") from None
        if suffix == ".parquet":
            return _read_parquet(path, column, max_bytes, max_rows)
        return read_jsonl(path, column, max_bytes, max_rows)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile) as e:
        raise InputError(f"cannot read {path}: {one_line(e)}") from None


def _header(f: IO[bytes], where: str) -> Header:
    """(shape, fortran order, dtype) of the .npy at ``f``'s position; refuses odd ones."""
    try:
        version = _read_magic(f)
        read_header = _HEADER_READERS.get(version)
        if read_header is None:
            raise InputError(f"{where}: .npy format version {version} is not supported")
        shape, fortran, dtype = read_header(f, max_header_size=_MAX_HEADER)
    except (ValueError, SyntaxError, TypeError, EOFError, KeyError, RecursionError, tokenize.TokenError) as e:
        # numpy's complaints about a header it cannot parse
        raise InputError(f"{where}: not a valid .npy header ({one_line(e)})") from None
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise InputError(f"{where}: arrays of {dtype} cannot be imported (plain numbers only)")
    if any(not isinstance(d, int) or d < 0 for d in shape):
        raise InputError(f"{where}: invalid shape {shape}")
    return tuple(shape), bool(fortran), dtype


def _check_vectors_header(shape: tuple[int, ...], dtype: np.dtype[Any], where: str) -> None:
    if len(shape) != 2:
        raise InputError(f"{where}: vectors must be a 2-D array (n x dim), not shape {shape}")
    if dtype.kind != "f" or dtype.itemsize > 8:
        raise InputError(f"{where}: vectors have dtype {dtype}; expected float16, float32 or float64")
    if shape[0] == 0 or shape[1] == 0:
        raise InputError(f"{where} holds no vectors (shape {shape})")


def _check_ids_header(shape: tuple[int, ...], dtype: np.dtype[Any], where: str) -> None:
    if dtype.kind not in "iu" or len(shape) != 1:
        raise InputError(f"{where}: ids must be a 1-D integer array, not {dtype} {shape}")


def _data_bytes(shape: tuple[int, ...], dtype: np.dtype[Any]) -> int:
    return math.prod(shape) * dtype.itemsize  # Python ints: an absurd shape cannot overflow


def _check_size(need: int, have: int, max_bytes: int | None, where: str) -> None:
    if max_bytes is not None and need > max_bytes:
        raise InputError(
            f"{where}: {need:,} bytes of array data is over the import limit of {max_bytes:,} bytes; "
            "raise it with --max-bytes if the file is really meant to be this large"
        )
    if need > have:
        raise InputError(f"{where}: truncated: its header announces {need:,} bytes of data, it holds {have:,}")


def _read_npy(path: Path, ids_path: Path, max_bytes: int, max_rows: int | None) -> Loaded:
    size = path.stat().st_size
    with open(path, "rb") as f:
        shape, _, dtype = _header(f, str(path))
        offset = f.tell()
    _check_vectors_header(shape, dtype, str(path))
    _check_size(_data_bytes(shape, dtype), size - offset, None, str(path))  # memory-mapped: no cap
    check_rows(shape[0], max_rows, str(path))
    vectors = np.load(path, mmap_mode="r", allow_pickle=False)
    return Loaded(_read_ids(ids_path, shape[0], max_bytes), vectors)


def _read_ids(path: Path, n: int, max_bytes: int) -> npt.NDArray[np.int64]:
    """The ids of a .npy: an integer .npy, or text, one per line (at most ``n`` + 1 are read)."""
    if not path.is_file():
        raise InputError(f"cannot read ids file {path}: no such file")
    try:
        if path.suffix.lower() == ".npy":
            size = path.stat().st_size
            with open(path, "rb") as f:
                shape, _, dtype = _header(f, str(path))
                _check_ids_header(shape, dtype, str(path))
                _check_size(_data_bytes(shape, dtype), size - f.tell(), max_bytes, str(path))
                f.seek(0)
                ids = _read_array(f, allow_pickle=False)
            return _as_int64(ids, str(path))
        values = array("q")  # 8 bytes an id, not a Python int's 28
        with open(path, "rb") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    value = int(line)
                except ValueError:
                    raise InputError(f"{path}, line {number}: {line.strip()[:40]!r} is not a sample id") from None
                if not INT64_MIN <= value <= INT64_MAX:
                    raise InputError(f"{path}, line {number}: id {value} is outside the 64-bit integer range")
                if len(values) > n:
                    raise InputError(f"{path}: more ids than the {n:,} vectors")
                values.append(value)
        return np.frombuffer(values, dtype=np.int64) if values else np.zeros(0, dtype=np.int64)
    except (OSError, ValueError, EOFError) as e:
        raise InputError(f"cannot read ids file {path}: {one_line(e)}") from None


def _as_int64(ids: npt.NDArray[np.integer[Any]], where: str) -> npt.NDArray[np.int64]:
    if ids.dtype.kind == "u" and ids.size and int(ids.max()) > INT64_MAX:
        raise InputError(f"{where}: id {int(ids.max())} is outside the 64-bit integer range")
    return ids.astype(np.int64)


def _read_npz(path: Path, max_bytes: int, max_rows: int | None) -> Loaded:
    with open(path, "rb") as f:
        if f.read(4) not in (b"PK\x03\x04", b"PK\x05\x06"):  # what numpy.load takes for an .npz
            raise InputError(f"{path} is not an .npz file (a zip archive of .npy arrays)")
    with zipfile.ZipFile(path) as archive:
        members = {info.filename: info for info in archive.infolist()}
        if "ids.npy" not in members or "vectors.npy" not in members:
            names = ", ".join(sorted(n.removesuffix(".npy") for n in members)[:10]) or "nothing"
            raise InputError(f"{path} must hold arrays named 'ids' and 'vectors', not {names}")
        total = 0
        arrays = {}
        for name in ("vectors", "ids"):
            info = members[f"{name}.npy"]
            where = f"{path}: {name!r}"
            if info.file_size > max_bytes - total:
                raise InputError(
                    f"{where} inflates to {info.file_size:,} bytes, over the import limit of {max_bytes:,} bytes "
                    "in all; raise it with --max-bytes if the file is really meant to be this large"
                )
            _check_entry(info, where)
            with archive.open(info) as f:  # stops at file_size and checks the CRC: a lying entry fails
                assert isinstance(f, io.BufferedIOBase)  # a ZipExtFile: it can readinto a buffer
                shape, fortran, dtype = _header(f, where)
                check = _check_vectors_header if name == "vectors" else _check_ids_header
                check(shape, dtype, where)
                _check_size(_data_bytes(shape, dtype), info.file_size - f.tell(), max_bytes - total, where)
                check_rows(shape[0], max_rows, where)  # before its buffer is allocated
                total += info.file_size
                arrays[name] = _read_member(f, shape, fortran, dtype, where)
    return Loaded(_as_int64(arrays["ids"], f"{path}: 'ids'"), arrays["vectors"])


def _check_entry(info: zipfile.ZipInfo, where: str) -> None:
    """A zip entry's sizes must be possible: stored bytes as many as they inflate to, deflated
    ones at most 1032 times as many (checked before a buffer of the claimed size is allocated)."""
    stored = info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size
    deflated = info.compress_type == zipfile.ZIP_DEFLATED and info.file_size > _MAX_DEFLATE_RATIO * info.compress_size
    if stored or deflated:
        raise InputError(
            f"{where}: its zip entry claims {info.file_size:,} bytes from {info.compress_size:,} compressed; "
            "the file is damaged"
        )


def _read_member(
    f: io.BufferedIOBase, shape: tuple[int, ...], fortran: bool, dtype: np.dtype[Any], where: str
) -> npt.NDArray[Any]:
    """The array after a checked header, read into a buffer of exactly the announced size."""
    data = bytearray(_data_bytes(shape, dtype))
    view = memoryview(data)
    filled = 0
    while filled < len(data):
        got = f.readinto(view[filled:])
        if not got:
            raise InputError(f"{where}: truncated: {filled:,} of {len(data):,} bytes of data")
        filled += got
    flat = np.frombuffer(data, dtype=dtype)
    return flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)


def _read_parquet(path: Path, column: str, max_bytes: int, max_rows: int | None) -> Loaded:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError("reading Parquet needs pyarrow: pip install 'dlindex[parquet]'") from None
    _check_footer(path)
    try:
        return _parquet(pa, pq, path, column, max_bytes, max_rows)
    except (pa.ArrowException, MemoryError) as e:  # a damaged file, or one whose pages lie about their sizes
        raise InputError(f"cannot read {path}: {one_line(e)}") from None


# pyarrow (26) aborts the process (std::terminate, uncatchable) on some damaged column chunk
# metadata ("Definition level histogram size mismatch") when Python asks for a row group's
# column: found by tests/import_fuzz.py. The footer is read once in a child first, and a file
# whose footer kills it is refused before this process reads it.
_FOOTER_PROBE = """import sys, pyarrow.parquet as pq
try:
    meta = pq.ParquetFile(sys.argv[1]).metadata
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            group.column(c).num_values
except Exception:
    pass  # an error this process raises is the import's to report, in its own words
"""


def _check_footer(path: Path) -> None:
    import subprocess

    try:
        probe = subprocess.run([sys.executable, "-c", _FOOTER_PROBE, os.fspath(path)], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise InputError(f"cannot read {path}: reading its Parquet footer did not finish in 120 s") from None
    if probe.returncode < 0:
        raise InputError(f"cannot read {path}: its Parquet metadata is damaged (reading it kills pyarrow)")


def _parquet(pa: Any, pq: Any, path: Path, column: str, max_bytes: int, max_rows: int | None) -> Loaded:
    parquet = pq.ParquetFile(path)
    schema = parquet.schema_arrow
    names = schema.names
    key = "id" if "id" in names else "file_path" if "file_path" in names else None
    if key is None or column not in names:
        raise InputError(f"{path} needs an 'id' or 'file_path' column and a {column!r} column, has {', '.join(names)}")
    key_type, vector_type = schema.field(key).type, schema.field(column).type
    if key == "id" and not pa.types.is_integer(key_type):
        raise InputError(f"{path}: column 'id' is {key_type}; sample ids must be integers")
    if key == "file_path" and not (pa.types.is_string(key_type) or pa.types.is_large_string(key_type)):
        raise InputError(f"{path}: column 'file_path' is {key_type}; expected strings")
    if not (
        pa.types.is_list(vector_type) or pa.types.is_large_list(vector_type) or pa.types.is_fixed_size_list(vector_type)
    ):
        raise InputError(f"{path}: column {column!r} is {vector_type}, not a list of numbers")
    if not pa.types.is_floating(vector_type.value_type):
        raise InputError(
            f"{path}: column {column!r} holds {vector_type.value_type}; expected float16, float32 or float64"
        )
    meta = parquet.metadata
    check_rows(meta.num_rows, max_rows, str(path))
    # Decoded sizes from the metadata (the byte sizes there are of encoded pages, which
    # run-length encoding makes tiny): leaf values of the vector column, 8 bytes a row of keys.
    itemsize = vector_type.value_type.bit_width // 8
    claimed = meta.num_rows * 16
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if chunk.path_in_schema.split(".")[0] == column:
                claimed += max(0, chunk.num_values) * itemsize
    if claimed > max_bytes:
        raise InputError(
            f"{path}: decodes to {claimed:,} bytes or more, over the import limit of {max_bytes:,} bytes; "
            "raise it with --max-bytes if the file is really meant to be this large"
        )
    id_blocks: list[npt.NDArray[np.int64]] = []
    paths: list[str] = []
    blocks: list[npt.NDArray[np.floating[Any]]] = []
    dim: int | None = None
    held = seen = 0
    for batch in parquet.iter_batches(batch_size=4096, columns=[key, column]):  # decoded a batch at a time
        held += batch.nbytes
        if held > max_bytes:
            raise InputError(
                f"{path}: decodes to more than the import limit of {max_bytes:,} bytes; "
                "raise it with --max-bytes if the file is really meant to be this large"
            )
        if not batch.num_rows:
            continue
        vectors = batch.column(column)
        if vectors.null_count:
            raise InputError(f"{path}: some rows have no {column!r}")
        if pa.types.is_fixed_size_list(vectors.type):
            lengths = np.full(len(vectors), vectors.type.list_size)
        else:
            lengths = np.asarray(vectors.value_lengths())
        for length in np.unique(lengths).tolist():
            if dim is None:
                dim = int(length)
            elif length != dim:
                at = int(np.argmax(lengths != dim))
                raise InputError(f"{path}: row {seen + at + 1} has {lengths[at]} values, row 1 has {dim}")
        values = vectors.flatten().to_numpy(zero_copy_only=False)
        key_column = batch.column(key)
        if key_column.null_count:
            raise InputError(f"{path}: some rows have no {key!r}")
        if key == "id":
            id_blocks.append(_as_int64(key_column.to_numpy(zero_copy_only=False), f"{path}: column 'id'"))
        else:
            paths.extend(key_column.to_pylist())
        blocks.append(values.reshape(len(key_column), dim or 0))
        seen += len(key_column)
    if not blocks or dim in (None, 0):
        raise InputError(f"{path} holds no vectors")
    all_keys = np.concatenate(id_blocks) if key == "id" else paths
    return Loaded(all_keys, np.concatenate(blocks))
