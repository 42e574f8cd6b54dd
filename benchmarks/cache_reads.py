"""Benchmark: a warm-cache FetchDataset epoch of a dense ``.npy`` against the local mmap, in
one process (no DataLoader workers), so what is timed is the read path alone: every range a
cache hit (``rankwise.data.cache.PlanCache``) against ``np.load(mmap_mode="r")`` page-cached.

Writes a dense float32 ``.npy`` (default 25,600 x 1,024, 100 MiB; 1 MiB blocks of 256 rows, as
benchmarks/streaming.py) under benchmarks/out/cache_reads/, fills the cache with an untimed
epoch 0, then times epochs 1.. of each reader in turn, ``--repeats`` rounds. The cached readers:

- ``rankwise, warm cache``: cached ranges read from disk straight into the fetch's buffer
  (``PlanCache.read_joined``), parsed without another join;
- ``rankwise, warm cache, pieces``: each range its own view, joined by the parse (what a
  Parquet or sharded source takes).

Prints a table, writes benchmarks/out/cache_reads.json.

    python benchmarks/cache_reads.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_header import run_header

OUT = Path(__file__).resolve().parent / "out"


def main() -> None:
    from rankwise.data import BlockShuffling, FetchDataset

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=25_600)
    parser.add_argument("--cols", type=int, default=1_024)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    folder = OUT / "cache_reads"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"dense-{args.rows}x{args.cols}.npy"
    if not path.exists():
        np.save(path, np.random.default_rng(0).random((args.rows, args.cols), dtype=np.float32))
    old = time.time_ns() - 86_400 * 10**9  # an old file: its version tag holds across opens
    os.utime(path, ns=(old, old))
    kw: dict[str, Any] = {"batch_size": args.block, "fetch_factor": 4, "rank": 0, "world_size": 1}
    strategy = BlockShuffling(block_size=args.block)
    cache = {"cache_dir": str(folder / "cache"), "cache_bytes": 2 * path.stat().st_size}

    def epoch(ds: FetchDataset, number: int) -> float:
        ds.set_epoch(number)
        started = time.perf_counter()
        for _ in ds:
            pass
        return time.perf_counter() - started

    epoch(FetchDataset(str(path), strategy, **kw, **cache), 0)  # fills the cache
    readers = ["local mmap (np.load(mmap_mode='r'))", "rankwise, warm cache"]
    readers.append("rankwise, warm cache, pieces")
    times: dict[str, list[float]] = {name: [] for name in readers}
    for r in range(args.repeats):
        for name in readers:
            if name.startswith("local"):
                ds = FetchDataset(np.load(path, mmap_mode="r"), strategy, **kw)
            else:
                ds = FetchDataset(str(path), strategy, **kw, **cache)
                ds.source.joins_pieces = not name.endswith("pieces")
            times[name].append(epoch(ds, 1 + r))
            if not name.startswith("local"):
                assert ds.cache is not None and ds.cache.hits > 0
    base = min(times[readers[0]])
    rows = []
    print("| reader | best epoch s | median s | x local |")
    print("| --- | ---: | ---: | ---: |")
    for name in readers:
        best, median = min(times[name]), sorted(times[name])[len(times[name]) // 2]
        rows.append({"reader": name, "best_s": round(best, 4), "median_s": round(median, 4)})
        rows[-1]["vs_local"] = round(base / best, 2)
        print(f"| {name} | {best:.3f} | {median:.3f} | {base / best:.2f} |")
    result = run_header(load=os.getloadavg(), rows=args.rows, cols=args.cols, results=rows)
    (OUT / "cache_reads.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
