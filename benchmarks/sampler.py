"""Benchmark: rankwise.data.DistributedSampler vs torch.utils.data.DistributedSampler.

One full epoch of rank 0's indices (shuffled, 8 replicas) per case, each case in a fresh
process so peak RSS is its own. Prints a table and writes benchmarks/out/sampler.json.

    python benchmarks/sampler.py                  # N = 1e6, 1e7 (a minute or so)
    python benchmarks/sampler.py --sizes 1e6 1e7 1e8   # the issue's full sizes
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _worker(impl: str, n: int, replicas: int) -> dict[str, float]:
    import torch.utils.data as tud

    import rankwise.data as rd

    floor = _rss_mib()  # torch + numpy + rankwise imported: the import floor
    t0 = time.perf_counter()
    if impl == "torch":
        sampler = tud.DistributedSampler(range(n), num_replicas=replicas, rank=0, shuffle=True)
    else:
        sampler = rd.DistributedSampler(n, num_replicas=replicas, rank=0, shuffle=True)
    sampler.set_epoch(1)
    collections.deque(iter(sampler), maxlen=0)  # consume the epoch as fast as Python can
    seconds = time.perf_counter() - t0
    count = len(sampler)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    assert count == -(-n // replicas), count
    return {
        "seconds": seconds,
        "peak_rss_mib": peak,
        "floor_mib": floor,
        "above_floor_mib": peak - floor,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7])
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--worker", nargs=2, metavar=("IMPL", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker[0], int(args.worker[1]), args.replicas)))
        return
    rows = []
    for n in (int(s) for s in args.sizes):
        case = {"N": n}
        for impl in ("torch", "rankwise"):
            cmd = [
                sys.executable,
                __file__,
                "--replicas",
                str(args.replicas),
                "--worker",
                impl,
                str(n),
            ]
            res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            case.update({f"{impl}_{k}": v for k, v in res.items()})
        case["speedup"] = case["torch_seconds"] / case["rankwise_seconds"]
        case["memory_ratio"] = case["torch_above_floor_mib"] / max(
            case["rankwise_above_floor_mib"], 1.0
        )
        rows.append(case)
        print(
            f"N={n:>11,}  torch {case['torch_seconds']:7.2f} s {case['torch_peak_rss_mib']:8.0f} MiB "
            f"(+{case['torch_above_floor_mib']:.0f})  rankwise {case['rankwise_seconds']:6.2f} s "
            f"{case['rankwise_peak_rss_mib']:6.0f} MiB (+{case['rankwise_above_floor_mib']:.0f})",
            flush=True,
        )
    print(
        "\n| N | torch s | torch peak RSS MiB (above import floor) | rankwise s | rankwise peak RSS MiB (above floor) | speedup | memory ratio (above floor) |"
    )
    print("|---|---|---|---|---|---|---|")
    for c in rows:
        print(
            f"| {c['N']:.0e} | {c['torch_seconds']:.2f} | {c['torch_peak_rss_mib']:.0f} (+{c['torch_above_floor_mib']:.0f}) "
            f"| {c['rankwise_seconds']:.2f} | {c['rankwise_peak_rss_mib']:.0f} (+{c['rankwise_above_floor_mib']:.0f}) "
            f"| {c['speedup']:.1f}x | {c['memory_ratio']:.0f}x |"
        )
    OUT.mkdir(exist_ok=True)
    meta = {
        "replicas": args.replicas,
        "rank": 0,
        "shuffle": True,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    (OUT / "sampler.json").write_text(json.dumps({"meta": meta, "cases": rows}, indent=2))
    print(f"\nwrote {OUT / 'sampler.json'}")


if __name__ == "__main__":
    main()
