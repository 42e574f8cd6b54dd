"""Trainer options that change how a step runs, not what it computes: each test fails if
``fit`` ignored the option.

- ``compression="fp16"``: the DDP model ``fit`` trains has rankwise's hook, which puts 2 bytes
  per gradient element on the wire (float32 would be 4), and the averaged gradients the
  optimizer steps with are float16 values (a float16 all-reduce's results), close to but not
  equal to the uncompressed run's.
- ``gradient_checkpointing=True``: the tensors autograd saves during ``fit``'s forward passes
  (counted by ``torch.autograd.graph.saved_tensors_hooks``) shrink to what lies outside the
  checkpointed blocks, while the trained weights stay the same.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from rankwise.parallel import comm_stats
from rankwise.testing import run_distributed
from rankwise.train import DistributedTrainer, DistributedTrainingConfig

ROWS, FEATURES, CLASSES = 64, 16, 4  # 2 ranks x 4 steps of 8 rows


def data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(ROWS, FEATURES, generator=gen), torch.randint(
        CLASSES, (ROWS,), generator=gen
    )


def blocks_model(seed: int = 0, width: int = 32) -> nn.Module:
    """Three (Linear, Tanh) blocks and a head: the blocks are what checkpointing wraps."""
    torch.manual_seed(seed)
    blocks = [
        nn.Sequential(nn.Linear(FEATURES if i == 0 else width, width), nn.Tanh()) for i in range(3)
    ]
    return nn.Sequential(*blocks, nn.Linear(width, CLASSES))


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a copy of the gradients of each step (the averaged ones, after sync)."""

    def __init__(self, params: Any, lr: float) -> None:
        super().__init__(params, lr=lr)
        self.grads: list[list[torch.Tensor]] = []

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        self.grads.append([p.grad.clone() for g in self.param_groups for p in g["params"]])
        return super().step(closure)


def config(**fields: Any) -> DistributedTrainingConfig:
    return DistributedTrainingConfig(
        epochs=1, batch_size=8, shuffle=False, verbose=False, checkpoint_dir=None, **fields
    )


# -- compression ------------------------------------------------------------------------------


def _fit_compressed(compression: str | None) -> dict[str, Any]:
    x, y = data()
    model = blocks_model()
    optimizer = RecordingSGD(model.parameters(), lr=0.1)
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), optimizer)
    trainer.fit(x, y, config(compression=compression))
    stats = comm_stats(trainer.model)
    return {
        "numel": sum(p.numel() for p in model.parameters()),
        "stats": None if stats is None else (stats.bytes_sent, stats.steps),
        "grads": optimizer.grads,
    }


def _compression_runs() -> dict[str, Any]:
    return {"none": _fit_compressed(None), "fp16": _fit_compressed("fp16")}


@pytest.mark.timeout(90)
def test_fp16_compression_halves_the_bytes_and_rounds_the_gradients() -> None:
    results = run_distributed(_compression_runs, 2, timeout=80)
    for rank in results:
        plain, fp16 = rank["none"], rank["fp16"]
        assert plain["stats"] is None  # no hook without compression: nothing counts
        # 4 optimizer steps, each all-reducing every gradient element once as 2 bytes.
        assert fp16["stats"] == (4 * 2 * fp16["numel"], 4)
        assert len(fp16["grads"]) == len(plain["grads"]) == 4
        first_fp16, first_plain = fp16["grads"][0], plain["grads"][0]
        # The same model, batches and losses before the first sync: only the wire differs.
        for compressed, exact in zip(first_fp16, first_plain, strict=True):
            assert torch.equal(compressed, compressed.half().float())  # float16 values
            # float16 rounding (11 significant bits) of each rank's half and of their sum: an
            # error of a few 1e-4 of the tensor's scale, more where the halves cancel.
            scale = float(exact.abs().max())
            torch.testing.assert_close(compressed, exact, rtol=2e-3, atol=4e-3 * scale)
        # ... and float32's all-reduce keeps bits float16 cannot hold.
        assert not all(torch.equal(g, g.half().float()) for g in first_plain)
        assert not all(torch.equal(a, b) for a, b in zip(first_fp16, first_plain, strict=True))
    # Both ranks stepped with the same (averaged) gradients.
    for a, b in zip(results[0]["fp16"]["grads"][0], results[1]["fp16"]["grads"][0], strict=True):
        assert torch.equal(a, b)


# -- gradient checkpointing -------------------------------------------------------------------


def _fit_counting_saved(checkpointing: bool) -> dict[str, Any]:
    x, y = data(1)
    model = blocks_model(1)
    trainer = DistributedTrainer(
        model, nn.CrossEntropyLoss(), RecordingSGD(model.parameters(), 0.1)
    )
    saved = {"bytes": 0, "tensors": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved["bytes"] += t.numel() * t.element_size()
        saved["tensors"] += 1
        return t

    # Innermost hooks win: inside a checkpointed block, torch's checkpoint hooks replace these.
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        trainer.fit(x, y, config(gradient_checkpointing=checkpointing))
    return {
        "saved": saved,
        "checkpointed": ["forward" in vars(block) for block in model[:3]],
        "weights": [p.detach().clone() for p in model.parameters()],
        "losses": trainer.history.train_losses,
    }


def _checkpointing_runs() -> dict[str, Any]:
    return {"off": _fit_counting_saved(False), "on": _fit_counting_saved(True)}


@pytest.mark.timeout(90)
def test_gradient_checkpointing_saves_fewer_activations_and_trains_the_same() -> None:
    results = run_distributed(_checkpointing_runs, 2, timeout=80)
    for rank in results:
        off, on = rank["off"], rank["on"]
        assert off["checkpointed"] == [False] * 3
        assert on["checkpointed"] == [True] * 3  # fit wrapped each block's forward
        # Without checkpointing every block saves its input, weight and tanh output per step;
        # with it only the head and the loss save anything.
        assert on["saved"]["bytes"] * 3 < off["saved"]["bytes"], (on["saved"], off["saved"])
        assert 0 < on["saved"]["tensors"] < off["saved"]["tensors"]
        # Recomputing the activations changes nothing that is trained.
        assert on["losses"] == off["losses"]
        for a, b in zip(on["weights"], off["weights"], strict=True):
            assert torch.equal(a, b)
