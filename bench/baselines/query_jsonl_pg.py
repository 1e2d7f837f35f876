"""The baseline for ``dlindex query --format jsonl`` on a server catalog: a bare psycopg loop (a
server-side cursor in a read-only transaction, 2,000 rows a fetch) writing the same JSON lines
as bench/baselines/query_jsonl.py does for a file (default columns, status ok, not excluded,
id order) to stdout.

  python bench/baselines/query_jsonl_pg.py postgresql://... > rows.jsonl
"""

from __future__ import annotations

import json
import sys

import psycopg

_ROWS = (
    "SELECT id, root_id, file_path, label_id, width, height, status, processed, processing_status, created_at "
    "FROM image_metadata WHERE status = 'ok' AND excluded = 0 ORDER BY id"
)


def main(url: str) -> None:
    with psycopg.connect(url) as conn:
        roots = {i: p.rstrip("/") + "/" for i, p in conn.execute("SELECT id, path FROM roots")}
        labels = dict(conn.execute("SELECT id, name FROM labels").fetchall())
        out = sys.stdout
        dumps = json.JSONEncoder(ensure_ascii=False).encode
        with conn.cursor(name="bare") as cur:
            cur.itersize = 2000
            cur.execute(_ROWS)
            for id_, root, path, label, width, height, status, processed, processing, created in cur:
                row = {"id": id_, "path": roots[root] + path, "label": labels.get(label), "width": width,
                       "height": height, "status": status, "processed": processed,
                       "processing_status": processing, "created_at": created}  # fmt: skip
                out.write(dumps(row) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
