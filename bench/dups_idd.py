"""bench_dups' imagededup side: runs in imagededup's own venv (never imports dlindex).

  IDD_PY bench/dups_idd.py search JOB.json   # find_duplicates / HashEval on hex hashes from an .npy file
  IDD_PY bench/dups_idd.py encode JOB.json   # DHash().encode_image on a list of files

imagededup's package __init__ imports its CNN and plotting modules (torch, torchvision,
matplotlib) even for hashing; those are not installed in the bench venv (hashing and the search
never call them), so the two modules are replaced by empty ones before the import.
"""

from __future__ import annotations

import json
import resource
import sys
import time
import types


def _import_hashing():  # type: ignore[no-untyped-def]
    for name, attrs in {"imagededup.utils.models": ("CustomModel",), "imagededup.utils.plotter": ("plot_duplicates",),
                        "imagededup.methods.cnn": ("CNN",)}.items():  # fmt: skip
        module = types.ModuleType(name)
        for attr in attrs:
            setattr(module, attr, None)
        sys.modules[name] = module
    from imagededup.handlers.search.retrieval import HashEval
    from imagededup.methods.hashing import DHash

    return DHash, HashEval


def search(job: dict) -> dict:
    import numpy as np

    DHash, HashEval = _import_hashing()
    hashes = np.load(job["hashes"])
    names = [str(i) for i in range(hashes.size)]
    encoding = {name: format(int(h), "016x") for name, h in zip(names, hashes.tolist(), strict=True)}
    queries = encoding if job["queries"] is None else {names[i]: encoding[names[i]] for i in job["queries"]}
    t0 = time.perf_counter()
    if job["queries"] is None:  # the user-facing call, all against all
        found = DHash(verbose=False).find_duplicates(
            encoding_map=encoding, max_distance_threshold=job["k"], scores=True,
            search_method=job["method"], num_dist_workers=job["workers"])  # fmt: skip
    else:  # the same search for some queries only (find_duplicates always queries everything)
        found = HashEval(encoding, queries, DHash.hamming_distance, verbose=False, threshold=job["k"],
                         search_method=job["method"], num_dist_workers=job["workers"]).retrieve_results(scores=True)  # fmt: skip
    wall = time.perf_counter() - t0
    pairs = sorted({(min(int(q), int(f)), max(int(q), int(f))) for q, hits in found.items() for f, _ in hits})
    np.save(job["out"], np.asarray(pairs, dtype=np.int64).reshape(-1, 2))
    return {"wall_s": wall, "pairs": len(pairs), "queries": len(queries),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # fmt: skip


def encode(job: dict) -> dict:
    DHash, _ = _import_hashing()
    hasher = DHash(verbose=False)
    return {"hashes": [hasher.encode_image(image_file=path) for path in job["files"]]}


if __name__ == "__main__":
    mode, job_file = sys.argv[1], sys.argv[2]
    with open(job_file) as f:
        job = json.load(f)
    print(json.dumps({"search": search, "encode": encode}[mode](job)))
