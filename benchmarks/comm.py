"""Gradient communication: all-reduce bandwidth, bytes and step time per compression mode.

Three measurements on N ranks (default 2, gloo on CPU; ``--backend nccl`` on GPUs):

1. all-reduce algorithm bandwidth (payload bytes / time) for 1-100 MB float32 tensors, with
   torch's ``dist.all_reduce`` next to ``rankwise.distributed.all_reduce`` (the wrapper a
   rankwise user calls) and a bf16 tensor of the same element count;
2. a wide MLP (784-2048-2048-10, 5.8 M parameters): payload bytes all-reduced per step and
   step time for plain torch DDP (the baseline a user would otherwise write) and rankwise's
   DDP with no compression, fp16, bf16 and PowerSGD;
3. accuracy on a real task (scikit-learn's digits, upsampled to 28x28 so the same MLP
   applies): plain DDP against each compression mode, same seeds and data order.

Prints tables and writes ``benchmarks/out/comm.json``::

    python benchmarks/comm.py                 # everything, 2 gloo ranks
    python benchmarks/comm.py --quick         # smaller sizes and fewer epochs
    python benchmarks/comm.py --backend nccl --autocast bf16    # on a GPU machine
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import rankwise.distributed as rd
import rankwise.parallel as rp
from rankwise.testing import run_distributed

MODES: list[tuple[str, dict[str, Any] | None]] = [
    ("torch DDP (baseline)", None),
    ("rankwise none", {"compression": None, "count_bytes": True}),
    ("rankwise fp16", {"compression": "fp16"}),
    ("rankwise bf16", {"compression": "bf16"}),
    ("rankwise powersgd r=1", {"compression": "powersgd", "powersgd_rank": 1}),
    ("rankwise powersgd r=4", {"compression": "powersgd", "powersgd_rank": 4}),
]


ACC_START_ITER = 10  # PowerSGD's plain all-reduce steps before compressing, in the accuracy run


def wide_mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
    )


def _sync() -> None:
    if rd.device().type == "cuda":
        torch.cuda.synchronize()


def _wrap(cfg: dict[str, Any] | None, start_iter: int) -> nn.Module:
    model = wide_mlp().to(rd.device())
    if cfg is None:  # what a user writes without rankwise
        device_ids = [rd.device().index] if rd.device().type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    return rp.wrap_model(model, rp.DDPConfig(powersgd_start_iter=start_iter, **cfg))


# -- 1. all-reduce bandwidth -------------------------------------------------------------------


def bandwidth(sizes_mb: list[float], reps: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for size in sizes_mb:
        numel = int(size * 1e6 / 4)
        for label, dtype, call in [
            ("torch dist.all_reduce fp32", torch.float32, lambda t: dist.all_reduce(t)),
            ("rankwise all_reduce fp32", torch.float32, lambda t: rd.all_reduce(t, "mean")),
            ("torch dist.all_reduce bf16", torch.bfloat16, lambda t: dist.all_reduce(t)),
        ]:
            t = torch.ones(numel, dtype=dtype, device=rd.device())
            call(t)  # warm-up: connection set-up and allocation
            times = []
            for _ in range(reps):
                dist.barrier()
                _sync()
                start = time.perf_counter()
                call(t)
                _sync()
                times.append(time.perf_counter() - start)
            seconds = statistics.median(times)
            payload = numel * t.element_size()
            rows.append(
                {
                    "size_mb": size,
                    "op": label,
                    "payload_mb": payload / 1e6,
                    "ms": 1e3 * seconds,
                    "algbw_gbps": payload / seconds / 1e9,
                }
            )
    return rows


# -- 2. bytes and step time on the wide MLP ----------------------------------------------------


def step_times(steps: int, batch: int, autocast: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    precision = rp.Precision(autocast)
    g = torch.Generator().manual_seed(rd.get_rank())
    x = torch.randn(batch, 784, generator=g).to(rd.device())
    y = torch.randint(0, 10, (batch,), generator=g).to(rd.device())
    warmup = 3
    for label, cfg in MODES:
        model = _wrap(cfg, start_iter=2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        times = []
        stats = rp.comm_stats(model)
        for step in range(warmup + steps):
            if step == warmup and stats is not None:
                stats.reset()  # PowerSGD compresses from here on
            _sync()
            start = time.perf_counter()
            with precision.autocast():
                loss = nn.functional.cross_entropy(model(x).float(), y)
            precision.backward(loss)
            precision.step(optimizer)
            optimizer.zero_grad()
            _sync()
            times.append(time.perf_counter() - start)
        rows.append(
            {
                "mode": label,
                "bytes_per_step": stats.bytes_per_step if stats is not None else None,
                "step_ms": 1e3 * statistics.median(times[warmup:]),
            }
        )
        del model, optimizer
    plain = next(r for r in rows if r["mode"] == "rankwise none")["bytes_per_step"]
    for row in rows:
        row["bytes_per_step"] = row["bytes_per_step"] or plain  # torch's built-in = same bytes
        row["reduction_x"] = plain / row["bytes_per_step"]
    return rows


# -- 3. accuracy on digits ---------------------------------------------------------------------


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = nn.functional.interpolate(images, size=(28, 28), mode="bilinear").flatten(1)
    x = (x - x.mean()) / x.std()
    y = torch.tensor(data.target)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    test, train = order[:360], order[360:]
    return x[train], y[train], x[test], y[test]


def accuracy(epochs: int, batch: int, autocast: str) -> list[dict[str, Any]]:
    x_train, y_train, x_test, y_test = digits()
    rank, world = rd.get_rank(), rd.get_world_size()
    precision = rp.Precision(autocast)
    rows: list[dict[str, Any]] = []
    for label, cfg in MODES:
        if label == "rankwise none":
            continue  # same arithmetic as the baseline
        model = _wrap(cfg, start_iter=ACC_START_ITER)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
        stats, step = rp.comm_stats(model), 0
        for epoch in range(epochs):
            order = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(epoch))
            shard = order[rank::world]  # strided split: rank r takes r, r+R, ...
            for i in range(0, len(shard) - batch + 1, batch):
                if step == ACC_START_ITER and stats is not None:
                    stats.reset()  # report the steady state, after PowerSGD's plain steps
                step += 1
                idx = shard[i : i + batch]
                with precision.autocast():
                    out = model(x_train[idx].to(rd.device()))
                    loss = nn.functional.cross_entropy(out.float(), y_train[idx].to(rd.device()))
                precision.backward(loss)
                precision.step(optimizer)
                optimizer.zero_grad()
        sent = stats.bytes_per_step if stats is not None else None
        model.eval()
        with torch.no_grad():
            pred = model(x_test.to(rd.device())).argmax(1).cpu()
        rows.append(
            {
                "mode": label,
                "test_accuracy": float((pred == y_test).float().mean()),
                "bytes_per_step": sent,
            }
        )
    return rows


# -- driver ------------------------------------------------------------------------------------


def rank_main(opts: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(opts["threads"])
    out: dict[str, Any] = {}
    out["bandwidth"] = bandwidth(opts["sizes"], opts["reps"])
    out["steps"] = step_times(opts["steps"], opts["batch"], opts["autocast"])
    out["accuracy"] = accuracy(opts["epochs"], opts["acc_batch"], opts["autocast"])
    return out


def table(rows: list[dict[str, Any]], cols: list[tuple[str, str, str]]) -> str:
    head = "| " + " | ".join(c[1] for c in cols) + " |"
    rule = "| " + " | ".join("---" for _ in cols) + " |"
    body = [
        "| " + " | ".join(format(r[k], f) if r[k] is not None else "-" for k, _, f in cols) + " |"
        for r in rows
    ]
    return "\n".join([head, rule, *body])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--autocast", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(Path(__file__).parent / "out" / "comm.json"))
    args = parser.parse_args()
    opts = {
        "sizes": [1, 10] if args.quick else [1, 4, 16, 64, 100],
        "reps": 3 if args.quick else 5,
        "steps": 5 if args.quick else 15,
        "batch": 64,
        "epochs": 2 if args.quick else 12,
        "acc_batch": 32,
        "autocast": args.autocast,
        "threads": args.threads,
    }
    started = time.time()
    results = run_distributed(
        rank_main, args.world, args=(opts,), backend=args.backend, timeout=3600, timeout_ms=600_000
    )
    rank0 = results[0]
    print(f"# all-reduce on {args.world} ranks ({args.backend})\n")
    print(
        table(
            rank0["bandwidth"],
            [
                ("size_mb", "tensor MB", "g"),
                ("op", "op", "s"),
                ("payload_mb", "payload MB", ".1f"),
                ("ms", "ms", ".1f"),
                ("algbw_gbps", "algbw GB/s", ".2f"),
            ],
        )
    )
    print(f"\n# wide MLP 784-2048-2048-10, batch {opts['batch']}/rank, autocast {args.autocast}\n")
    print(
        table(
            rank0["steps"],
            [
                ("mode", "mode", "s"),
                ("bytes_per_step", "bytes/step", ",.0f"),
                ("reduction_x", "fewer bytes (x)", ".1f"),
                ("step_ms", "step ms", ".1f"),
            ],
        )
    )
    print(f"\n# digits (28x28 upsampled), {opts['epochs']} epochs, test accuracy\n")
    print(
        table(
            rank0["accuracy"],
            [
                ("mode", "mode", "s"),
                ("test_accuracy", "accuracy", ".4f"),
                ("bytes_per_step", "bytes/step", ",.0f"),
            ],
        )
    )
    payload = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": platform.platform(),
        "torch": torch.__version__,
        "world": args.world,
        "backend": args.backend,
        "options": opts,
        "seconds": time.time() - started,
        "results": rank0,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {args.out} ({payload['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
