"""Baseline: Hugging Face datasets' ImageFolder loader.

python bench/baselines/hf_imagefolder.py ROOT CACHE_DIR
  ->  {"files": N, "labels": L, "embedded_bytes": bool, "datasets": version}
Runs datasets.load_dataset("imagefolder", data_dir=ROOT, split="train") with a fresh, empty
cache_dir (the caller deletes it afterwards; HF_HOME/HF_DATASETS_CACHE should point into it too)
and offline, so each run really lists and reads the tree and writes its Arrow cache.
"""

import json
import os
import sys


def main() -> None:
    root, cache = sys.argv[1], sys.argv[2]
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.load_dataset("imagefolder", data_dir=root, cache_dir=cache, split="train")
    col = ds.data.column("image")
    first = col[0].as_py() if len(col) else None
    print(
        json.dumps(
            {
                "files": ds.num_rows,
                "labels": len(ds.features["label"].names) if "label" in ds.features else None,
                "embedded_bytes": bool(first and first.get("bytes")),
                "datasets": datasets.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
