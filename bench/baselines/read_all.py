"""Baseline: the bare read-every-byte loop, one process, one thread.

python bench/baselines/read_all.py ROOT   ->  {"files": N, "bytes": B}
Walks ROOT with os.walk and os.open/os.read/os.close's each file once (one 1 MiB read per
file; only files larger than that need more).  Deliberately no stat, no hashing, no parsing.
"""

import json
import os
import sys

BUF = 1 << 20


def main() -> None:
    root = sys.argv[1]
    n = nbytes = 0
    join, o_open, o_read, o_close, rd = os.path.join, os.open, os.read, os.close, os.O_RDONLY
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = o_open(join(dirpath, name), rd)
            try:
                while True:
                    k = len(o_read(fd, BUF))
                    nbytes += k
                    if k < BUF:
                        break
            finally:
                o_close(fd)
            n += 1
    print(json.dumps({"files": n, "bytes": nbytes}))


if __name__ == "__main__":
    main()
