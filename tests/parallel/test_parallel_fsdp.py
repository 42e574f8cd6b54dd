"""FSDP2 (``fully_shard``) on real gloo ranks, compared with DDP on the same data."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import rankwise.parallel as rp
from helpers.training import mlp
from rankwise.testing import run_distributed


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    return torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)


def _full(model: nn.Module) -> list[torch.Tensor]:
    """Unsharded copies of the parameters (DTensor shards are gathered)."""
    out = []
    for p in rp.unwrap_model(model).parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        out.append(full.detach().clone())
    return out


def _train(model: nn.Module, steps: int, checkpoint: bool = False) -> tuple[list[float], float]:
    """Two micro-batches per step through accumulate, clipped; returns norms and last loss."""
    if checkpoint:
        rp.enable_gradient_checkpointing(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    norms, loss = [], torch.zeros(())
    for step in range(steps):
        for k in range(2):
            x, y = _batch(2 * step + k)
            with rp.accumulate(model, is_last=k == 1):
                loss = nn.functional.mse_loss(model(x).float(), y) / 2
                loss.backward()
        norms.append(float(rp.clip_grad_norm(model, 0.5)))
        optimizer.step()
        optimizer.zero_grad()
    return norms, loss.item()


def _fsdp_against_ddp() -> dict[str, Any]:
    rank = dist.get_rank()
    ddp = rp.wrap_model(mlp(seed=0))
    # Different weights per rank: broadcast_parameters must make rank 0's the starting point.
    fsdp = rp.wrap_model(mlp(seed=rank), rp.FSDPConfig(), strategy="fsdp")
    fsdp_ckpt = rp.wrap_model(copy.deepcopy(mlp(seed=0)), rp.FSDPConfig(), strategy="fsdp")
    mixed = rp.wrap_model(mlp(seed=0), rp.FSDPConfig(param_dtype="bf16"), strategy="fsdp")
    sharded = type(next(fsdp.parameters())).__name__
    ddp_norms, _ = _train(ddp, 4)
    fsdp_norms, _ = _train(fsdp, 4)
    ckpt_norms, _ = _train(fsdp_ckpt, 4, checkpoint=True)
    mixed_norms, _ = _train(mixed, 4)
    reference = _full(ddp)
    diff = max(float((a - b).abs().max()) for a, b in zip(_full(fsdp), reference, strict=True))
    ckpt_diff = max(
        float((a - b).abs().max()) for a, b in zip(_full(fsdp_ckpt), reference, strict=True)
    )
    mixed_diff = max(
        float((a - b).abs().max()) for a, b in zip(_full(mixed), reference, strict=True)
    )
    report = rp.check_parameters_in_sync(fsdp)
    return {
        "sharded": sharded,
        "ddp_norms": ddp_norms,
        "fsdp_norms": fsdp_norms,
        "ckpt_norms": ckpt_norms,
        "mixed_norms": mixed_norms,
        "diff": diff,
        "ckpt_diff": ckpt_diff,
        "mixed_diff": mixed_diff,
        "report": (bool(report), report.checked, len(report.unreplicated)),
    }


def test_fsdp_trains_like_ddp_and_clips_on_the_unsharded_norm() -> None:
    for out in run_distributed(_fsdp_against_ddp, 2, timeout=120):
        assert out["sharded"] == "DTensor"
        # The clipped norm is the norm of the whole gradient, not of this rank's shard.
        for norms in (out["fsdp_norms"], out["ckpt_norms"]):
            for a, b in zip(norms, out["ddp_norms"], strict=True):
                assert abs(a - b) < 1e-5 * max(1.0, b), out
        assert max(out["ddp_norms"]) > 0.5  # the clip was active, so it was tested
        assert out["diff"] < 1e-5 and out["ckpt_diff"] < 1e-5, out
        # bf16 parameters in compute: close to DDP's fp32 result, not equal.
        assert 1e-6 < out["mixed_diff"] < 5e-2, out
        # Every parameter is a shard with no replica: layouts compared, none skipped.
        assert out["report"] == (True, 6, 6)
