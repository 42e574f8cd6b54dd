"""Check the trainer on a real GPU: device placement, fp32 / bf16 / fp16 (GradScaler), FSDP's
world-of-one path, automatic resume and the CUDA generator in checkpoints.

Run on a machine with CUDA, from the repository root:

  torchrun --nproc-per-node 1 scripts/gpu_train_check.py        # auto: cpu:gloo,cuda:nccl
  DISTRIBUTED_BACKEND=nccl torchrun --nproc-per-node 1 scripts/gpu_train_check.py
  python scripts/gpu_train_check.py                              # no launcher, no group

Prints one ``PASS name`` / ``FAIL name: why`` line per check; the exit code is the number of
failed checks.
"""

from __future__ import annotations

import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import torch
from torch import nn

import rankwise.distributed as rd
from rankwise.train import DistributedTrainer, DistributedTrainingConfig
from rankwise.train.checkpoint import rng_state, set_rng_state

failures = 0


def check(name: str, fn: Callable[[], str]) -> None:
    global failures
    try:
        start = time.perf_counter()
        detail = fn()
        print(f"PASS {name} ({time.perf_counter() - start:.1f}s) {detail}", flush=True)
    except Exception as exc:
        failures += 1
        print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc()


g = torch.Generator().manual_seed(0)
X = torch.randn(2048, 32, generator=g)
Y = (X @ torch.randn(32, 4, generator=g)).argmax(1)  # a learnable 4-class problem


def fit(precision: str, *, strategy: str = "ddp", epochs: int = 4, **kw: Any) -> Any:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 4))
    trainer = DistributedTrainer(
        model, nn.CrossEntropyLoss(), lambda p: torch.optim.AdamW(p, lr=3e-3)
    )
    cfg = DistributedTrainingConfig(
        epochs=epochs,
        batch_size=64,
        precision=precision,
        strategy=strategy,
        verbose=False,
        grad_clip_norm=1.0,
        checkpoint_dir=kw.get("checkpoint_dir"),
        checkpoint_every_n_steps=10 if kw.get("checkpoint_dir") else 0,
        resume=kw.get("resume"),
    )
    history = trainer.fit(X, Y, cfg)
    loss, accuracy = trainer.evaluate(X, Y)
    return trainer, history, loss, accuracy


def fit_check(precision: str, strategy: str = "ddp") -> Callable[[], str]:
    def run() -> str:
        trainer, history, loss, accuracy = fit(precision, strategy=strategy)
        device = next(trainer.model.parameters()).device
        assert device.type == "cuda", device
        assert history.train_losses[-1] < history.train_losses[0], history.train_losses
        assert accuracy > 0.8, accuracy
        losses = [round(x, 3) for x in history.train_losses]
        return f"{type(trainer.model).__name__} on {device}, losses {losses}, eval {loss:.4f} / {accuracy:.4f}"

    return run


def resume() -> str:
    with tempfile.TemporaryDirectory() as folder:
        fit("fp16", epochs=2, checkpoint_dir=folder)  # two epochs, then "crash"
        resumed, history, _, _ = fit("fp16", checkpoint_dir=folder, resume="auto")
    reference = fit("fp16")[0]
    diff = max(
        (a - b).abs().max().item()
        for a, b in zip(resumed.module.parameters(), reference.module.parameters(), strict=True)
    )
    assert len(history.train_losses) == 4, history.train_losses
    assert diff < 1e-3, diff
    return f"resumed vs uninterrupted: max |diff| {diff:.2e} (GradScaler state carried)"


def rng() -> str:
    state = rng_state()
    first = torch.rand(3, device="cuda")
    set_rng_state(state)
    assert torch.equal(first, torch.rand(3, device="cuda"))
    return "the CUDA generator is restored"


rd.init()
print(f"backend {rd.get_backend()}, device {rd.device()}, world {rd.get_world_size()}")
for mode in ("fp32", "bf16", "fp16"):
    check(f"fit-ddp-{mode}", fit_check(mode))
check("fit-fsdp-bf16", fit_check("bf16", strategy="fsdp"))
check("resume-auto-fp16", resume)
check("rng-cuda", rng)
rd.finalize()
print(f"{failures} failed")
sys.exit(failures)
