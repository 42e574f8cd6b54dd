"""``compile=True``: the trainer trains a torch.compile'd model (inductor, gcc on CPU) on real
gloo ranks and lands where eager training lands, with clean state dict keys.

Compiling dominates the time, so one 2-rank run carries every check: each rank trains an eager
model and a compiled one on the same data (gradient accumulation with ``no_sync`` and bf16
autocast on) and swaps checkpoints between them. (Gradient checkpointing compiles too, tried by
hand, but its recomputation graphs take four times as long to compile, so it is left out.)
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import rankwise.distributed as rd
from helpers.training import classification, make_trainer, mlp
from rankwise.parallel import compile_model, is_compiled, unwrap_model
from rankwise.testing import run_distributed
from rankwise.train import DistributedTrainer, DistributedTrainingConfig, load_file
from rankwise.train.checkpoint import model_state_dict

SETTINGS: dict[str, Any] = {
    "epochs": 2,
    "batch_size": 8,
    "grad_accum_steps": 2,  # no_sync on every other micro-batch
    "precision": "bf16",  # autocast on the CPU
    "verbose": False,
    "checkpoint_dir": None,
    "seed": 5,
}


_SGD = functools.partial(torch.optim.SGD, lr=0.1)  # a factory: the trainer builds it


def _fit(compiled: bool) -> tuple[DistributedTrainer, list[float]]:
    x, y = classification(96, 6, 3, seed=0)
    trainer = make_trainer(mlp(activation=nn.ReLU), _SGD)
    cfg = DistributedTrainingConfig(**SETTINGS, compile=compiled)
    return trainer, trainer.fit(x, y, cfg).train_losses


def _eager_and_compiled(folder: str) -> dict[str, Any]:
    eager, eager_losses = _fit(compiled=False)
    compiled, compiled_losses = _fit(compiled=True)
    final = {k: v.clone() for k, v in model_state_dict(compiled.model).items()}
    # Checkpoints cross over: the compiled model's file loads into an eager trainer, and back.
    compiled.save_checkpoint(Path(folder) / "compiled.pt")
    eager.save_checkpoint(Path(folder) / "eager.pt")
    rd.barrier()
    fresh = make_trainer(mlp(activation=nn.ReLU), _SGD)
    fresh.load_checkpoint(Path(folder) / "compiled.pt")
    compiled.load_checkpoint(Path(folder) / "eager.pt")
    eager_state = model_state_dict(eager.model)
    return {
        "losses": (eager_losses, compiled_losses),
        "drift": max((final[k] - v).abs().max().item() for k, v in eager_state.items()),
        "keys": (sorted(eager_state), sorted(final)),
        "file_keys": sorted(load_file(Path(folder) / "compiled.pt")["model"]),
        "wrapped": (type(compiled.model).__name__, is_compiled(compiled.model)),
        "eager_compiled": is_compiled(eager.model),
        "loaded_into_eager": all(
            torch.equal(fresh.model.state_dict()[k], v) for k, v in final.items()
        ),
        "loaded_into_compiled": all(
            torch.equal(model_state_dict(compiled.model)[k], v) for k, v in eager_state.items()
        ),
    }


@pytest.mark.timeout(300)
def test_compiled_training_matches_eager_on_two_ranks_and_keeps_clean_keys(
    tmp_path: Path,
) -> None:
    results = run_distributed(_eager_and_compiled, 2, args=(str(tmp_path),), timeout=280)
    for r in results:
        eager_losses, compiled_losses = r["losses"]
        assert len(compiled_losses) == 2
        assert all(abs(a - b) < 1e-3 for a, b in zip(eager_losses, compiled_losses, strict=True))
        assert r["drift"] < 1e-3
        assert r["wrapped"] == ("DistributedDataParallel", True)  # compiled inside the DDP
        assert not r["eager_compiled"]
        keys = r["keys"][0]
        assert (
            r["keys"][1]
            == keys
            == r["file_keys"]
            == ["0.bias", "0.weight", "2.bias", "2.weight", "4.bias", "4.weight"]
        )
        assert r["loaded_into_eager"] and r["loaded_into_compiled"]


def test_compile_model_compiles_in_place_inside_a_wrapper() -> None:
    net = nn.Linear(3, 2)
    wrapped = nn.DataParallel(net)  # no GPU: a plain call of the module
    assert compile_model(wrapped, {"backend": "eager", "dynamic": False}) is wrapped
    assert is_compiled(wrapped) and is_compiled(net) and unwrap_model(wrapped) is net
    assert list(wrapped.module.state_dict()) == ["weight", "bias"]
    x = torch.randn(4, 3)
    assert torch.allclose(wrapped(x), x @ net.weight.T + net.bias)


def test_a_later_fit_keeps_the_first_fits_compile_setting() -> None:
    trainer = make_trainer(mlp(activation=nn.ReLU), _SGD)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    cfg = DistributedTrainingConfig(epochs=1, batch_size=8, verbose=False, checkpoint_dir=None)
    trainer.fit(x, y, cfg)
    cfg.compile = True
    with pytest.raises(ValueError, match=r"prepared with compile=False by an earlier fit\(\)"):
        trainer.fit(x, y, cfg)
