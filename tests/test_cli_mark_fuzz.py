"""Fuzzing `dlindex mark` stdin in every form it reads: ids, paths, JSON lines, NUL records.

Property: exit 0 with exactly the expected samples marked, or exit 1 with one `Error:` line
on stderr and the catalog unchanged; never a traceback or another exception.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dlindex.cli import app

from .synthetic import ROOT, balanced

LABELS = {"cat": 4, "dog": 4}  # cat: ids 1-4 (cat/0001.png ...), dog: ids 5-8
PATHS = {i: f"{label}/{n:04d}.png" for i, (label, n) in enumerate(
    [(label, n) for label, count in LABELS.items() for n in range(1, count + 1)], start=1)}  # fmt: skip

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# A record that names a sample (the id it names, or None for one not in the catalog).
known_id = st.sampled_from(sorted(PATHS))
unknown_id = st.integers(min_value=9, max_value=2**63 - 1) | st.integers(min_value=-(2**63), max_value=0)


@st.composite
def good_record(draw: st.DrawFn, by: str) -> tuple[str, int | None]:
    id_ = draw(known_id | unknown_id)
    known = id_ if id_ in PATHS else None
    path = PATHS.get(id_, f"cat/{abs(id_)}.jpg")
    kind = draw(st.sampled_from(["plain", "json_id", "json_path", "json_file_path", "json_abs"]))
    if kind == "plain":
        if by == "id":  # spaces around an id are allowed; around a path they are part of the name
            return draw(st.sampled_from(["", " "])) + str(id_), known
        return draw(st.sampled_from([path, f"{ROOT}/{path}", f"./{path}"])), known
    if kind == "json_id":
        return json.dumps({"id": id_, "label": draw(st.text(max_size=5))}), known
    key = "file_path" if kind == "json_file_path" else "path"
    return json.dumps({key: f"{ROOT}/{path}" if kind == "json_abs" else path}), known


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["id", "path", "file_path", "x"]), inner, max_size=3)
    ),
    max_leaves=8,
)
bad_record = st.one_of(
    st.binary(max_size=40).filter(lambda b: b"\n" not in b and b"\0" not in b),
    json_values.map(lambda v: json.dumps(v)),
    st.sampled_from(
        [
            "{" * 5000,
            "[" * 100000,
            '{"id": ' + "9" * 5000 + "}",
            "9" * 5000,
            '{"path": "\\ud800"}',
            '{"id": 1e999}',
            '{"id": NaN}',
            '{"id": 18446744073709551616}',
            "1_0",
            '{"path": "a\\u0000b"}',
            '{"id": "3"}',
            '{"path": 7}',
            '{"path": ["x"]}',
            "\udcff\udcfe",
            "+",
            "-0x10",
        ]
    ),
)


def _processed(db: Path) -> set[int]:
    conn = sqlite3.connect(db)
    try:
        return {r[0] for r in conn.execute("SELECT id FROM image_metadata WHERE processed = 1")}
    finally:
        conn.close()


def _reset(db: Path) -> None:
    conn = sqlite3.connect(db)
    try:
        with conn:
            conn.execute("UPDATE image_metadata SET processed = 0")
    finally:
        conn.close()


@pytest.fixture(scope="module")
def fuzz_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return balanced(tmp_path_factory.mktemp("fuzz") / "f.db", LABELS)


def _run(db: Path, data: bytes, by: str, null: bool) -> tuple[int, str, str]:
    args = ["mark", "-", "--processed", "--json", "--by", by, "--no-log", "--db", str(db)] + (["-0"] if null else [])
    result = CliRunner().invoke(app, args, input=data)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # any other exception is a failure, shown with its traceback
    return result.exit_code, result.stdout, result.stderr


@FUZZ
@given(by=st.sampled_from(["id", "path"]), null=st.booleans(), data=st.data())
def test_good_records_mark_exactly_their_samples(fuzz_db: Path, by: str, null: bool, data: st.DataObject) -> None:
    records = data.draw(st.lists(good_record(by) | st.just(("", None)), max_size=12))
    _reset(fuzz_db)
    end = "\0" if null else data.draw(st.sampled_from(["\n", "\r\n"]))
    payload = "".join(text + end for text, _ in records).encode()
    code, out, err = _run(fuzz_db, payload, by, null)
    assert (code, err.count("Error:")) == (0, 0), err
    expected = {known for _, known in records if known is not None}
    assert _processed(fuzz_db) == expected
    result = json.loads(out)
    assert result["inputs"] == sum(1 for text, _ in records if text.strip())
    assert result["matched"] == len(expected)


@FUZZ
@given(by=st.sampled_from(["id", "path"]), null=st.booleans(), data=st.data())
def test_any_input_is_a_result_or_one_error_line(fuzz_db: Path, by: str, null: bool, data: st.DataObject) -> None:
    good = data.draw(st.lists(good_record(by).map(lambda r: r[0]), max_size=4))
    bad = data.draw(st.lists(bad_record, min_size=1, max_size=3))
    lines = data.draw(st.permutations(good + bad))
    _reset(fuzz_db)
    sep = b"\0" if null else b"\n"
    payload = sep.join(line.encode("utf-8", "surrogateescape") if isinstance(line, str) else line for line in lines)
    code, out, err = _run(fuzz_db, payload, by, null)
    if code == 0:
        assert err.count("Error:") == 0
        json.loads(out)
    else:
        assert code == 1, (code, err)
        assert err.startswith("Error: line ") and err.count("\n") == 1, err
        assert _processed(fuzz_db) == set(), "a batch that failed validation marked something"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[" * 100000, "is not a sample id"),
        ('{"x": ' + "[" * 100000 + "}", "JSON nested more than 32 levels deep"),
        ('{"path": "\\ud800"}', "holds a lone surrogate"),
        ('{"id": ' + "9" * 5000 + "}", "not a usable JSON value"),
        ("9" * 5000, "is outside the 64-bit range"),
        ('{"id": 1e999}', '"id" must be a 64-bit integer, not inf'),
        ('{"id": [' + "1," * 1000 + "1]}", '"id" must be a 64-bit integer, not [1, 1, 1, 1'),
        ('{"path": 7}', '"path" must be a non-empty string, not 7'),
        ("1_0", "'1_0' is not a sample id"),
    ],
)
def test_hostile_lines_are_one_clear_line(fuzz_db: Path, line: str, message: str) -> None:
    _reset(fuzz_db)
    code, _, err = _run(fuzz_db, f"1\n2\n{line}\n3\n".encode(), "id", False)
    assert code == 1
    assert err.startswith("Error: line 3: ") and message in err and err.count("\n") == 1, err
    assert len(err) < 300
    assert _processed(fuzz_db) == set()


def test_an_endless_line_is_refused_without_reading_it_whole(fuzz_db: Path) -> None:
    from dlindex.query.mark import MAX_RECORD_BYTES

    for null in (False, True):
        code, _, err = _run(fuzz_db, (b"1\0" if null else b"1\n") + b"7" * (MAX_RECORD_BYTES + 10), "id", null)
        assert code == 1 and "line 2: longer than" in err, err
