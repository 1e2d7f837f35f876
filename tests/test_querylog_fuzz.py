"""Fuzzing the parsers of captured SQL: `dlindex log import`, `dlindex index --log`, the advisor's workload."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dlindex.advisor.workload import load_workload
from dlindex.catalog.sandbox import guarded
from dlindex.cli import app
from dlindex.querylog.importer import MAX_STATEMENT_CHARS, file_lines, parse_statements, statement_kind

from .conftest import invoke, rows
from .synthetic import Row, make_catalog

FRAGMENTS = [
    "SELECT", "select id from image_metadata", "WHERE", "label_id = ?", "(", ")", ";", "'", "''", '"', "--", "/*", "*/",
    "-- duration_ms=", "1e999", "1.2.3", "0", "\n", "\r\n", " ", "WITH x AS (", "INSERT INTO labels (name) VALUES ('a')",
    "UPDATE image_metadata SET processed = 1", "DELETE FROM labels", "BEGIN", "COMMIT", "DROP TABLE labels",
    "PRAGMA writable_schema = 1", "ATTACH DATABASE 'x' AS y", "\x00", "\ufeff", "é", "?1", ":x", "@y", "$z", "\t",
]  # fmt: skip
SQLISH = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=12)), max_size=40).map("".join)
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return make_catalog(tmp_path / "c.db", [Row("cat", processed=1), Row("dog")])


def expected(text: str) -> tuple[int, int]:
    """(imported, skipped) as the import rules say, from the parser alone."""
    imported = skipped = 0
    for s in parse_statements(text):
        kind = statement_kind(s.sql)
        strip = __import__("re").sub(r"'(?:[^']|'')*'", "", s.sql)
        if s.too_long or kind in (None, "skip") or ";" in strip:
            skipped += 1
        else:
            imported += 1
    return imported, skipped


@settings(FUZZ, max_examples=100)  # a catalog transaction per example: fewer, still varied
@given(text=SQLISH)
def test_log_import_stores_what_it_parses_or_says_why_not(runner: CliRunner, db: Path, text: str) -> None:
    before = rows(db, "SELECT count(*) FROM query_log")[0][0]
    result = invoke(
        runner, "log", "import", "-", "--json", "--db", str(db), input=text.encode("utf-8", "surrogatepass")
    )
    if result.exit_code == 0:
        data = json.loads(result.stdout)
        # what stdin delivers, decoded as the command decodes it (bad UTF-8 replaced, newlines universal)
        decoded = (
            text.encode("utf-8", "surrogatepass").decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
        )
        assert (data["imported"], data["skipped"]) == expected(decoded)
        assert rows(db, "SELECT count(*) FROM query_log")[0][0] == before + data["imported"]
        assert rows(db, "SELECT count(*) FROM labels")[0][0] == 2  # nothing was run
    else:
        lines = result.stderr.splitlines()
        assert result.exit_code != 0 and len(lines) == 1 and lines[0].startswith("Error: "), result.stderr


@FUZZ
@given(text=SQLISH)
def test_a_file_and_a_string_parse_alike(tmp_path: Path, text: str) -> None:
    path = tmp_path / "trace.sql"
    path.write_text(text, encoding="utf-8", errors="surrogatepass", newline="")
    decoded = path.read_bytes().decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    assert list(parse_statements(file_lines(path))) == list(parse_statements(decoded))


@FUZZ
@given(text=SQLISH)
def test_the_advisor_workload_reads_any_log(db: Path, text: str) -> None:
    conn = guarded(db)
    try:
        workload = load_workload(conn, [("trace.sql", text)])
    finally:
        conn.close()
    assert all(s.reason and s.source == "trace.sql" for s in workload.skipped if s.line is not None)
    assert all(r.kind == "read" for r in workload.reads) and all(w.kind == "write" for w in workload.writes)


@pytest.mark.parametrize(
    "text",
    [
        "/*" * 500_000,  # an unclosed comment, many times: linear, not quadratic
        "'" * 1_000_001,
        "SELECT (\n" * 200_000,  # one statement of 200,000 lines
        "SELECT " + "x" * (3 * MAX_STATEMENT_CHARS) + "\nSELECT 1\n",  # one line past the bound, then a good one
        "select 1 -- duration_ms=" + "9" * 400 + "\n",
    ],
    ids=["comments", "quotes", "lines", "long-line", "huge-duration"],
)
def test_adversarial_logs_finish_quickly_in_bounded_memory(
    runner: CliRunner, db: Path, tmp_path: Path, text: str
) -> None:
    trace = tmp_path / "trace.sql"
    trace.write_text(text)
    started = time.monotonic()
    result = runner.invoke(app, ["log", "import", str(trace), "--json", "--db", str(db)])
    assert time.monotonic() - started < 60
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["imported"] + data["skipped"] >= 1
    if text.startswith("SELECT x"):
        assert data == {
            "imported": 1,
            "skipped": 1,
            "skipped_lines": [{"line": 1, "reason": f"longer than {MAX_STATEMENT_CHARS:,} characters"}],
        }
    stored = rows(db, "SELECT max(length(sql)), max(duration_ms) FROM query_log WHERE source = 'import'")[0]
    assert stored[0] is None or stored[0] <= MAX_STATEMENT_CHARS
    if text.startswith("select 1 -- duration_ms="):
        assert stored[1] is None  # not a finite duration
