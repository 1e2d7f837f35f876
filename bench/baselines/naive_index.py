"""Baseline: the naive single-process indexer one would write in ten minutes.

python bench/baselines/naive_index.py ROOT DB [--max-seconds S]
  ->  {"files": N, "seconds": T, "complete": bool}
os.walk; per file: os.stat, read the whole file, xxhash.xxh3_128, Pillow Image.open (header
only: format and size), one INSERT and one commit into a fresh SQLite DB with default settings
(rollback journal, synchronous=FULL).  Labels are the folder names.  With --max-seconds it stops
after that long, so a slow run can be extrapolated from its rate.
"""

import io
import json
import os
import sqlite3
import sys
import time

import xxhash
from PIL import Image


def main() -> None:
    t0 = time.perf_counter()
    root, db = sys.argv[1], sys.argv[2]
    limit = float(sys.argv[sys.argv.index("--max-seconds") + 1]) if "--max-seconds" in sys.argv else None
    con = sqlite3.connect(db)
    con.execute(
        "CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, label TEXT, size INTEGER, "
        "mtime_ns INTEGER, xxh3_128 TEXT, format TEXT, width INTEGER, height INTEGER, error TEXT)"
    )
    con.commit()
    n, complete = 0, True
    for dirpath, _dirs, files in os.walk(root):
        label = os.path.basename(dirpath)
        for name in files:
            p = os.path.join(dirpath, name)
            st = os.stat(p)
            with open(p, "rb") as f:
                data = f.read()
            digest = xxhash.xxh3_128_hexdigest(data)
            fmt = w = h = err = None
            try:
                with Image.open(io.BytesIO(data)) as im:
                    fmt, (w, h) = im.format, im.size
            except Exception as e:
                err = repr(e)
            con.execute(
                "INSERT INTO files VALUES (?,?,?,?,?,?,?,?,?)",
                (os.path.relpath(p, root), label, st.st_size, st.st_mtime_ns, digest, fmt, w, h, err),
            )
            con.commit()
            n += 1
            if limit is not None and time.perf_counter() - t0 > limit:
                complete = False
                break
        if not complete:
            break
    con.close()
    print(json.dumps({"files": n, "seconds": time.perf_counter() - t0, "complete": complete}))


if __name__ == "__main__":
    main()
