"""Benchmark: how long one checkpoint save blocks the training loop, and the bytes written per s.

An MLP of about 25M fp32 parameters (about 100 MB) after one Adam step, so model + Adam state
is about 300 MB. Two payloads: the model alone, and model + optimizer (+ RNG). Each round writes
every case once, in turn, to a new file on the same disk (``--dir``), with ``os.sync()``
between cases so no case pays for another's dirty pages; the table shows medians over the
rounds after the first (a run saves many times; the first save_async allocates its buffers,
see ``first_round_blocked_s`` in the JSON).

- ``torch.save``: what a user writes, ``torch.save({...state_dict()...}, path)``: no fsync, no
  checksum, not atomic (a kill mid-write leaves a torn file under the final name);
- ``torch.save+fsync``: the same, fsynced: the price of durability in torch alone;
- ``rankwise save``: ``CheckpointManager.save`` with ``model_state_dict`` / ``optimizer_state_dict``
  (temporary file, SHA-256 while writing, fsync, atomic rename, manifest, pointer);
- ``rankwise save_async``: ``CheckpointManager.save_async``: blocked only while the tensors are
  copied; "durable after" is when the background write is fsynced and the pointer moved.

Loads (resume): ``torch.load`` vs ``rankwise load_file`` (SHA-256 verify + ``torch.load``).
Prints a table and writes ``benchmarks/out/checkpoint.json``::

    python benchmarks/checkpoint.py                 # 5 rounds
    python benchmarks/checkpoint.py --rounds 3 --dir /some/disk
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import rankwise.train.checkpoint as ck

OUT = Path(__file__).resolve().parent / "out"
MB = 1e6


def _model(width: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(width // 4, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, width // 4),
    )  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(8, width // 4)).square().mean().backward()
    optimizer.step()  # Adam's two moments now exist: 3x the parameter bytes in all
    optimizer.zero_grad()
    return model, optimizer


def _torch_state(model: nn.Module, opt: torch.optim.Optimizer, full: bool) -> dict[str, Any]:
    state: dict[str, Any] = {"model": model.state_dict()}
    if full:
        state["optimizer"] = opt.state_dict()
    return state


def _rankwise_state(model: nn.Module, opt: torch.optim.Optimizer, full: bool) -> dict[str, Any]:
    state: dict[str, Any] = {"format": ck.FORMAT_VERSION, "model": ck.model_state_dict(model)}
    if full:
        state["optimizer"] = ck.optimizer_state_dict(model, opt)
        state["rng"] = ck.rng_state()
    return state


def _cases(
    model: nn.Module, opt: torch.optim.Optimizer, full: bool, root: Path
) -> dict[str, Callable[[int], tuple[float, float, Path]]]:
    """name -> run(round) returning (blocked s, durable-after s, file written). The managers
    live for the whole run, as in training (save_async reuses its CPU copy's memory)."""
    folders = {}
    for name in ("torch", "fsync", "rankwise", "async"):
        folders[name] = root / name
        shutil.rmtree(folders[name], ignore_errors=True)
        folders[name].mkdir(parents=True)
    manager = ck.CheckpointManager(folders["rankwise"], keep_last=1)
    async_manager = ck.CheckpointManager(folders["async"], keep_last=1)

    def plain(_: int) -> tuple[float, float, Path]:
        path = folders["torch"] / "model.pt"  # overwritten each round, as a user's would be
        t0 = time.perf_counter()
        torch.save(_torch_state(model, opt, full), path)
        t = time.perf_counter() - t0
        return t, t, path

    def fsynced(_: int) -> tuple[float, float, Path]:
        path = folders["fsync"] / "model.pt"
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(_torch_state(model, opt, full), f)
            f.flush()
            os.fsync(f.fileno())
        t = time.perf_counter() - t0
        return t, t, path

    def rankwise(step: int) -> tuple[float, float, Path]:
        t0 = time.perf_counter()
        path = manager.save(_rankwise_state(model, opt, full), epoch=0, step=step)
        t = time.perf_counter() - t0
        return t, t, path

    def rankwise_async(step: int) -> tuple[float, float, Path]:
        t0 = time.perf_counter()
        async_manager.save_async(_rankwise_state(model, opt, full), epoch=0, step=step)
        blocked = time.perf_counter() - t0
        path = async_manager.wait()
        assert path is not None
        return blocked, time.perf_counter() - t0, path

    return {
        "torch.save": plain,
        "torch.save+fsync": fsynced,
        "rankwise save": rankwise,
        "rankwise save_async": rankwise_async,
    }


def _loads(path_torch: Path, path_rankwise: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    torch.load(path_torch, map_location="cpu", weights_only=True)
    t1 = time.perf_counter()
    ck.load_file(path_rankwise)
    t2 = time.perf_counter()
    return {"torch.load": t1 - t0, "rankwise load_file": t2 - t1}


def _run(payload: str, full: bool, width: int, rounds: int, root: Path) -> dict[str, Any]:
    model, opt = _model(width)
    cases = _cases(model, opt, full, root)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    loads: dict[str, list[float]] = {"torch.load": [], "rankwise load_file": []}
    sizes: dict[str, int] = {}
    for step in range(rounds):
        written: dict[str, Path] = {}
        for name, run in cases.items():
            os.sync()
            blocked, durable, path = run(step)
            samples[name].append((blocked, durable))
            sizes[name] = path.stat().st_size
            written[name] = path
        os.sync()
        for name, seconds in _loads(written["torch.save"], written["rankwise save"]).items():
            loads[name].append(seconds)
    data = written["torch.save"].read_bytes()
    t0 = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    sha_seconds = time.perf_counter() - t0  # the checksum's share of a save (and of a load)
    params = sum(p.numel() for p in model.parameters())
    rows = []
    for name, pairs in samples.items():
        # The first round allocates (the async copy's buffers); training saves many times.
        steady = pairs[1:] or pairs
        blocked = statistics.median(b for b, _ in steady)
        durable = statistics.median(d for _, d in steady)
        rows.append(
            {
                "case": name,
                "blocked_s": blocked,
                "durable_after_s": durable if name != "torch.save" else None,
                "file_mb": sizes[name] / MB,
                "mb_per_s_blocked": sizes[name] / MB / blocked,
                "mb_per_s_written": sizes[name] / MB / durable,
                "first_round_blocked_s": pairs[0][0],
                "all_rounds": pairs,
            }
        )
    load_rows = [{"case": k, "seconds": statistics.median(v)} for k, v in loads.items()]
    return {
        "payload": payload,
        "params": params,
        "rows": rows,
        "loads": load_rows,
        "sha256_in_memory_s": sha_seconds,
    }


def _print(result: dict[str, Any]) -> None:
    base = result["rows"][0]["blocked_s"]
    print(f"\n{result['payload']}: {result['params'] / 1e6:.1f}M parameters")
    print(
        f"{'case':<22}{'file MB':>9}{'blocked s':>11}{'vs torch':>10}{'durable s':>11}{'MB/s':>8}"
    )
    for row in result["rows"]:
        durable = row["durable_after_s"]
        print(
            f"{row['case']:<22}{row['file_mb']:>9.1f}{row['blocked_s']:>11.3f}"
            f"{row['blocked_s'] / base:>9.2f}x"
            f"{(f'{durable:.3f}' if durable is not None else 'never'):>11}"
            f"{row['mb_per_s_written']:>8.0f}"
        )
    for row in result["loads"]:
        print(f"  load: {row['case']:<20}{row['seconds']:>8.3f} s")
    print(f"  SHA-256 of the bytes in memory: {result['sha256_in_memory_s']:.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=4096, help="hidden width (4096: 25.2M)")
    parser.add_argument("--dir", default=str(OUT / "checkpoint-tmp"), help="a folder on disk")
    parser.add_argument("--out", default=str(OUT / "checkpoint.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = Path(args.dir)
    results = []
    try:
        for payload, full in (("model", False), ("model + Adam", True)):
            result = _run(payload, full, args.width, args.rounds, root)
            _print(result)
            results.append(result)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.platform()}",
        "torch": torch.__version__,
        "rounds": args.rounds,
        "dir": str(root),
    }
    Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
