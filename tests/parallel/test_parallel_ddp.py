"""DDP on real gloo ranks: gradients, accumulation, compression, precision, divergence.

The reference for every check is an unwrapped copy of the model trained in the same process
on the inputs of all ranks gathered together (accelerate's test pattern): with equal local
batches, DDP's averaged gradient is exactly that copy's gradient.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import rankwise.distributed as rd
import rankwise.parallel as rp
from helpers.training import mlp
from rankwise.testing import run_distributed

LOCAL_BATCH = 4


def _local_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch for ``step``: different on every rank, reproducible."""
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    return torch.randn(LOCAL_BATCH, 6, generator=g), torch.randn(LOCAL_BATCH, 3, generator=g)


def _gathered(t: torch.Tensor) -> torch.Tensor:
    return torch.cat(rd.all_gather([torch.empty_like(t) for _ in range(dist.get_world_size())], t))


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [
        p.grad.detach().clone() for p in rp.unwrap_model(model).parameters() if p.grad is not None
    ]


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).detach().abs().max()) for x, y in zip(a, b, strict=True))


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x), y)


# -- gradients and accumulation ----------------------------------------------------------------


def _gradients_and_accumulation() -> dict[str, Any]:
    rank = dist.get_rank()
    # Different weights on every rank: broadcast_parameters must start all from rank 0's.
    model = rp.wrap_model(mlp(seed=rank), rp.DDPConfig(bucket_size_mb=0.001))
    out: dict[str, Any] = {"in_sync_at_start": bool(rp.check_parameters_in_sync(model))}
    reference = copy.deepcopy(rp.unwrap_model(model))
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference))
    sync_diffs, skipped_diffs = [], []
    for step in range(6):
        is_last = step % 2 == 1  # two micro-batches per optimizer step
        x, y = _local_batch(step)
        with rp.accumulate(model, is_last=is_last):
            _loss(model, x, y).backward()
        _loss(reference, _gathered(x), _gathered(y)).backward()
        diff = _max_diff(_grads(model), _grads(reference))
        (sync_diffs if is_last else skipped_diffs).append(diff)
        if is_last:
            opt.step()
            ref_opt.step()
            opt.zero_grad()
            ref_opt.zero_grad()
    out["sync_diffs"], out["skipped_diffs"] = sync_diffs, skipped_diffs
    out["param_diff"] = _max_diff(
        list(rp.unwrap_model(model).parameters()), list(reference.parameters())
    )

    # N micro-batches of loss/N through accumulate == one batch N times as large, on DDP;
    # a third copy also checkpoints its blocks, which must not change anything.
    base = mlp(seed=3)
    micro, big, ckpt = (rp.wrap_model(copy.deepcopy(base)) for _ in range(3))
    rp.enable_gradient_checkpointing(ckpt)
    opts = [torch.optim.SGD(m.parameters(), lr=0.2, momentum=0.9) for m in (micro, big, ckpt)]
    for step in range(3):
        batches = [_local_batch(10 * step + k) for k in range(4)]
        for k, (x, y) in enumerate(batches):
            with rp.accumulate(micro, is_last=rp.is_sync_step(k, 4)):
                (_loss(micro, x, y) / 4).backward()
        xs, ys = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        _loss(big, xs, ys).backward()
        _loss(ckpt, xs, ys).backward()
        for o in opts:
            o.step()
            o.zero_grad()
    out["accumulation_diff"] = _max_diff(list(micro.parameters()), list(big.parameters()))
    out["checkpointing_diff"] = _max_diff(list(ckpt.parameters()), list(big.parameters()))
    return out


def test_ddp_gradients_match_reference_and_accumulation_matches_big_batch() -> None:
    for out in run_distributed(_gradients_and_accumulation, 2, timeout=90):
        assert out["in_sync_at_start"]
        assert max(out["sync_diffs"]) < 1e-6, out  # synced: the gathered-input gradient
        assert min(out["skipped_diffs"]) > 1e-3, out  # no_sync: only this rank's gradient
        assert out["param_diff"] < 1e-6
        assert out["accumulation_diff"] < 1e-5
        assert out["checkpointing_diff"] < 1e-6


# -- compression and precision -----------------------------------------------------------------


def _train_compressed(compression: str | None, precision: str) -> dict[str, Any]:
    cfg = rp.DDPConfig(
        compression=compression, count_bytes=True, powersgd_start_iter=2, bucket_size_mb=1
    )
    model = rp.wrap_model(mlp(6, 32, 32, 3), cfg)
    reference = copy.deepcopy(rp.unwrap_model(model))
    prec = rp.Precision(precision, device="cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    target = mlp(6, 8, 8, 3, seed=9)  # a learnable task: regress another network's outputs
    losses, first_error = [], float("nan")
    for step in range(25):
        x, _ = _local_batch(step % 5)
        with torch.no_grad():
            y = target(x)
        with prec.autocast():
            loss = nn.functional.mse_loss(model(x).float(), y)
        prec.backward(loss)
        if step == 0:  # the hook's average must be the gathered batch's gradient
            nn.functional.mse_loss(reference(_gathered(x)), _gathered(y)).backward()
            got, want = (
                torch.cat([g.flatten() for g in _grads(model)]),
                torch.cat([g.flatten() for g in _grads(reference)]),
            )
            first_error = float((got - want).norm() / want.norm())
        prec.step(optimizer)
        optimizer.zero_grad()
        losses.append(_mean(loss.item()))
    stats = rp.comm_stats(model)
    assert stats is not None
    return {
        "first_error": first_error,
        "first": sum(losses[:5]) / 5,
        "last": sum(losses[-5:]) / 5,
        "in_sync": str(rp.check_parameters_in_sync(model)),
        "synced": bool(rp.check_parameters_in_sync(model)),
        "bytes_per_step": stats.bytes_per_step,
        "steps": stats.steps,
        "comm_state": rp.comm_state_dict(model),
    }


def _mean(value: float) -> float:
    return rd.reduce_metrics({"v": value})["v"]


def _fp16_overflow_is_skipped_everywhere() -> list[bool]:
    model = rp.wrap_model(mlp())
    prec = rp.Precision("fp16", device="cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = _local_batch(0)
    if dist.get_rank() == 1:
        x[0, 0] = float("inf")  # only rank 1 overflows; the all-reduce spreads it
    with prec.autocast():
        loss = nn.functional.mse_loss(model(x).float(), y)
    prec.backward(loss)
    stepped = prec.step(optimizer)
    unchanged = all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    return [stepped, unchanged, bool(rp.check_parameters_in_sync(model))]


def _all_compression_modes() -> dict[str, Any]:
    runs = {
        "none": _train_compressed(None, "fp32"),
        "fp16": _train_compressed("fp16", "fp32"),
        "bf16": _train_compressed("bf16", "bf16"),
        "powersgd": _train_compressed("powersgd", "fp32"),
    }
    runs["overflow"] = _fp16_overflow_is_skipped_everywhere()
    return runs


def test_each_compression_mode_trains_stays_in_sync_and_counts_bytes() -> None:
    results = run_distributed(_all_compression_modes, 2, timeout=120)
    runs = results[0]
    for name in ("none", "fp16", "bf16", "powersgd"):
        run = runs[name]
        assert run["synced"], f"{name}: {run['in_sync']}"
        assert run["last"] < 0.5 * run["first"], (name, run)
        assert run["steps"] == 25
    assert runs["none"]["first_error"] < 1e-6
    assert runs["powersgd"]["first_error"] < 1e-6  # its first steps are plain all-reduces
    assert 1e-6 < runs["fp16"]["first_error"] < 2e-3
    assert runs["bf16"]["first_error"] < 2e-2  # bf16 autocast and bf16 all-reduce
    numel = sum(p.numel() for p in mlp(6, 32, 32, 3).parameters())
    assert runs["none"]["bytes_per_step"] == 4 * numel
    assert runs["fp16"]["bytes_per_step"] == runs["bf16"]["bytes_per_step"] == 2 * numel
    # Two plain steps, then rank-1 factors: far fewer bytes on average.
    assert runs["powersgd"]["bytes_per_step"] < 0.3 * runs["none"]["bytes_per_step"]
    assert runs["powersgd"]["comm_state"]["powersgd"]["iter"] == 25
    assert results[0]["powersgd"]["comm_state"] == results[1]["powersgd"]["comm_state"]
    for run in results:
        assert run["overflow"] == [False, True, True]  # skipped on both ranks, still in sync


def _synced_gradient(compression: str | None, value: float) -> float:
    # One weight, d(loss)/dw = value on every rank: the synced gradient is the mean, as
    # rounded by the dtype the hook puts on the wire (each rank sends value / 2).
    model = rp.wrap_model(nn.Linear(1, 1, bias=False), rp.DDPConfig(compression=compression))
    (model(torch.full((1, 1), value)).sum()).backward()
    return float(rp.unwrap_model(model).weight.grad)


def _wire_dtypes() -> dict[str, list[float]]:
    values = (1 + 2**-10, 1 + 2**-12)
    return {str(c): [_synced_gradient(c, v) for v in values] for c in (None, "fp16", "bf16")}


def test_cast_hooks_send_their_dtype() -> None:
    # bf16 keeps 8 significant bits, fp16 11, fp32 24: 1 + 2^-10 survives fp16 but not bf16,
    # 1 + 2^-12 survives only fp32.
    for run in run_distributed(_wire_dtypes, 2):
        assert run == {
            "None": [1 + 2**-10, 1 + 2**-12],
            "fp16": [1 + 2**-10, 1.0],
            "bf16": [1.0, 1.0],
        }


# -- divergence detection ----------------------------------------------------------------------


def _divergence() -> dict[str, Any]:
    rank = dist.get_rank()
    out: dict[str, Any] = {}
    # The CyxWiz guide's "Gradients differ across ranks": seeds differ and nothing broadcasts.
    unsynced = rp.wrap_model(mlp(seed=rank), rp.DDPConfig(broadcast_parameters=False))
    out["unsynced"] = rp.check_parameters_in_sync(unsynced).names
    synced = rp.wrap_model(mlp(seed=rank))
    out["synced"] = bool(rp.check_parameters_in_sync(synced))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    with torch.no_grad():
        if rank == 2:
            model[2].weight[0, 1] += 1e-3
        if rank == 1:
            model[1].running_mean += 1.0
    report = rp.check_parameters_in_sync(model, buffers=True)  # buffers are opt-in
    out["report"] = str(report)
    out["names"] = report.names
    out["tolerant"] = bool(rp.check_parameters_in_sync(model, atol=1e-2, buffers=False))

    # Gradients and optimizer state, which differ when a rank steps on unsynced gradients.
    optimizer = torch.optim.Adam(model.parameters())
    model.train()
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(rank))
    model(x).sum().backward()
    optimizer.step()
    deep = rp.check_parameters_in_sync(model, buffers=False, gradients=True, optimizer=optimizer)
    out["deep"] = deep.names

    other = nn.Linear(4, 3 if rank == 1 else 4)
    structure = rp.check_parameters_in_sync(other)
    out["structure"] = (bool(structure), str(structure))
    return out


def test_divergence_is_detected_and_named() -> None:
    results = run_distributed(_divergence, 3, timeout=90)
    for out in results:
        assert len(out["unsynced"]) == 6  # every weight and bias of the unbroadcast model
        assert out["synced"]
        assert out["names"] == ["2.weight", "buffer 1.running_mean"]
        assert "2.weight: rank 2 differs from ranks [0, 1]" in out["report"]
        assert "buffer 1.running_mean: rank 1 differs from ranks [0, 2]" in out["report"]
        assert out["tolerant"]
        assert "grad 0.weight" in out["deep"]
        assert "optimizer 0.weight.exp_avg" in out["deep"]
        assert "optimizer 0.weight.step" not in out["deep"]  # same count on every rank
        ok, text = out["structure"]
        assert not ok and "tensors on rank 1 differ from those on ranks [0, 2]" in text


# -- NCCL (only where there are GPUs) ----------------------------------------------------------


def _nccl_bf16_and_powersgd() -> list[bool]:
    synced = []
    for compression in ("bf16", "powersgd"):
        model = rp.wrap_model(mlp(), rp.DDPConfig(compression=compression, powersgd_start_iter=2))
        assert next(model.parameters()).device == rd.device()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            x, y = (t.to(rd.device()) for t in _local_batch(step))
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = nn.functional.mse_loss(model(x).float(), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        synced.append(bool(rp.check_parameters_in_sync(model)))
    return synced


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices for NCCL")
def test_nccl_compression_hooks() -> None:
    assert run_distributed(_nccl_bf16_and_powersgd, 2, backend="nccl", timeout=120) == [
        [True, True],
        [True, True],
    ]


def _different_models_without_broadcast() -> str:
    torch.manual_seed(0)
    width = 4 if rd.get_rank() == 0 else 3
    try:
        rp.wrap_model(nn.Linear(4, width), rp.DDPConfig(broadcast_parameters=False))
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_different_models_without_broadcast_fail_clearly_on_every_rank() -> None:
    # Without the check, DDP(init_sync=False) lets gloo abort a rank mid-all-reduce.
    messages = run_distributed(_different_models_without_broadcast, 2, timeout=60)
    for message in messages:
        assert "broadcast_parameters=False" in message and "differ" in message, message


def _powersgd_state_round_trip() -> dict[str, Any]:
    torch.manual_seed(0)
    cfg = rp.DDPConfig(compression="powersgd", powersgd_start_iter=2)
    model = rp.wrap_model(nn.Linear(16, 8), cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(4):
        opt.zero_grad()
        model(torch.randn(4, 16)).pow(2).mean().backward()
        opt.step()
    saved = rp.comm_state_dict(model)
    resumed = rp.wrap_model(nn.Linear(16, 8), cfg)
    rp.load_comm_state_dict(resumed, saved)
    errors = []
    try:
        rp.load_comm_state_dict(rp.wrap_model(nn.Linear(16, 8)), saved)
    except ValueError as exc:
        errors.append(str(exc))
    return {"saved": saved, "resumed": rp.comm_state_dict(resumed), "errors": errors}


def test_powersgd_state_survives_a_checkpoint_round_trip() -> None:
    for result in run_distributed(_powersgd_state_round_trip, 2, timeout=90):
        assert result["saved"]["powersgd"]["iter"] == 4
        assert result["resumed"] == result["saved"]  # counter and projection RNG restored
        assert len(result["errors"]) == 1 and "no PowerSGD hook" in result["errors"][0]
