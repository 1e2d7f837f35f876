"""dlindex/catalog/postgres/connect.py and dialect.py: the server catalog's connection, its SQL, its bad input.

The dialect rules are checked on their own and fuzzed; everything else runs against a real
PostgreSQL server (tests/servers.py), with many writers in real processes.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from typer.testing import CliRunner

from dlindex import Catalog
from dlindex.catalog.backend import is_server_url
from dlindex.catalog.postgres.connect import redact
from dlindex.catalog.postgres.dialect import element_type, translate
from dlindex.catalog.sqlite.migrations import LATEST_VERSION, m012_change_token, m015_file_keys, path_hash
from dlindex.errors import CatalogError, InputError

from .backends import schema_before
from .conftest import DLINDEX, invoke, one_error_line

psycopg = pytest.importorskip("psycopg")


# --- the dialect -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sqlite", "postgres"),
    [
        ("SELECT id FROM t WHERE a = ? AND b = ?", "SELECT id FROM t WHERE a = %s AND b = %s"),
        ("SELECT id FROM t WHERE a = :a OR b = :b", "SELECT id FROM t WHERE a = %(a)s OR b = %(b)s"),
        ("BEGIN IMMEDIATE", "BEGIN"),
        ("SELECT 1 FROM temp.mark_ids JOIN main.roots ON true", "SELECT 1 FROM pg_temp.mark_ids JOIN roots ON TRUE"),
        ("INSERT OR IGNORE INTO labels (name) VALUES (?)", "INSERT INTO labels (name) VALUES (%s) ON CONFLICT DO NOTHING"),
        (
            "INSERT OR REPLACE INTO query_cache (key, changes) VALUES (:key, :changes)",
            "INSERT INTO query_cache (key, changes) VALUES (%(key)s, %(changes)s) "
            "ON CONFLICT(key) DO UPDATE SET changes = EXCLUDED.changes",
        ),
        ("UPDATE roots SET presplit = ? WHERE presplit IS NOT ?",
         "UPDATE roots SET presplit = %s WHERE presplit IS DISTINCT FROM %s"),
        ("SELECT 1 WHERE a IS ? AND b IS NULL AND c IS NOT NULL", "SELECT 1 WHERE a IS NOT DISTINCT FROM %s AND b IS NULL AND NOT c IS NULL"),
        ("SELECT 1 FROM a JOIN b JOIN c ON c.x = b.x", "SELECT 1 FROM a JOIN b ON TRUE JOIN c ON c.x = b.x"),
        ("SELECT 1 WHERE n NOT LIKE 'sqlite_%'", "SELECT 1 WHERE n NOT ILIKE 'sqlite_%%'"),
        ("SELECT a FROM t ORDER BY a, b DESC", "SELECT a FROM t ORDER BY a, b DESC"),  # no NULLS FIRST: indexes serve it
        ("SELECT 'it''s ? :x 50%' WHERE e LIKE ?", "SELECT 'it''s ? :x 50%%' WHERE e ILIKE %s"),
        ("SELECT id FROM t ORDER BY id LIMIT -1 OFFSET :offset", "SELECT id FROM t ORDER BY id LIMIT ALL OFFSET %(offset)s"),
        ("UPDATE t SET at = CURRENT_TIMESTAMP",
         "UPDATE t SET at = TO_CHAR(TIMEZONE('UTC', CURRENT_TIMESTAMP), 'YYYY-MM-DD HH24:MI:SS')"),
        ("CREATE TEMP TABLE x (id INTEGER PRIMARY KEY, p TEXT, v BLOB, r REAL) WITHOUT ROWID",
         'CREATE TEMPORARY TABLE x (id BIGINT PRIMARY KEY, p TEXT COLLATE "C", v BYTEA, r DOUBLE PRECISION)'),
        # positional parameters keep their order
        ("SELECT a FROM t LIMIT ? OFFSET ?", "SELECT a FROM t LIMIT %s OFFSET %s"),
    ],
)  # fmt: skip
def test_dialect_rules(sqlite: str, postgres: str) -> None:
    assert translate(sqlite).text == postgres


def test_json_each_becomes_a_typed_array() -> None:
    t = translate("SELECT id FROM image_metadata WHERE id IN (SELECT value FROM json_each(:ids))")
    assert [(p.key, p.empty_type) for p in t.json_params] == [("ids", "bigint")]
    assert t.text.format(t0="bigint") == (
        "SELECT id FROM image_metadata WHERE id IN (SELECT value FROM unnest(%(ids)s::bigint[]) "
        "WITH ORDINALITY AS json_each(value, key))"
    )
    names = translate("SELECT id FROM labels WHERE name IN (SELECT value FROM json_each(?))")
    assert names.json_params[0].key == 0 and names.json_params[0].empty_type == "text"
    assert element_type([1, 2], "text") == "bigint"
    assert element_type(["a"], "bigint") == "text"
    assert element_type([], "bigint") == "bigint"
    assert element_type([[None, "a"]], "text") == "jsonb"


_CONDITIONS = st.sampled_from(
    ["a = ?", "a = :name", "b IS ?", "b IS NOT NULL", "c LIKE ?", "d = 'x''y'", "e = '%'", 'f = "q""r"',
     "g IN (SELECT value FROM json_each(?))", "h = CURRENT_TIMESTAMP", "i NOT LIKE '50%'", "j = '?:name{}'"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(_CONDITIONS, min_size=1, max_size=8), st.sampled_from(["temp.t", "main.t", "t"]))
def test_translate_keeps_every_parameter_and_literal(conditions: list[str], table: str) -> None:
    sql = f"SELECT a FROM {table} WHERE " + " AND ".join(conditions)
    if "?" in sql.replace("'?", "") and ":name" in sql.replace("':name", "").replace("?:name", ""):
        with pytest.raises(ValueError):  # one kind of parameter per statement
            translate(sql)
        return
    t = translate(sql)
    text = t.text.format(**{p.slot: "bigint" for p in t.json_params}) if t.json_params else t.text
    quoted = re.findall(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"", sql)
    outside = re.sub(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"", "", sql)
    assert text.count("%s") + text.count("%(__dlx_q") == outside.count("?")
    assert text.count("%(name)s") == len(re.findall(r"(?<![:\w]):name\b", outside))
    for literal in quoted:
        assert literal.replace("%", "%%") in text


def test_a_later_process_reads_the_translation_from_disk(tmp_path: Path) -> None:
    """sqlglot is imported and a statement parsed once per machine, not once per command."""
    code = (
        "import sys; from dlindex.catalog.postgres.dialect import translate; "
        "t = translate('SELECT id FROM roots WHERE path = ? AND added_at LIKE ?'); print(t.text, 'sqlglot' in sys.modules)"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    runs = [
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True) for _ in "ab"
    ]
    text = "SELECT id FROM roots WHERE path = %s AND added_at ILIKE %s"
    assert [r.stdout for r in runs] == [f"{text} True\n", f"{text} False\n"]
    assert [p.name.startswith("pg-sql-") for p in (tmp_path / "dlindex").iterdir()] == [True]


def _native(text: str) -> bool:
    """PostgreSQL's own SQL (psycopg parameters, casts) or a template: sent as it is, or formatted first."""
    return "%s" in text or "::" in text or "{" in text


def test_every_statement_the_library_sends_translates() -> None:
    """Every SQL constant of the modules that run on a server catalog has a PostgreSQL form
    (PostgreSQL's own SQL, sent with execute_raw, and SQLite-only modules are left out)."""
    import importlib
    import pkgutil

    import dlindex

    sqlite_only = (".catalog.sqlite.", ".catalog.merge", ".catalog.check", ".catalog.sandbox", ".advisor.scratch",
                   ".advisor.copy_stats", ".advisor.replay", ".catalog.postgres.migrations",
                   ".catalog.postgres.history_schema")  # fmt: skip
    statement = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|DROP)\s", re.IGNORECASE)
    checked = 0
    for found in pkgutil.walk_packages(dlindex.__path__, "dlindex."):
        if found.name.endswith("__main__") or any(part in found.name + "." for part in sqlite_only):
            continue
        module = importlib.import_module(found.name)
        for name, value in vars(module).items():
            texts = value if isinstance(value, tuple) else (value,)
            for text in texts:
                if isinstance(text, str) and statement.match(text) and not _native(text):
                    t = translate(text)
                    assert t.text and "__dlx_" not in t.text, f"{found.name}.{name}"
                    checked += 1
    assert checked > 150


def test_urls() -> None:
    assert is_server_url("postgresql://u@h/db") and is_server_url("postgres://h/db")
    assert not is_server_url("catalog.db") and not is_server_url(Path("postgresql://x"))
    assert redact("postgresql://ann:s3cret@db.example:5432/cat") == "postgresql://ann:***@db.example:5432/cat"
    assert redact("postgresql://ann@h/cat") == "postgresql://ann@h/cat"


# --- a real server -----------------------------------------------------------------------------


def make_tree(root: Path, n: int) -> Path:
    for i in range(n):
        folder = root / f"c{i % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 4), (i % 256, i // 256, 7)).save(folder / f"{i:05d}.png")
    return root


def test_scan_creates_the_schema_once_under_the_lock(pg_url: str, tmp_path: Path) -> None:
    """Four processes open one new database at once: one makes the schema, all succeed."""
    code = "from dlindex import Catalog; Catalog(__import__('sys').argv[1], create=True).close()"
    procs = [subprocess.Popen([sys.executable, "-c", code, pg_url], stderr=subprocess.PIPE) for _ in range(4)]
    assert [p.wait(timeout=60) for p in procs] == [0] * 4, [p.stderr.read() for p in procs if p.stderr]
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT application, version FROM dlindex_schema").fetchall() == [
            ("dlindex", LATEST_VERSION)
        ]


def test_many_writers_lose_no_update(pg_url: str, tmp_path: Path) -> None:
    """8 mark and 8 features compute processes at once on overlapping samples: every process
    succeeds (no lock error, no deadlock), and every update is there. Each waits up to 240 s
    for a lock (default 30 s): 16 processes queueing on two busy cores can wait past 30 s,
    and a wait that runs out is not what this test is about."""
    root = make_tree(tmp_path / "tree", 800)
    subprocess.run([*DLINDEX, "scan", str(root), "--db", pg_url, "--quiet"], check=True, timeout=120)
    rng = random.Random(7)
    sets = [sorted(rng.sample(range(1, 801), 300)) for _ in range(8)]
    marks = []
    for k, ids in enumerate(sets):
        flag = ["--processing-status", "completed"] if k % 2 else ["--processed"]
        proc = subprocess.Popen([*DLINDEX, "mark", *flag, "--db", pg_url, "--quiet", "--wait", "240"], stdin=subprocess.PIPE,
                                stderr=subprocess.PIPE)  # fmt: skip
        assert proc.stdin is not None
        proc.stdin.write("\n".join(map(str, ids)).encode())
        proc.stdin.close()
        marks.append(proc)
    computes = [
        subprocess.Popen(
            [
                *DLINDEX,
                "features",
                "compute",
                "--type",
                "dhash",
                "--workers",
                "1",
                "--db",
                pg_url,
                "--quiet",
                "--wait",
                "240",
            ],
            stderr=subprocess.PIPE,
        )
        for _ in range(8)
    ]
    for proc in marks + computes:
        assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    completed = set().union(*(s for k, s in enumerate(sets) if k % 2))
    processed = set().union(*(s for k, s in enumerate(sets) if not k % 2))
    with psycopg.connect(pg_url) as conn:
        got_completed = {
            r[0] for r in conn.execute("SELECT id FROM image_metadata WHERE processing_status = 'completed'")
        }
        got_processed = {r[0] for r in conn.execute("SELECT id FROM image_metadata WHERE processed = 1")}
        vectors = conn.execute("SELECT count(*), count(DISTINCT image_id) FROM image_features").fetchone()
        queued = conn.execute("SELECT count(*) FROM feature_state").fetchone()[0]
    assert got_completed == completed and got_processed == processed
    assert vectors == (800, 800) and queued == 0


def test_a_read_left_open_past_close_ends_quietly(pg_url: str) -> None:
    """`query | head -1`: the reader stops, the catalog closes, then the half-read generator is
    finalised and logs its read; on a closed server connection that must be as quiet as on a file."""
    from dlindex import query_rows

    with Catalog(pg_url, create=True) as catalog, catalog.write_transaction() as conn:
        conn.execute("INSERT INTO roots (path) VALUES ('/r')")
        conn.executemany(
            "INSERT INTO image_metadata (root_id, file_path) VALUES (1, ?)", [(f"{i}.png",) for i in range(3)]
        )
    catalog = Catalog(pg_url)
    reading = query_rows(catalog, columns="id", cache=False)
    assert next(reading) == {"id": 1}
    catalog.close()
    reading.close()  # type: ignore[attr-defined]
    with Catalog(pg_url) as catalog, pytest.raises(Exception, match="closed") as closed:
        catalog.close()
        catalog.conn.execute("SELECT 1")
    assert type(closed.value).__name__ == "CatalogClosedError"


def test_vectors_keep_their_bytes(pg_url: str, tmp_path: Path) -> None:
    root = make_tree(tmp_path / "tree", 12)
    db = tmp_path / "c.db"
    for where in (str(db), pg_url):
        invoke(CliRunner(), "scan", str(root), "--db", where, "--workers", "1", "--quiet")
        invoke(CliRunner(), "features", "compute", "--type", "thumb", "--db", where, "--workers", "1", "--quiet")
    import sqlite3

    with sqlite3.connect(db) as lite, psycopg.connect(pg_url) as server:
        a = lite.execute("SELECT image_id, vector FROM image_features ORDER BY image_id").fetchall()
        b = server.execute("SELECT image_id, vector FROM image_features ORDER BY image_id").fetchall()
    assert a == [(i, bytes(v)) for i, v in b] and len(a) == 12


# --- bad input: one line, nothing written -----------------------------------------------------


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://postgres@127.0.0.1:notaport/x", "not a valid PostgreSQL URL"),
        ("postgresql://postgres@127.0.0.1:1/dlindex", "cannot open the PostgreSQL catalog"),
        ("postgresql://postgres@256.1.1.1:5432/x?connect_timeout=1", "cannot open the PostgreSQL catalog"),
    ],
)
def test_a_wrong_url_or_a_server_that_is_down(url: str, says: str) -> None:
    result = invoke(CliRunner(), "query", "--db", url)
    assert says in one_error_line(result)


def test_a_database_that_does_not_exist(postgres_server: str) -> None:
    url = postgres_server.rsplit("/", 1)[0] + "/no_such_catalog"
    line = one_error_line(invoke(CliRunner(), "stats", "--db", url))
    assert "cannot open the PostgreSQL catalog" in line and "no_such_catalog" in line


def test_an_empty_database_is_no_catalog_until_a_scan(pg_url: str) -> None:
    line = one_error_line(invoke(CliRunner(), "query", "--db", pg_url))
    assert "no dlindex catalog in the PostgreSQL database" in line
    with psycopg.connect(pg_url) as conn:  # nothing was written
        assert (
            conn.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'").fetchone()[0]
            == 0
        )


def test_another_schema_version_is_refused_untouched(pg_url: str, tmp_path: Path) -> None:
    root = make_tree(tmp_path / "tree", 4)
    invoke(CliRunner(), "scan", str(root), "--db", pg_url, "--quiet")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE dlindex_schema SET version = 99")
        before = conn.execute("SELECT counter FROM catalog_changes").fetchone()
    for args in (("query",), ("mark", "--processed"), ("scan", str(root))):
        line = one_error_line(invoke(CliRunner(), *args, "--db", pg_url, input="1\n"))
        assert "schema version 99, newer than this dlindex" in line
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT counter FROM catalog_changes").fetchone() == before
        assert conn.execute("SELECT count(*) FROM image_metadata WHERE processed = 1").fetchone()[0] == 0


def test_a_catalog_from_before_the_file_keys_gets_them_keeping_its_rows(pg_url: str, tmp_path: Path) -> None:
    root = make_tree(tmp_path / "tree", 4)
    Image.new("L", (2, 2)).save(root / "c0" / "caf\u00e9 \u732b.png")  # path_hash hashes UTF-8
    invoke(CliRunner(), "scan", str(root), "--db", pg_url, "--quiet")
    schema_before(pg_url, m015_file_keys)  # the catalog as the schema before made it
    again = invoke(CliRunner(), "scan", str(root), "--db", pg_url, "--json")
    assert again.exit_code == 0, again.output
    assert '"unchanged": 5' in again.stdout
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT version FROM dlindex_schema").fetchone() == (LATEST_VERSION,)
        found = conn.execute("SELECT file_path, path_hash, inode FROM image_metadata").fetchall()
    assert len(found) == 5 and all(inode is not None for _, _, inode in found)
    assert {key: value for key, value, _ in found} == {key: path_hash(key) for key, _, _ in found}


def test_path_hash_of_an_upgraded_catalog_is_the_scans_whatever_the_database_encoding(
    postgres_server: str, tmp_path: Path
) -> None:
    """Schema 15 hashes the UTF-8 bytes of file_path in SQL, as migrations.path_hash does in
    Python, also where the database keeps text in another encoding (LATIN1)."""
    from psycopg import sql

    from .servers import with_database

    name = f"dlindex_test_latin1_{os.getpid()}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").format(
                sql.Identifier(name)
            )
        )
    url = with_database(postgres_server, name)
    try:
        root = make_tree(tmp_path / "tree", 2)
        Image.new("L", (2, 2)).save(root / "c0" / "caf\u00e9.png")
        assert invoke(CliRunner(), "scan", str(root), "--db", url, "--quiet").exit_code == 0
        schema_before(url, m015_file_keys)
        assert invoke(CliRunner(), "scan", str(root), "--db", url, "--quiet").exit_code == 0
        with psycopg.connect(url) as conn:
            found = conn.execute("SELECT file_path, path_hash FROM image_metadata").fetchall()
        assert len(found) == 3
        assert {key: value for key, value in found} == {key: path_hash(key) for key, _ in found}
    finally:
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_a_database_of_someone_else_is_left_alone(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE roots (who text)")
        conn.execute("INSERT INTO roots VALUES ('theirs')")
    root = make_tree(tmp_path / "tree", 2)
    line = one_error_line(invoke(CliRunner(), "scan", str(root), "--db", pg_url))
    assert "holds tables dlindex did not make (roots)" in line
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT * FROM roots").fetchall() == [("theirs",)]
        tables = {
            r[0] for r in conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
        }
    assert tables == {"roots"}


def test_a_version_11_catalog_gets_its_change_token(pg_url: str) -> None:
    """Schema 12 adds the token beside the change counter; the counter stays, a token is drawn."""
    with Catalog(pg_url, create=True) as catalog, catalog.write_transaction():
        pass
    schema_before(pg_url, m012_change_token)
    with Catalog(pg_url) as catalog:
        state = catalog.state()
        assert state.changes == 1 and re.fullmatch(r"[0-9a-f]{32}", state.token)
        with catalog.write_transaction():
            pass
        assert catalog.state().changes == 2 and catalog.state().token != state.token


def test_a_damaged_version_table(pg_url: str, tmp_path: Path) -> None:
    Catalog(pg_url, create=True).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO dlindex_schema VALUES ('dlindex', 11)")
    with pytest.raises(CatalogError, match="damaged dlindex_schema"):
        Catalog(pg_url)


def test_a_catalog_missing_a_table_is_damaged_and_left_alone(pg_url: str) -> None:
    Catalog(pg_url, create=True).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE image_features")
    result = invoke(CliRunner(), "query", "--db", pg_url)
    assert result.exit_code == 6, result.output  # ExitCode.DAMAGED, as for a damaged catalog file
    assert result.stderr.splitlines() == [
        f"Error: PostgreSQL catalog {redact(pg_url)} is damaged (table image_features is missing); nothing was "
        "changed: restore the database from a backup (pg_dump / pg_restore)"
    ]
    with psycopg.connect(pg_url, autocommit=True) as conn:  # not re-created by a migration
        assert conn.execute("SELECT to_regclass('image_features')").fetchone() == (None,)


def test_the_library_raises_dlindex_errors() -> None:
    with pytest.raises(InputError, match="not a valid PostgreSQL URL"):
        Catalog("postgresql://h:99999999/x")


def test_without_psycopg_one_line_names_the_extra(tmp_path: Path) -> None:
    """An install without the extra: every package this environment has, but psycopg."""
    import sysconfig

    packages = Path(sysconfig.get_paths()["purelib"])
    kept = tmp_path / "site-packages"
    kept.mkdir()
    for entry in packages.iterdir():
        if not entry.name.lower().startswith("psycopg"):
            (kept / entry.name).symlink_to(entry)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(kept), str(Path(__file__).resolve().parents[1])])}
    env.pop("PYTHONHOME", None)
    # -S: no site-packages but the one named above (no .pth files: the repo goes on the path)
    proc = subprocess.run([sys.executable, "-S", "-m", "dlindex", "query", "--db", "postgresql://h/x"],
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "Error: a postgresql:// catalog needs psycopg 3: pip install 'dlindex[postgres]'"
    ]
