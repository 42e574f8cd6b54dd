"""Benchmark: time from process start to the first resumed batch, deep in an epoch.

A job restarts mid-epoch: how long until its first batch arrives at the saved position? Each
case is a fresh Python process (imports included), rank 0 of 8 replicas, batch 256, resumed at
a global position p of the epoch's order:

- ``rankwise``: a plain ``DataLoader`` over ``rankwise.data.DistributedSampler`` after
  ``load_state_dict`` (the sampler's state: ``consumed = p``).
- ``rankwise+torchdata``: torchdata's ``StatefulDataLoader`` over rankwise's sampler, loading a
  loader state at p (rankwise's pass iterator is ``Stateful``: no replay).
- ``torch+torchdata`` (the baseline a user would otherwise reach for): ``StatefulDataLoader``
  over torch's ``DistributedSampler``, which is not ``Stateful``, so torchdata fast-forwards by
  replaying p / 8 indices after torch materialises the epoch's order (``randperm(N).tolist()``).
  Capped by ``--timeout`` seconds and ``--memory-gib`` of address space; a capped case reports
  "> T s" or "out of memory".

The loader states at p are the states these loaders write after p / 8 indices (same keys and
counts), built directly so that the benchmark does not have to walk there first.

    python benchmarks/resume.py                       # N = 1e7 and 1e9 (a few minutes)
    python benchmarks/resume.py --sizes 1e9 --timeout 120

Prints a table and writes benchmarks/out/resume.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "out"
REPLICAS, RANK, BATCH, SEED, EPOCH = 8, 0, 256, 0, 0
IMPLS = ("rankwise", "rankwise+torchdata", "torch+torchdata")


def _loader_state(n: int, position: int, sampler: Any, rankwise: bool) -> dict[str, Any]:
    """The StatefulDataLoader state (num_workers=0) after ``position / REPLICAS`` indices."""
    per_rank = position // REPLICAS
    iter_state: dict[str, Any] = {"samples_yielded": per_rank}
    if rankwise:
        iter_state["sampler_state"] = sampler.state_dict()
        iter_state["sampler_iter_state"] = {**sampler.state_dict(), "consumed": position}
    return {
        "_IterableDataset_len_called": None,
        "_index_sampler_state": None,
        "_iterator_finished": False,
        "_num_yielded": per_rank // BATCH,
        "_sampler_iter_state": iter_state,
        "_sampler_iter_yielded": per_rank // BATCH,
        "_shared_seed": None,
        "dataset_state": None,
        "fetcher_state": None,
    }


def _worker(impl: str, n: int, position: int) -> dict[str, Any]:
    t_imports = time.perf_counter()
    import torch.utils.data as tud

    from rankwise.data import DistributedSampler, Permutation

    class Identity(tud.Dataset[int]):
        def __len__(self) -> int:
            return n

        def __getitem__(self, index: int) -> int:
            return index

    t0 = time.perf_counter()
    if impl == "rankwise":
        sampler = DistributedSampler(n, REPLICAS, RANK, seed=SEED)
        sampler.load_state_dict({**sampler.state_dict(), "consumed": position})
        loader: Any = tud.DataLoader(Identity(), batch_size=BATCH, sampler=sampler)
    else:
        import warnings

        from torchdata.stateful_dataloader import StatefulDataLoader

        warnings.filterwarnings("ignore", message=".*set_vital")
        rankwise = impl == "rankwise+torchdata"
        if rankwise:
            sampler = DistributedSampler(n, REPLICAS, RANK, seed=SEED)
        else:
            sampler = tud.DistributedSampler(range(n), REPLICAS, RANK, seed=SEED)
        loader = StatefulDataLoader(Identity(), batch_size=BATCH, sampler=sampler)
        loader.load_state_dict(_loader_state(n, position, sampler, rankwise))
    first = next(iter(loader)).tolist()
    seconds = time.perf_counter() - t0
    if impl != "torch+torchdata":  # the right samples: the order's positions p + r + R*j
        want = Permutation(n, SEED, EPOCH)[[position + RANK + REPLICAS * j for j in range(BATCH)]]
        assert first == want.tolist(), (impl, first[:4], want[:4].tolist())
    return {
        "resume_s": seconds,
        "imports_s": t0 - t_imports,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _run(impl: str, n: int, position: int, timeout: float, memory_gib: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", impl, str(n), str(position)]
    limit = int(memory_gib * 2**30)

    def cap() -> None:  # the baseline at N = 1e9 would otherwise take ~40 GB of a shared host
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, preexec_fn=cap, check=False
        )
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "total_s": None}
    total = time.perf_counter() - start
    if proc.returncode != 0:
        oom = "MemoryError" in proc.stderr or "alloc" in proc.stderr.lower()
        status = "out of memory" if oom else f"failed ({proc.stderr.strip().splitlines()[-1]})"
        return {"status": status, "total_s": None}
    return {"status": "ok", "total_s": total, **json.loads(proc.stdout.strip().splitlines()[-1])}


def _cell(res: dict[str, Any], timeout: float, memory_gib: float) -> str:
    if res["status"] == "timeout":
        return f"> {timeout:g} s"
    if res["status"] == "out of memory":
        return f"out of memory (> {memory_gib:g} GiB)"
    if res["status"] != "ok":
        return res["status"]
    return f"{res['total_s']:.2f} s ({res['resume_s']:.3f} s; {res['peak_rss_mib']:.0f} MiB)"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e7, 1e9])
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    parser.add_argument("--memory-gib", type=float, default=6.0, help="address-space cap")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        impl, n, position = args.worker[0], int(args.worker[1]), int(args.worker[2])
        print(json.dumps(_worker(impl, n, position)))
        return
    rows = []
    for n in (int(s) for s in args.sizes):
        fractions = (1e-3, 1e-2, 1e-1, 0.9) if n >= 10**9 else (1e-2, 1e-1, 0.9)
        for position in (int(n * f) // (REPLICAS * BATCH) * REPLICAS * BATCH for f in fractions):
            row: dict[str, Any] = {"N": n, "position": position}
            for impl in IMPLS:
                row[impl] = _run(impl, n, position, args.timeout, args.memory_gib)
            rows.append(row)
            print(
                f"N={n:.0e} p={position:.2e}  "
                + "  ".join(f"{i}: {_cell(row[i], args.timeout, args.memory_gib)}" for i in IMPLS),
                flush=True,
            )
    print(
        "\nTime from process start to the first resumed batch (in brackets: after imports; peak RSS)\n"
    )
    print("| N | position | " + " | ".join(IMPLS) + " |")
    print("|---|---|" + "---|" * len(IMPLS))
    for row in rows:
        cells = " | ".join(_cell(row[i], args.timeout, args.memory_gib) for i in IMPLS)
        print(f"| {row['N']:.0e} | {row['position']:.2e} | {cells} |")
    OUT.mkdir(exist_ok=True)
    meta = {
        "replicas": REPLICAS,
        "rank": RANK,
        "batch_size": BATCH,
        "timeout_s": args.timeout,
        "memory_cap_gib": args.memory_gib,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    (OUT / "resume.json").write_text(json.dumps({"meta": meta, "cases": rows}, indent=2))
    print(f"\nwrote {OUT / 'resume.json'}")


if __name__ == "__main__":
    main()
