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
  (temporary file, XXH3-128 while writing, fsync, atomic rename, manifest, pointer);
- ``rankwise save_async``: ``CheckpointManager.save_async``: blocked only while the tensors are
  copied; "durable after" is when the background write is fsynced and the pointer moved.

Loads (resume): ``torch.load`` vs ``rankwise load_file`` (checksum verify + ``torch.load``).

Inside ``fit`` (world of one, the same model and Adam, a step checkpoint every ``--every``
steps): the same run three ways, with no checkpoints, with background saves (the default) and
with ``async_checkpoints=False``; per save, the time the loop was blocked
(``trainer.checkpoint_stats``: state dict, copy, and any wait for the previous write) against a
plain ``torch.save`` of the same state in the same run, the time until durable, and the
run's wall time against the run with no checkpoints (what the writer thread costs the steps).

Object storage (``--object-storage``, or ``--object-storage-only``): the same model + Adam state
against a local S3 server (SeaweedFS ``weed mini``, started here by
``rankwise.testing.s3server`` on loopback), each round: a local ``torch.save`` of the state
(the baseline for the loop's hold), ``RemoteCheckpointManager.save_async`` (blocked: the
snapshot; durable: until data, manifest and pointer are in the bucket), a plain s3fs
``put_file`` of the same bytes (the baseline for durable), and a resume
(``RemoteCheckpointManager.load_latest``: download, verify, ``torch.load``).

Prints the tables and writes ``benchmarks/out/checkpoint.json``::

    python benchmarks/checkpoint.py                 # 5 rounds; fit: 48 steps, every 12
    python benchmarks/checkpoint.py --rounds 3 --dir /some/disk
    python benchmarks/checkpoint.py --quick         # small model, for a smoke run
    python benchmarks/checkpoint.py --object-storage-only --rounds 4
"""

from __future__ import annotations

import argparse
import datetime
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
import xxhash
from torch import nn

import rankwise.train.checkpoint as ck
from rankwise.train import DistributedTrainer, DistributedTrainingConfig

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
    xxhash.xxh3_128_hexdigest(data)
    sum_seconds = time.perf_counter() - t0  # the checksum's share of a save (and of a load)
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
        "checksum_in_memory_s": sum_seconds,
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
    print(f"  XXH3-128 of the bytes in memory: {result['checksum_in_memory_s']:.3f} s")


def _fit(width: int, steps: int, every: int, mode: str, root: Path) -> dict[str, Any]:
    """One fit of ``steps`` optimizer steps; ``mode``: "none", "background" or "synchronous"."""
    model, opt = _model(width)
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), opt)
    batch = 32
    g = torch.Generator().manual_seed(1)
    x = torch.randn(steps * batch, width // 4, generator=g)
    y = torch.randint(0, width // 4, (steps * batch,), generator=g)
    folder = root / f"fit-{mode}"
    shutil.rmtree(folder, ignore_errors=True)
    cfg = DistributedTrainingConfig(
        epochs=1,
        batch_size=batch,
        verbose=False,
        seed=0,
        checkpoint_dir=None if mode == "none" else str(folder),
        checkpoint_every_n_steps=every,
        checkpoint_every_n_epochs=0,
        keep_last_checkpoints=2,
        async_checkpoints=mode == "background",
    )
    t0 = time.perf_counter()
    trainer.fit(x, y, cfg)
    wall = time.perf_counter() - t0
    stats = trainer.checkpoint_stats
    row: dict[str, Any] = {"mode": mode, "wall_s": wall, "saves": 0}
    if stats is not None:
        # The first save allocates the copy's buffers; a long run saves many times.
        row.update(
            saves=stats.saves,
            blocked_per_save_s=stats.blocked_per_save,
            waits=stats.waits,
            waited_s=stats.waited_seconds,
            durable_after_s=statistics.median(stats.durable_after),
        )
        plain = []
        for _ in range(3):  # the baseline: a plain torch.save of this trainer's state
            state = trainer.state.state_dict()
            path = folder / "plain.pt"
            started = time.perf_counter()
            torch.save(state, path)
            plain.append(time.perf_counter() - started)
            path.unlink()
        row["torch_save_s"] = statistics.median(plain)
    shutil.rmtree(folder, ignore_errors=True)
    return row


def _fit_runs(width: int, steps: int, every: int, root: Path) -> list[dict[str, Any]]:
    rows = [_fit(width, steps, every, mode, root) for mode in ("none", "background", "synchronous")]
    base = rows[0]["wall_s"]
    print(f"\nInside fit: {steps} steps, a checkpoint every {every} (world of one)")
    print(
        f"{'saves':<14}{'wall s':>8}{'vs none':>9}{'blocked/save s':>16}{'vs torch.save':>15}"
        f"{'durable s':>11}{'waits':>7}"
    )
    for row in rows:
        line = f"{row['mode']:<14}{row['wall_s']:>8.2f}{row['wall_s'] / base:>8.2f}x"
        if row["saves"]:
            ratio = row["blocked_per_save_s"] / row["torch_save_s"]
            line += (
                f"{row['blocked_per_save_s']:>16.3f}{ratio:>14.2f}x"
                f"{row['durable_after_s']:>11.3f}{row['waits']:>7d}"
            )
        print(line)
    saved = [r for r in rows if r["saves"]]
    print(f"  plain torch.save of the same state: {saved[0]['torch_save_s']:.3f} s (median of 3)")
    return rows


def _object_storage(width: int, rounds: int, root: Path) -> dict[str, Any]:
    """The object-storage rows (see the module): medians over the rounds after the first."""
    import s3fs

    from rankwise.testing.s3server import start_server

    server = start_server(root / "s3")
    try:
        options = {"endpoint_url": server.endpoint, "key": "bench", "secret": "bench-secret"}
        plain = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        plain.mkdir("bench")
        model, opt = _model(width)
        manager = ck.RemoteCheckpointManager(
            ck.Storage.for_url("s3://bench/rankwise", options), keep_last=1
        )
        manager.start()
        local = root / "local"
        local.mkdir(parents=True, exist_ok=True)
        rows: dict[str, list[float]] = {}

        def add(name: str, seconds: float) -> None:
            rows.setdefault(name, []).append(seconds)

        for step in range(1, rounds + 1):
            path = local / f"torch-{step}.pt"
            t0 = time.perf_counter()
            torch.save(_torch_state(model, opt, True), path)
            add("torch.save (local disk)", time.perf_counter() - t0)
            size = path.stat().st_size
            os.sync()
            t0 = time.perf_counter()
            plain.put_file(str(path), f"bench/plain/state-{step}.pt")
            add("s3fs put_file (same bytes)", time.perf_counter() - t0)
            path.unlink()
            t0 = time.perf_counter()
            pending = manager.save_async(_rankwise_state(model, opt, True), epoch=0, step=step)
            add("save_async: loop held", time.perf_counter() - t0)
            pending.result()
            add("save_async: durable in the bucket", time.perf_counter() - t0)
            t0 = time.perf_counter()
            found = manager.load_latest()
            add("resume from the bucket (load_latest)", time.perf_counter() - t0)
            assert found is not None and found[0].endswith(f"s{step:09d}.pt")
        medians = {name: statistics.median(v[1:] or v) for name, v in rows.items()}
        return {"bytes": size, "rounds": rows, "median_s": medians}
    finally:
        server.stop()


def _print_object_storage(result: dict[str, Any]) -> None:
    m = result["median_s"]
    print(f"\nobject storage (local SeaweedFS), model + Adam, {result['bytes'] / MB:.0f} MB")
    print(f"{'':<40}{'median s':>10}{'ratio':>9}")
    held = m["save_async: loop held"] / m["torch.save (local disk)"]
    durable = m["save_async: durable in the bucket"] / m["s3fs put_file (same bytes)"]
    ratios = {
        "save_async: loop held": f"{held:.2f}x torch.save",
        "save_async: durable in the bucket": f"{durable:.2f}x s3fs put",
    }
    for name, seconds in m.items():
        print(f"{name:<40}{seconds:>10.3f}  {ratios.get(name, '')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=4096, help="hidden width (4096: 25.2M)")
    parser.add_argument("--dir", default=str(OUT / "checkpoint-tmp"), help="a folder on disk")
    parser.add_argument("--out", default=str(OUT / "checkpoint.json"))
    parser.add_argument("--fit-steps", type=int, default=48, help="optimizer steps in the fit runs")
    parser.add_argument("--every", type=int, default=12, help="a checkpoint every N fit steps")
    parser.add_argument("--quick", action="store_true", help="width 1024, 2 rounds, 12 steps")
    parser.add_argument("--object-storage", action="store_true", help="add the S3 rows")
    parser.add_argument("--object-storage-only", action="store_true", help="only the S3 rows")
    args = parser.parse_args()
    if args.quick:
        args.width, args.rounds, args.fit_steps, args.every = 1024, 2, 12, 4
    torch.set_num_threads(1)
    root = Path(args.dir)
    results = []
    fit_rows: list[dict[str, Any]] = []
    remote: dict[str, Any] | None = None
    try:
        if not args.object_storage_only:
            for payload, full in (("model", False), ("model + Adam", True)):
                result = _run(payload, full, args.width, args.rounds, root)
                _print(result)
                results.append(result)
            fit_rows = _fit_runs(args.width, args.fit_steps, args.every, root)
        if args.object_storage or args.object_storage_only:
            remote = _object_storage(args.width, args.rounds, root)
            _print_object_storage(remote)
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
    Path(args.out).write_text(
        json.dumps(
            {"meta": meta, "results": results, "fit": fit_rows, "object_storage": remote},
            indent=2,
        )
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
