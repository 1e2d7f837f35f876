"""Baseline: raw parallel read, one process, T threads.

python bench/baselines/parallel_read.py ROOT THREADS   ->  {"files": N, "bytes": B, "threads": T}
Lists ROOT with os.walk, then T threads pull paths from one shared iterator and
os.open/os.read/os.close each file (the GIL is released around the system calls, so up to T
reads are in flight).  This is what "the disk can do" for the cold-scan comparison.
"""

import json
import os
import sys
import threading

BUF = 1 << 20


def main() -> None:
    root, threads = sys.argv[1], int(sys.argv[2])
    paths = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
    it = iter(paths)  # list_iterator.__next__ is atomic under the GIL
    totals = []

    def worker() -> None:
        n = nbytes = 0
        for p in it:
            fd = os.open(p, os.O_RDONLY)
            try:
                while True:
                    k = len(os.read(fd, BUF))
                    nbytes += k
                    if k < BUF:
                        break
            finally:
                os.close(fd)
            n += 1
        totals.append((n, nbytes))

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(json.dumps({"files": sum(t[0] for t in totals), "bytes": sum(t[1] for t in totals), "threads": threads}))


if __name__ == "__main__":
    main()
