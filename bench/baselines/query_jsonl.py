"""The baseline for ``dlindex query --format jsonl``: a bare python sqlite3 loop writing the same
JSON lines (default columns, status ok, not excluded, id order) to stdout.

  python bench/baselines/query_jsonl.py CATALOG.db > rows.jsonl
"""

from __future__ import annotations

import json
import sqlite3
import sys

_ROWS = (
    "SELECT id, root_id, file_path, label_id, width, height, status, processed, processing_status, created_at "
    "FROM image_metadata WHERE status = 'ok' AND excluded = 0 ORDER BY id"
)


def main(db: str) -> None:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    roots = {i: p.rstrip("/") + "/" for i, p in conn.execute("SELECT id, path FROM roots")}
    labels = dict(conn.execute("SELECT id, name FROM labels"))
    out = sys.stdout
    dumps = json.JSONEncoder(ensure_ascii=False).encode
    for id_, root, path, label, width, height, status, processed, processing, created in conn.execute(_ROWS):
        row = {"id": id_, "path": roots[root] + path, "label": labels.get(label), "width": width, "height": height,
               "status": status, "processed": processed, "processing_status": processing, "created_at": created}  # fmt: skip
        out.write(dumps(row) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
