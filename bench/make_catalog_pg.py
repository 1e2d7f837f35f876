"""make_catalog.py's rows into a PostgreSQL catalog: dlindex makes the schema, COPY fills it.

The same rows as a catalog file of the same arguments (make_catalog.generate); the identity
sequences are moved past the ids COPY wrote, so dlindex's next insert gets a fresh id, and
ANALYZE runs at the end (the server's planner needs statistics; a scan's many small
transactions leave that to autovacuum).

Usage:  python -m dlindex postgres start /tmp/pg     # prints the URL
        python bench/make_catalog.py --db postgresql://... --rows 1e5 --root /tmp/c-root
"""

from __future__ import annotations

import time
from typing import Any

from catalog_rows import (
    FEATURE_COLUMNS,
    SQLITE_INSERT_COLUMNS,
    CatalogSpec,
    Counters,
    ahead,
    generate,
    label_names,
    scan_rows,
    scan_starts,
    state_token,
    times_text,
    transactions,
)
from make_catalog import FIRST_FILES, LAST_FILES, create_schema, make_sentinels

_SCAN_COLUMNS = (
    "id", "root_id", "options", "pid", "state", "started_at", "finished_at", "seen", "new", "changed",
    "unchanged", "missing", "corrupt", "skipped", "errors", "seconds",
)  # fmt: skip
_SEQUENCES = ("roots", "labels", "image_metadata", "scans")


def _copy(cur: Any, table: str, columns: tuple[str, ...], rows: Any) -> None:
    with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def make_postgres(url: str, spec: CatalogSpec, *, chunk: int = 50_000) -> dict[str, object]:
    """Fill the (new, empty) server catalog at ``url``; return figures (rows/s, table bytes)."""
    import psycopg

    if not spec.root:
        raise SystemExit("a server catalog needs --root DIR (made, with the few files dlindex looks for)")
    t0 = time.perf_counter()
    create_schema(url)
    c = Counters()
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        (existing,) = cur.execute("SELECT count(*) FROM image_metadata").fetchone() or (0,)
        if existing:
            raise SystemExit(f"{url}: the catalog already has {existing} rows; use an empty database")
        first = times_text(scan_starts(spec)[:1])[0]
        cur.execute("INSERT INTO roots (id, path, added_at, presplit) VALUES (1, %s, %s, 1)", (spec.root, first))
        _copy(cur, "labels", ("id", "name"), enumerate(label_names(spec), start=1))
        cur.execute(
            "INSERT INTO feature_types (name, dim, dtype, extractor, version, created_at) "
            "VALUES ('dhash', 64, 'float32', 'dhash', 0, %s)",
            (first,),
        )
        for rows, feats, attributes in ahead(generate(spec, chunk, c)):
            _copy(cur, "image_metadata", SQLITE_INSERT_COLUMNS, rows)
            _copy(cur, "image_features", FEATURE_COLUMNS, feats)
            _copy(cur, "sample_attributes", ("image_id", "name", "value"), attributes)
        _copy(cur, "scans", _SCAN_COLUMNS, scan_rows(spec, c))
        cur.execute("UPDATE feature_types SET version = %s WHERE name = 'dhash'", (-(-c.features // 1000),))
        cur.execute(
            "UPDATE catalog_changes SET counter = %s, token = %s WHERE id = 1",
            (transactions(spec, c), state_token(spec)),
        )
        for table in _SEQUENCES:  # names are this module's constants
            cur.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
        conn.commit()
        loaded = time.perf_counter() - t0
        conn.autocommit = True
        cur.execute("ANALYZE")
        make_sentinels(spec.root, cur.execute(FIRST_FILES).fetchall(), cur.execute(LAST_FILES).fetchall())
        (size,) = cur.execute("SELECT pg_database_size(current_database())").fetchone() or (0,)
    seconds = time.perf_counter() - t0
    return {"rows": spec.rows, "seconds": round(seconds, 2), "load_seconds": round(loaded, 2),
            "rows_per_s": round(spec.rows / seconds), "bytes": int(size), "ok": c.ok, "corrupt": c.corrupt,
            "missing": c.missing, "features": c.features, "attributes": c.attributes, "root": spec.root}  # fmt: skip
