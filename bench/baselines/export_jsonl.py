"""The baseline for a manifest ``dlindex export``: a bare python sqlite3 loop writing the rows an
export selects (status ok, a class, not excluded; id order) as JSON lines with the export's columns,
to OUT or to stdout.

  python bench/baselines/export_jsonl.py CATALOG.db [OUT.jsonl]
"""

from __future__ import annotations

import json
import sqlite3
import sys
from typing import TextIO

_ROWS = (
    "SELECT id, root_id, file_path, label_id, width, height, format, bytes, xxh3_128 FROM image_metadata "
    "WHERE status = 'ok' AND label_id IS NOT NULL AND excluded = 0 ORDER BY id"
)


def write(db: str, out: TextIO) -> None:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    labels = dict(conn.execute("SELECT id, name FROM labels"))
    ids = {k: i for i, k in enumerate(sorted(labels, key=lambda k: labels[k]))}
    roots = dict(conn.execute("SELECT id, path FROM roots"))
    q = json.encoder.encode_basestring
    cur = conn.execute(_ROWS)
    while batch := cur.fetchmany(4096):
        out.write("".join(
            f'{{"id":{i},"path":{q(roots[r] + "/" + p)},"label":{q(labels[c])},"label_id":{ids[c]},'
            f'"width":{w},"height":{h},"format":"{f}","bytes":{b},"xxh3_128":"{x}"}}\n'
            for i, r, p, c, w, h, f, b, x in batch))  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            write(sys.argv[1], f)
    else:
        write(sys.argv[1], sys.stdout)
