"""Benchmark rankwise.augment against what a user would otherwise write, in the same run.

1. Parameter generation: ``generate_params`` (vectorised counter hash) vs a per-sample
   reference that does what DPA does — SHA-256 of the key, then Python ``random`` draws — and
   vs rankwise's own DPA-compatible ``gen_distributed_augmentation_params`` (10 SHA rounds, the
   DPA default depth; its stream too). Goals: >= 50x parameter sets per second over the
   reference for ``generate_params``; >= 1x for the per-sample DPA call at depth 10.
2. Applying them to 256 x 3 x 64 x 64 images: ``apply_augmentation`` (one batched call) vs a
   per-image Python loop of the same operations (affine_grid + grid_sample, brightness,
   contrast, noise from a torch.Generator seeded per image). Goal: >= 5x.

Prints a table, writes JSON to benchmarks/out/augment.json. Timings are the best of
``--repeats`` runs after a warm-up; rates and speedups use the process's CPU time (one torch
thread), which other jobs on a shared machine disturb far less than the wall clock.

    PYTHONPATH=src python benchmarks/augment.py [--samples 50000] [--threads 1] [--repeats 7]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import platform
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rankwise.augment import (
    PARAM_NAMES,
    AugmentationConfig,
    apply_augmentation,
    gen_distributed_augmentation_params,
    generate_params,
    get_preset,
    stream_distributed_augmentation_chain,
)

PARAM_GOAL, DPA_GOAL, APPLY_GOAL = 50.0, 1.0, 5.0


def best_time(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Best wall-clock and best CPU time of ``repeats`` runs after a warm-up.

    On a machine shared with other jobs the wall clock also counts the time this process
    waited for a core; with one torch thread the process's CPU time does not, so the speedups
    are computed from it and the wall clock is reported alongside.
    """
    fn()  # warm-up: first-call allocations, lazy imports
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return min(walls), min(cpus)


# ------------------------------------------------------------------ parameter generation


def reference_params(ids: range, cfg: AugmentationConfig, base_seed: int, epoch: int) -> list:
    """What DPA does per sample: hash the key with SHA-256, seed a Random, draw five values."""
    out = []
    ranges = [getattr(cfg, f"{name}_range") for name in PARAM_NAMES]
    for sample_id in ids:
        digest = hashlib.sha256(f"{base_seed}:{epoch}:{sample_id}".encode()).hexdigest()
        rng = random.Random(int(digest, 16))
        out.append({name: rng.uniform(*r) for name, r in zip(PARAM_NAMES, ranges, strict=True)})
    return out


def bench_params(samples: int, repeats: int) -> list[dict[str, Any]]:
    cfg = get_preset("moderate")
    shallow = dataclasses.replace(cfg, augmentation_depth=1)
    ids = np.arange(samples)
    per_sample = max(samples // 10, 1)  # the slow paths on a tenth, reported as a rate
    rows = [
        (
            "reference: SHA-256 + random, per sample",
            per_sample,
            lambda: reference_params(range(per_sample), cfg, 0, 1),
        ),
        (
            "gen_distributed_augmentation_params (DPA API, depth 10), per sample",
            per_sample,
            lambda: [gen_distributed_augmentation_params(i, 0, cfg) for i in range(per_sample)],
        ),
        (
            "gen_distributed_augmentation_params, depth 1, per sample",
            per_sample,
            lambda: [gen_distributed_augmentation_params(i, 0, shallow) for i in range(per_sample)],
        ),
        (
            "stream_distributed_augmentation_chain (depth 10)",
            per_sample,
            lambda: sum(1 for _ in stream_distributed_augmentation_chain(per_sample, 0, 1, cfg)),
        ),
        (
            f"generate_params, one call of {samples}",
            samples,
            lambda: generate_params(ids, epoch=1, config=cfg),
        ),
        (
            "generate_params, calls of 256 ids",
            samples,
            lambda: [
                generate_params(ids[i : i + 256], epoch=1, config=cfg)
                for i in range(0, samples, 256)
            ],
        ),
    ]
    results: list[dict[str, Any]] = []
    for name, count, fn in rows:
        wall, cpu = best_time(fn, repeats)
        results.append(
            {"name": name, "count": count, "wall_s": wall, "cpu_s": cpu, "per_second": count / cpu}
        )
    base = results[0]["per_second"]
    for row in results:
        row["speedup"] = row["per_second"] / base
    return results


# ------------------------------------------------------------------------------ applying


def per_image_loop(images: torch.Tensor, params: dict[str, np.ndarray]) -> torch.Tensor:
    """The same operations, one image at a time, as a hand-written transform would do them."""
    out = []
    height, width = images.shape[-2:]
    for i in range(images.shape[0]):
        x = images[i : i + 1]
        rad, s = math.radians(float(params["rotation"][i])), float(params["scale"][i])
        c, n = math.cos(rad) / s, math.sin(rad) / s
        theta = torch.tensor([[[c, -n * height / width, 0.0], [n * width / height, c, 0.0]]])
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        x = x * float(params["brightness"][i])
        mean = x.mean()
        x = mean + float(params["contrast"][i]) * (x - mean)
        if params["noise"][i] > 0:
            gen = torch.Generator().manual_seed(int(params["seed"][i]))
            x = x + float(params["noise"][i]) * torch.randn(x.shape, generator=gen)
        out.append(x)
    return torch.cat(out)


def bench_apply(batch: int, size: int, repeats: int) -> list[dict[str, Any]]:
    images = torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(0))
    params = generate_params(np.arange(batch), epoch=1, config=get_preset("moderate"))
    # Same operations? Compare with the noise off (the two draw different noise by design).
    quiet = {**params, "noise": np.zeros(batch)}
    torch.testing.assert_close(
        apply_augmentation(images, quiet), per_image_loop(images, quiet), atol=1e-4, rtol=1e-4
    )
    rows = [
        ("reference: per-image loop", lambda: per_image_loop(images, params)),
        ("apply_augmentation, batched", lambda: apply_augmentation(images, params)),
        ("per-image loop, no noise", lambda: per_image_loop(images, quiet)),
        ("apply_augmentation, no noise", lambda: apply_augmentation(images, quiet)),
    ]
    results: list[dict[str, Any]] = []
    for name, fn in rows:
        wall, cpu = best_time(fn, repeats)
        results.append(
            {"name": name, "count": batch, "wall_s": wall, "cpu_s": cpu, "per_second": batch / cpu}
        )
    for row, base in zip(results, (results[0], results[0], results[2], results[2]), strict=True):
        row["speedup"] = row["per_second"] / base["per_second"]
    return results


# --------------------------------------------------------------------------------- report


def table(title: str, rows: list[dict[str, Any]], unit: str) -> str:
    lines = [
        f"### {title}",
        "",
        f"| method | n | CPU ms | wall ms | {unit}/s (CPU) | vs reference (CPU) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['count']} | {r['cpu_s'] * 1e3:.2f} | "
            f"{r['wall_s'] * 1e3:.2f} | {r['per_second']:,.0f} | {r['speedup']:.{2 if r['speedup'] < 10 else 1}f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=64, help="image side for the goal")
    parser.add_argument(
        "--extra-sizes",
        type=int,
        nargs="*",
        default=[16],
        help="further image sides, for context (not judged against the goal)",
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "augment.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    params = bench_params(args.samples, args.repeats)
    apply = bench_apply(args.batch, args.size, args.repeats)
    extra = {size: bench_apply(args.batch, size, args.repeats) for size in args.extra_sizes}
    dpa_speedup = params[1]["speedup"]
    param_speedup = params[4]["speedup"]
    apply_speedup = apply[1]["speedup"]
    print(table("Parameter generation", params, "parameter sets"))
    print()
    print(table(f"Applying to {args.batch} x 3 x {args.size} x {args.size}", apply, "images"))
    print()
    for size, rows in extra.items():
        print(table(f"Applying to {args.batch} x 3 x {size} x {size} (context)", rows, "images"))
        print()
    print(
        f"generate_params vs reference: {param_speedup:.0f}x (goal >= {PARAM_GOAL:g}x: "
        f"{'met' if param_speedup >= PARAM_GOAL else 'MISSED'})"
    )
    print(
        f"gen_distributed_augmentation_params (depth 10) vs reference: {dpa_speedup:.2f}x "
        f"(goal >= {DPA_GOAL:g}x: {'met' if dpa_speedup >= DPA_GOAL else 'MISSED'})"
    )
    print(
        f"apply_augmentation vs per-image loop: {apply_speedup:.1f}x (goal >= {APPLY_GOAL:g}x: "
        f"{'met' if apply_speedup >= APPLY_GOAL else 'MISSED'})"
    )

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                "machine": {
                    "platform": platform.platform(),
                    "cpus": os.cpu_count(),
                    "torch": torch.__version__,
                    "numpy": np.__version__,
                    "torch_threads": args.threads,
                },
                "args": {k: str(v) for k, v in vars(args).items()},
                "params": params,
                "apply": apply,
                "apply_extra_sizes": {str(size): rows for size, rows in extra.items()},
                "goals": {
                    "params": {"goal": PARAM_GOAL, "speedup": param_speedup},
                    "dpa_per_sample": {"goal": DPA_GOAL, "speedup": dpa_speedup},
                    "apply": {"goal": APPLY_GOAL, "speedup": apply_speedup},
                },
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
