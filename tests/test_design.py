"""docs/design.md's module table lists exactly dlindex's modules, each with its docstring's first line."""

from __future__ import annotations

from tests.design_table import documented_rows, expected_rows, normalise


def test_every_module_states_its_purpose() -> None:
    missing = [name for name, text in expected_rows().items() if not text]
    assert not missing, f"modules without a docstring (its first line is the one-line purpose): {missing}"


def test_purposes_are_one_short_line() -> None:
    long = {name: text for name, text in expected_rows().items() if len(text) > 120}
    assert not long, f"a module's purpose is one line under ~100 characters: {long}"


def test_documented_rows_parse_the_table_format() -> None:
    text = "| module | owns |\n|---|---|\n| `dlindex/a.py`, `dlindex/b/` | what `a` does. |\n| other | x |\n"
    assert documented_rows(text) == {"dlindex/a.py": "what `a` does.", "dlindex/b/": "what `a` does."}
    assert normalise("What `a` does.") == normalise("what a does")


def test_design_table_matches_the_modules() -> None:
    expected = expected_rows()
    documented = documented_rows()
    assert sorted(documented) == sorted(expected), (
        f"not in docs/design.md: {sorted(set(expected) - set(documented))}; "
        f"no such module: {sorted(set(documented) - set(expected))}; regenerate: python -m tests.design_table"
    )
    wrong = {n: (documented[n], t) for n, t in expected.items() if normalise(documented[n]) != normalise(t)}
    assert not wrong, f"purpose differs from the docstring's first line (table, docstring): {wrong}"
