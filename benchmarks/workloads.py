"""Real models at full speed: the trainer against a hand-written DDP loop, Fabric and Accelerate.

Two realistic workloads, written in ``rankwise.models`` from ``torch.nn`` only:

- ``gpt``: a GPT-2-layout decoder LM, 6 layers, d 384, 6 heads, context 256, vocabulary 8192
  (13.9 M parameters), AdamW; synthetic tokens from a noisy affine recurrence (learnable, so the
  loss falls and its agreement means something); throughput in tokens/s, MFU with
  ``--peak-tflops``;
- ``resnet``: ResNet-18 on 32x32 images (11.2 M parameters), SGD with momentum and weight
  decay; synthetic images whose mean depends on the class; throughput in images/s.

Shapes per rank: on CUDA, GPT batch 32 x 256 tokens and ResNet batch 256, 60 steps (10 of
warm-up); on CPU, sized for a shared 2-core machine, batch 2 x 256 tokens and 8 images, 6 steps
(2 of warm-up); ``--quick``: a 2-layer GPT (d 128, 4 heads, context 64, vocabulary 2048, batch
8) and ResNet-18 at width 8 (batch 16), 8 steps (2 of warm-up).

Each is trained by four implementations, eager and compiled, in a world of one (one plain
process) and on 2 ranks (``rankwise launch``; gloo on CPU, NCCL on CUDA):

- ``ddp loop`` (the baseline): what a user writes: DataLoader over a TensorDataset with
  rankwise's DistributedSampler, DDP on more than one rank, zero_grad / forward / backward /
  step; compiled: ``torch.compile`` of the DDP-wrapped model (torch's recommended order);
- ``rankwise trainer``: ``DistributedTrainer.fit(x, y, config)``; compiled: ``compile=True``
  (the row says n/a on a branch where DistributedTrainingConfig has no ``compile`` field);
- ``Lightning Fabric``: ``fabric.setup`` of the model; compiled: ``fabric.setup`` of
  ``torch.compile(model)`` (Fabric re-applies the compile over its DDP wrapper);
- ``HF Accelerate``: ``accelerator.prepare``; compiled: ``Accelerator(dynamo_backend=...)``.

All four start from the same weights (seed 0) and see the same data in the same order
(sampler seed 42, the same per-rank batch, one pass over ``steps x world x batch`` samples).
Per run: the median gap between optimizer steps after the warm-up steps (a step post-hook,
identical for all; on CUDA, where the host runs ahead, the time from a synchronised device at
the end of warm-up to its last kernel, over the steps in between), as wall time and as the main
thread's CPU time (``time.thread_time``: no wait for the peer, no time lent to other jobs); the
time from the start of set-up to the first optimizer step; the final loss on a fixed held-out
batch on rank 0 (eager, except for the trainer's compiled runs: it compiles the module in
place), and its difference from the loop's; the largest weight difference from the loop's.
An untimed run of the loop per mode comes first, so no implementation pays the process's first
compile. Implementations run in rounds in a rotating order; per round the loop's time over
each one's gives a ratio, and the table shows the median of those ratios with their min-max
(load that comes and goes hits a round alike). ``--fixed-malloc`` fixes glibc's malloc
thresholds in every rank (see FIXED_MALLOC; ``benchmarks/workloads_profile.py`` measures why).

    python benchmarks/workloads.py --quick                 # small shapes, 1 round (~2 min)
    python benchmarks/workloads.py --rounds 2              # full shapes on CPU (~25 min)
    python benchmarks/workloads.py --device cuda --bf16 --worlds 1 --peak-tflops 989
                                   # one H100 (dense bf16 peak 989 TFLOP/s); --worlds 1 2 on 2+ GPUs

Writes ``benchmarks/out/workloads.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from run_header import run_header  # beside this file
from torch import nn

from rankwise.models import GPT, GPTConfig, lm_loss, resnet18_cifar

IMPLS = {
    "loop": "ddp loop",
    "trainer": "rankwise trainer",
    "fabric": "Lightning Fabric",
    "accelerate": "HF Accelerate",
}
MODES = ("eager", "compiled")
# glibc's malloc serves large blocks with mmap below a threshold it moves at run time, and trims
# the heap's free top; depending on the allocation history, the backward's multi-MB buffers then
# come back as fresh pages every step (1,000-2,000 page faults, 1-4 ms per step on the quick GPT,
# in some runs and not others). Fixed thresholds keep them in the heap (--fixed-malloc).
FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(128 << 20)}


# -- the workloads ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    batch: int  # per rank
    steps: int  # optimizer steps per run, warm-up included
    warmup: int
    gpt: GPTConfig | None = None
    width: int = 64  # ResNet-18's first stage
    unit: str = "images"

    def items_per_sample(self) -> int:
        return self.gpt.context if self.gpt else 1


def workload(name: str, quick: bool, device: str) -> Workload:
    gpu = device != "cpu"
    if name == "gpt":
        if quick:
            cfg = GPTConfig(vocab=2048, context=64, n_layer=2, n_head=4, d_model=128)
            return Workload("gpt", 8, 8, 2, gpt=cfg, unit="tokens")
        return Workload(
            "gpt",
            32 if gpu else 2,
            60 if gpu else 6,
            10 if gpu else 2,
            gpt=GPTConfig(),
            unit="tokens",
        )
    if quick:
        return Workload("resnet", 16, 8, 2, width=8)
    return Workload("resnet", 256 if gpu else 8, 60 if gpu else 6, 10 if gpu else 2)


def make_model(w: Workload) -> nn.Module:
    torch.manual_seed(0)
    return GPT(w.gpt) if w.gpt else resnet18_cifar(num_classes=10, width=w.width)


def make_data(w: Workload, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` training samples and, after them, one held-out batch (the same on every rank)."""
    g = torch.Generator().manual_seed(1)
    if w.gpt:
        # t[i+1] = (5 t[i] + 3 + noise) mod V, noise in 0..3: a loss floor of about log(4).
        v, t = w.gpt.vocab, w.gpt.context
        tokens = torch.empty(n, t + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, v, (n,), generator=g)
        noise = torch.randint(0, 4, (n, t), generator=g)
        for i in range(t):
            tokens[:, i + 1] = (5 * tokens[:, i] + 3 + noise[:, i]) % v
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    y = torch.randint(0, 10, (n,), generator=g)
    patterns = torch.randn(10, 3, 32, 32, generator=g)
    return torch.randn(n, 3, 32, 32, generator=g) + 0.5 * patterns[y], y


def loss_fn(w: Workload) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    return lm_loss if w.gpt else nn.functional.cross_entropy


def make_optimizer(w: Workload, params: Any) -> torch.optim.Optimizer:
    if w.gpt:
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=5e-4)


# -- one run of one implementation --------------------------------------------------------------


@dataclasses.dataclass
class Run:
    """What an implementation needs; ``stamps`` collects (wall, thread CPU) per step."""

    w: Workload
    x: torch.Tensor
    y: torch.Tensor
    compiled: bool
    device: torch.device
    bf16: bool
    stamps: list[tuple[float, float]] = dataclasses.field(default_factory=list)

    def stamp(self, optimizer: torch.optim.Optimizer) -> None:
        def hook(*_: Any) -> None:
            if self.device.type == "cuda" and len(self.stamps) == self.w.warmup - 1:
                torch.cuda.synchronize()  # the timed window starts with an idle device
            self.stamps.append((time.perf_counter(), time.thread_time()))

        optimizer.register_step_post_hook(hook)

    def loader(self) -> tuple[Any, Any]:
        from torch.utils.data import DataLoader, TensorDataset

        from rankwise.data import DistributedSampler

        sampler = DistributedSampler(len(self.x), shuffle=True, seed=42)
        loader = DataLoader(TensorDataset(self.x, self.y), batch_size=self.w.batch, sampler=sampler)
        return sampler, loader

    def autocast(self) -> Any:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)


def _loop(run: Run, model: nn.Module) -> None:
    import rankwise.distributed as rd

    model.to(run.device)
    net: nn.Module = model
    if rd.get_world_size() > 1:
        ids = [run.device.index] if run.device.type == "cuda" else None
        net = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    if run.compiled:
        net = torch.compile(net)  # type: ignore[assignment]
    optimizer = make_optimizer(run.w, model.parameters())
    run.stamp(optimizer)
    criterion = loss_fn(run.w)
    sampler, loader = run.loader()
    sampler.set_epoch(0)
    for xb, yb in loader:
        xb, yb = xb.to(run.device, non_blocking=True), yb.to(run.device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with run.autocast():
            loss = criterion(net(xb), yb)
        loss.backward()
        optimizer.step()


def trainer_compiles() -> bool:
    from rankwise.train import DistributedTrainingConfig

    return "compile" in {f.name for f in dataclasses.fields(DistributedTrainingConfig)}


def _trainer(run: Run, model: nn.Module) -> None:
    from rankwise.train import DistributedTrainer, DistributedTrainingConfig

    optimizer = make_optimizer(run.w, model.parameters())
    run.stamp(optimizer)
    extra = {"compile": True} if run.compiled else {}
    cfg = DistributedTrainingConfig(
        epochs=1,
        batch_size=run.w.batch,
        verbose=False,
        checkpoint_dir=None,
        seed=42,
        precision="bf16" if run.bf16 else "fp32",
        **extra,
    )
    DistributedTrainer(model, loss_fn(run.w), optimizer, device=run.device).fit(run.x, run.y, cfg)


def _fabric(run: Run, model: nn.Module) -> None:
    from lightning_fabric import Fabric

    import rankwise.distributed as rd

    world = rd.get_world_size()
    fabric = Fabric(
        accelerator=run.device.type,
        devices=world,
        strategy="ddp" if world > 1 else "auto",
        precision="bf16-mixed" if run.bf16 else "32-true",
    )
    fabric.launch()
    optimizer = make_optimizer(run.w, model.parameters())
    net, optimizer = fabric.setup(torch.compile(model) if run.compiled else model, optimizer)
    run.stamp(optimizer.optimizer)
    criterion = loss_fn(run.w)
    sampler, loader = run.loader()  # already sharded: not re-set-up
    sampler.set_epoch(0)
    for xb, yb in loader:
        xb, yb = fabric.to_device((xb, yb))
        optimizer.zero_grad(set_to_none=True)
        fabric.backward(criterion(net(xb), yb))
        optimizer.step()


def _accelerate(run: Run, model: nn.Module) -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    # Accelerate keeps one state per process and ignores a later Accelerator's settings (its
    # dynamo_backend included): without the reset, a compiled run after an eager one is eager.
    AcceleratorState._reset_state()
    accelerator = Accelerator(
        cpu=run.device.type == "cpu",
        mixed_precision="bf16" if run.bf16 else "no",
        dynamo_backend="inductor" if run.compiled else "no",
    )
    optimizer = make_optimizer(run.w, model.parameters())
    net, optimizer = accelerator.prepare(model, optimizer)
    run.stamp(optimizer.optimizer)
    criterion = loss_fn(run.w)
    sampler, loader = run.loader()  # already sharded: not re-prepared
    sampler.set_epoch(0)
    for xb, yb in loader:
        xb, yb = xb.to(accelerator.device), yb.to(accelerator.device)
        optimizer.zero_grad(set_to_none=True)
        accelerator.backward(criterion(net(xb), yb))
        optimizer.step()


RUNNERS: dict[str, Callable[[Run, nn.Module], None]] = {
    "loop": _loop,
    "trainer": _trainer,
    "fabric": _fabric,
    "accelerate": _accelerate,
}


def worker(args: argparse.Namespace) -> None:
    """Per workload, every (mode, implementation) ``rounds`` times in a rotating order, in this
    process (or process pair, sharing the group): load changes hit all of them alike."""
    import rankwise.distributed as rd

    torch.set_num_threads(1)
    rd.init()
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", rd.get_local_rank())
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    out = {
        name: one_workload(args, workload(name, args.quick, args.device), device)
        for name in args.workloads
    }
    if rd.get_rank() == 0:
        torch.save(out, args.out)


def one_workload(args: argparse.Namespace, w: Workload, device: torch.device) -> dict[str, Any]:
    import rankwise.distributed as rd

    world = rd.get_world_size()
    x, y = make_data(w, w.steps * world * w.batch + w.batch)
    (x, x_eval), (y, y_eval) = x.split(len(x) - w.batch), y.split(len(y) - w.batch)
    impls = [i for i in IMPLS if i in args.impls]
    modes = [m for m in MODES if m in args.modes]
    results: dict[str, Any] = {"warm-up": {}}
    for mode in modes:  # untimed: the process's first steps (and first compile) are no one's
        n = 2 * world * w.batch
        run = Run(w, x[:n], y[:n], mode == "compiled", device, args.bf16)
        start = time.perf_counter()
        _loop(run, make_model(w))
        results["warm-up"][mode] = run.stamps[0][0] - start
    for r in range(args.rounds):
        for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
            for impl in impls[r % len(impls) :] + impls[: r % len(impls)]:
                entry = results.setdefault(
                    f"{mode}/{impl}", {"wall": [], "cpu": [], "first": [], "loss": []}
                )
                if impl == "trainer" and mode == "compiled" and not trainer_compiles():
                    entry["skipped"] = "no compile field in DistributedTrainingConfig"
                    continue
                model = make_model(w)
                run = Run(w, x, y, mode == "compiled", device, args.bf16)
                rd.barrier()
                start = time.perf_counter()
                RUNNERS[impl](run, model)
                gaps = [b[0] - a[0] for a, b in itertools.pairwise(run.stamps)][w.warmup - 1 :]
                cpu = [b[1] - a[1] for a, b in itertools.pairwise(run.stamps)][w.warmup - 1 :]
                if device.type == "cuda":
                    # The host runs ahead of the device: a step's stamp is not its end. Time
                    # the steps after warm-up as a whole, up to the device's last kernel.
                    torch.cuda.synchronize()
                    timed = run.stamps[w.warmup - 1][0]
                    gaps = [(time.perf_counter() - timed) / (len(run.stamps) - w.warmup)]
                entry["wall"].append(statistics.median(gaps))
                entry["cpu"].append(statistics.median(cpu))
                entry["first"].append(run.stamps[0][0] - start)
                entry["steps"] = len(run.stamps)
                model.eval()
                with torch.no_grad(), run.autocast():
                    logits = model.to(device)(x_eval.to(device))
                    entry["loss"].append(float(loss_fn(w)(logits.float(), y_eval.to(device))))
                entry["state"] = {
                    k: v.detach().cpu().clone() for k, v in model.state_dict().items()
                }
    return {"world": world, "workload": dataclasses.asdict(w), "runs": results}


# -- the driver ---------------------------------------------------------------------------------


def measure(args: argparse.Namespace, world: int, folder: Path) -> dict[str, Any]:
    """Every workload on ``world`` ranks: one launch (one plain process for a world of one)."""
    from rankwise.testing import child_env, run_isolated, run_script

    out = folder / f"world-{world}.pt"
    wargs = ["--worker", "--out", str(out), f"--rounds={args.rounds}", "--device", args.device]
    wargs += ["--workloads", *args.workloads, "--modes", *args.modes, "--impls", *args.impls]
    wargs += ["--quick"] * args.quick + ["--bf16"] * args.bf16
    env = FIXED_MALLOC if args.fixed_malloc else {}
    if world == 1:  # a plain process: what a world of one is
        cmd = [sys.executable, str(Path(__file__).resolve()), *wargs]
        proc = run_isolated(cmd, env=child_env(env), timeout=args.timeout)
    else:
        proc = run_script(Path(__file__), world, script_args=wargs, timeout=args.timeout, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"the run on {world} rank(s) failed:\n{proc.stderr[-6000:]}")
    return torch.load(out, weights_only=False)


def _ratios(base: list[float], own: list[float]) -> dict[str, float]:
    """Per round ``base / own`` (> 1: faster than the base): median, min, max."""
    r = [b / o for b, o in zip(base, own, strict=True)]
    return {"median": statistics.median(r), "min": min(r), "max": max(r)}


def _cell(ratio: dict[str, float]) -> str:
    return f"{ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})"


def table(args: argparse.Namespace, result: dict[str, Any]) -> list[dict[str, Any]]:
    w, world, runs = result["workload"], result["world"], result["runs"]
    gpt = GPTConfig(**w["gpt"]) if w["gpt"] else None
    per_step = world * w["batch"] * (gpt.context if gpt else 1)
    unit = "tok/s" if gpt else "img/s"
    mfu = bool(gpt and args.peak_tflops)
    print(
        f"\n{w['name']} on {world} rank(s), {args.device}{' bf16' if args.bf16 else ' fp32'}, "
        f"batch {w['batch']}/rank, {w['steps']} steps ({w['warmup']} warm-up), "
        f"{args.rounds} round(s); 'vs loop': median over rounds of (loop's time / this one's), "
        "min-max in brackets; CPU: the main thread's thread_time per step"
    )
    warm = ", ".join(f"{m} {t:.1f} s" for m, t in runs.get("warm-up", {}).items())
    print(f"untimed warm-up run of the loop, time to its first step (compilation): {warm}")
    head = f"{'mode':<9} {'implementation':<17} {unit:>9} {'ms/step':>9} {'vs loop (wall)':>19} "
    head += f"{'CPU ms':>8} {'vs loop (CPU)':>19} {'1st step s':>10} {'final loss':>10} "
    print(head + f"{'vs loop':>9} {'weights vs loop':>15}" + (f" {'MFU':>6}" if mfu else ""))
    rows = []
    for mode in args.modes:
        ref = runs.get(f"{mode}/loop")
        for impl in IMPLS:
            run = runs.get(f"{mode}/{impl}")
            if run is None:
                continue
            if "skipped" in run:
                print(f"{mode:<9} {IMPLS[impl]:<17} n/a: {run['skipped']}")
                rows.append({"mode": mode, "impl": impl, "skipped": run["skipped"]})
                continue
            wall, cpu = statistics.median(run["wall"]), statistics.median(run["cpu"])
            rate = per_step / wall
            row: dict[str, Any] = {
                "mode": mode,
                "impl": impl,
                "rate": rate,
                "unit": unit,
                "wall_ms": [v * 1e3 for v in run["wall"]],
                "cpu_ms": [v * 1e3 for v in run["cpu"]],
                "first_step_s": run["first"],
                "final_loss": run["loss"],
            }
            cells = ["1.00x", "1.00x", "(reference)", "(reference)"]
            if ref and impl != "loop":
                row["vs_loop_wall"] = _ratios(ref["wall"], run["wall"])
                row["vs_loop_cpu"] = _ratios(ref["cpu"], run["cpu"])
                dloss = run["loss"][-1] - ref["loss"][-1]
                diff = max(
                    float((run["state"][k].float() - v.float()).abs().max())
                    for k, v in ref["state"].items()
                )
                row |= {"loss_vs_loop": dloss, "max_weight_diff_vs_loop": diff}
                same = "identical" if diff == 0.0 else f"{diff:.1e}"
                cells = [
                    _cell(row["vs_loop_wall"]),
                    _cell(row["vs_loop_cpu"]),
                    f"{dloss:+.1e}",
                    same,
                ]
            line = f"{mode:<9} {IMPLS[impl]:<17} {rate:>9.0f} {wall * 1e3:>9.1f} {cells[0]:>19} "
            line += f"{cpu * 1e3:>8.1f} {cells[1]:>19} {max(run['first']):>10.1f} "
            line += f"{run['loss'][-1]:>10.4f} {cells[2]:>9} {cells[3]:>15}"
            if mfu:
                assert gpt is not None
                row["mfu"] = rate * gpt.flops_per_token() / (world * args.peak_tflops * 1e12)
                line += f" {row['mfu']:>6.1%}"
            print(line)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small shapes, 1 round by default")
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument(
        "--workloads", nargs="+", choices=("gpt", "resnet"), default=["gpt", "resnet"]
    )
    parser.add_argument(
        "--worlds", nargs="+", type=int, default=[1, 2], help="ranks per run (default 1 2)"
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--impls", nargs="+", choices=tuple(IMPLS), default=list(IMPLS))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (all implementations)")
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="the device's peak TFLOP/s: adds MFU (gpt)"
    )
    parser.add_argument(
        "--fixed-malloc",
        action="store_true",
        help="fixed glibc malloc thresholds in every rank (MALLOC_MMAP_THRESHOLD_=64 MiB, "
        "MALLOC_TRIM_THRESHOLD_=128 MiB): no per-step page faults from large blocks",
    )
    parser.add_argument("--timeout", type=float, default=7200, help="seconds per world size")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    if args.worker:
        worker(args)
        return
    results: dict[str, Any] = run_header(
        trainer_compiles=trainer_compiles(), fixed_malloc=args.fixed_malloc, tables={}
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        by_world = {world: measure(args, world, Path(tmp)) for world in args.worlds}
    for name in args.workloads:
        for world in args.worlds:
            results["tables"][f"{name}/{world}"] = table(args, by_world[world][name])
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    out = Path(__file__).parent / "out" / "workloads.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
