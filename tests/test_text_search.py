"""`query --text`'s search syntax: parsed once, written for FTS5 and for PostgreSQL, never an
operator or an SQL error from what a user types (fuzzed against a real FTS5 table)."""

from __future__ import annotations

import json
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlindex.errors import InputError
from dlindex.query.text_search import MAX_TERMS, parse_search

_TEXTS = ("a red car on the road", "a blue car", "red apples", "Café au lait", "the car's door", "OR and NOT")


@pytest.fixture(scope="module")
def fts() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(text, tokenize='unicode61 remove_diacritics 2')")
    conn.executemany("INSERT INTO t (rowid, text) VALUES (?, ?)", enumerate(_TEXTS, start=1))
    return conn


def found(conn: sqlite3.Connection, search: str) -> list[int]:
    match = parse_search(search).fts5()
    return [r[0] for r in conn.execute("SELECT rowid FROM t(?) ORDER BY rowid", (match,))]


@pytest.mark.parametrize(
    ("search", "expected"),
    [
        ("car", [1, 2, 5]),
        ("red car", [1]),
        ("red OR blue car", [1, 2]),  # OR binds closer than the implicit AND, as in web search
        ('"red car"', [1]),
        ('"car red"', []),
        ("car -blue", [1, 5]),
        ('car -"the road"', [2, 5]),
        ("cafe", [4]),  # accents folded
        ("LAIT", [4]),  # case folded
        ("or", [6]),  # a lower-case or is a word
        ('"OR"', [6]),
        ("NOT", [6]),  # FTS5's own operators are words here
        ("AND car", []),
        ("car*", [1, 2, 5]),  # '*' is punctuation, not a prefix
        ("red-car", [1]),  # a phrase: red then car
        ('"unclosed phrase', []),
    ],
)
def test_searches_find_what_a_person_expects(fts: sqlite3.Connection, search: str, expected: list[int]) -> None:
    assert found(fts, search) == expected


def test_the_server_form_carries_the_same_terms() -> None:
    parsed = parse_search('red OR "blue car" -"old one" big')
    assert json.loads(parsed.server()) == {"all": [["red", "blue car"], ["big"]], "none": ["old one"]}


@pytest.mark.parametrize(
    ("search", "says"),
    [
        ("", "no word to search for"),
        ("  !!! ... ", "no word to search for"),
        ("-cat", "only words to leave out"),
        ("OR cat", "OR needs a word"),
        ("cat OR", "OR needs a word"),
        ("cat OR OR dog", "OR needs a word"),
        ("cat OR -dog", "cannot be a side of OR"),
        ("x" * 1001, "at most 1,000"),
        ("a\0b", "NUL"),
        (" ".join(["w"] * (MAX_TERMS + 1)), f"more than {MAX_TERMS}"),
    ],
)
def test_a_search_that_cannot_mean_anything_is_one_line(search: str, says: str) -> None:
    with pytest.raises(InputError, match=says):
        parse_search(search)


@settings(max_examples=400, deadline=None)
@given(
    st.text(alphabet=st.sampled_from("ab c\"-*()^:+OR NOT AND NEAR{}é\\'\t\n.,;"), max_size=60) | st.text(max_size=40)
)
def test_no_search_reaches_fts5_as_an_operator_or_an_error(search: str) -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(text)")
    conn.executemany("INSERT INTO t (text) VALUES (?)", [(t,) for t in _TEXTS])
    try:
        parsed = parse_search(search)
    except InputError:
        return
    conn.execute("SELECT rowid FROM t(?)", (parsed.fts5(),)).fetchall()  # never a syntax error
    json.loads(parsed.server())
