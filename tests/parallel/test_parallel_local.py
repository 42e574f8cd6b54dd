"""rankwise.parallel in one process: configs, the world-of-one path, precision, activation
checkpointing."""

from __future__ import annotations

import copy
import importlib
import math

import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

import rankwise.parallel as rp
from helpers.training import mlp
from rankwise.parallel.hooks import load_powersgd_state_dict, powersgd_state_dict

# -- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bucket_size_mb": 0}, "bucket_size_mb (0) must be > 0"),
        ({"bucket_size_mb": True}, "bucket_size_mb (True)"),
        ({"compression": "int8"}, "compression ('int8') is not supported"),
        ({"powersgd_rank": 0}, "powersgd_rank (0) must be an integer >= 1"),
        ({"powersgd_start_iter": 1}, "powersgd_start_iter (1) must be an integer >= 2"),
        ({"static_graph": "yes"}, "static_graph ('yes') must be True or False"),
    ],
)
def test_ddp_config_rejects_bad_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rp.DDPConfig(**kwargs)  # type: ignore[arg-type]


def test_ddp_config_is_mutable_and_revalidated_by_wrap_model() -> None:
    cfg = rp.DDPConfig(compression="BF16")
    assert cfg.compression == "bf16"
    assert rp.DDPConfig(compression="none").compression is None
    cfg.bucket_size_mb = -1  # the CyxWiz guide sets fields one by one
    with pytest.raises(ValueError, match="bucket_size_mb"):
        rp.wrap_model(nn.Linear(2, 2), cfg)


def test_fsdp_config_validation_and_policy() -> None:
    with pytest.raises(ValueError, match="param_dtype \\('half'\\)"):
        rp.FSDPConfig(param_dtype="half")
    with pytest.raises(ValueError, match="block_types"):
        rp.FSDPConfig(block_types=(int,))  # type: ignore[arg-type]
    assert rp.FSDPConfig(param_dtype="bf16", reduce_dtype="bf16").policy().reduce_dtype == (
        torch.bfloat16
    )
    assert rp.FSDPConfig().policy().param_dtype is None


def test_wrap_model_argument_errors() -> None:
    net = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="strategy \\('ddp2'\\)"):
        rp.wrap_model(net, strategy="ddp2")
    with pytest.raises(TypeError, match="use strategy='fsdp'"):
        rp.wrap_model(net, rp.FSDPConfig())
    with pytest.raises(TypeError, match="takes an FSDPConfig"):
        rp.wrap_model(net, rp.DDPConfig(), strategy="fsdp")
    with pytest.raises(ValueError, match="already wrapped"):
        rp.wrap_model(nn.DataParallel(net))


def test_is_sync_step() -> None:
    assert [rp.is_sync_step(i, 1) for i in range(3)] == [True, True, True]
    assert [rp.is_sync_step(i, 4, total=6) for i in range(6)] == [
        False,
        False,
        False,
        True,
        False,
        True,
    ]
    with pytest.raises(ValueError, match="accumulation_steps \\(0\\)"):
        rp.is_sync_step(0, 0)
    with pytest.raises(ValueError, match="index \\(6\\)"):
        rp.is_sync_step(6, 2, total=6)


# -- a world of one ----------------------------------------------------------------------------


def test_world_of_one_ddp_is_the_plain_module_and_accumulate_is_a_no_op() -> None:
    net = mlp(dropout=0.0)
    reference = copy.deepcopy(net)
    model = rp.wrap_model(net, rp.DDPConfig(compression="powersgd"))
    assert model is net and rp.unwrap_model(model) is net
    assert rp.comm_stats(model) is None and rp.comm_state_dict(model) == {}
    x = torch.randn(8, 6)
    for i, chunk in enumerate(x.chunk(4)):
        with rp.accumulate(model, is_last=i == 3):
            (model(chunk).square().mean() / 4).backward()
    reference(x).square().mean().backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5)
    report = rp.check_parameters_in_sync(model, gradients=True)
    assert report and report.world_size == 1 and report.checked == 12
    assert rp.clip_grad_norm(model, 1e9) > 0


def test_world_of_one_other_strategies() -> None:
    net = nn.Linear(2, 2)
    assert rp.wrap_model(net, strategy="none") is net
    if torch.cuda.device_count() < 2:
        with pytest.warns(UserWarning, match="strategy='dp' needs 2 or more CUDA devices"):
            assert rp.wrap_model(net, strategy="dp") is net
    with pytest.warns(UserWarning, match="strategy='fsdp' in a world of one"):
        assert rp.wrap_model(net, rp.FSDPConfig(param_dtype="bf16"), strategy="fsdp") is net


# -- precision ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "dtype"), [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)]
)
def test_precision_autocasts_and_trains(mode: str, dtype: torch.dtype) -> None:
    model = mlp(dropout=0.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = rp.Precision(mode, device="cpu")
    x, y = torch.randn(32, 6), torch.randn(32, 3)
    losses = []
    for _ in range(20):
        with precision.autocast():
            out = model(x)
            loss = nn.functional.mse_loss(out.float(), y)
        assert out.dtype == dtype
        precision.backward(loss)
        norm = precision.clip_grad_norm_(model, 10.0, optimizer)
        assert math.isfinite(float(norm))
        assert precision.step(optimizer)
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0]
    assert (precision.scaler is not None) == (mode == "fp16")


def test_fp16_overflow_skips_the_step_and_scaler_state_round_trips() -> None:
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = rp.Precision("fp16", device="cpu", init_scale=1024.0)
    before = [p.detach().clone() for p in model.parameters()]
    with precision.autocast():
        loss = model(torch.full((2, 3), float("inf"))).float().sum()
    precision.backward(loss)
    assert precision.step(optimizer) is False  # inf gradients: the update is skipped
    for p, q in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, q)
    state = precision.state_dict()
    assert state == {"mode": "fp16", "scaler": state["scaler"]}
    assert state["scaler"]["scale"] == 512.0  # backed off once
    restored = rp.Precision("fp16", device="cpu")
    restored.load_state_dict(state)
    assert restored.scaler is not None and restored.scaler.get_scale() == 512.0
    with pytest.warns(UserWarning, match="saved with precision 'fp16'"):
        rp.Precision("bf16", device="cpu").load_state_dict(state)
    with pytest.raises(ValueError, match="not a Precision state"):
        restored.load_state_dict({"scale": 1.0})


def test_fp16_with_two_optimizers_unscales_each_once() -> None:
    # GAN-style: two models, two optimizers, both clipped, then stepped in one call.
    torch.manual_seed(0)
    a, b = nn.Linear(3, 1), nn.Linear(3, 1)
    oa, ob = torch.optim.SGD(a.parameters(), lr=1.0), torch.optim.SGD(b.parameters(), lr=1.0)
    precision = rp.Precision("fp16", device="cpu", init_scale=1024.0)
    x = torch.ones(4, 3)
    with precision.autocast():
        loss = a(x).float().sum() + b(x).float().sum()
    precision.backward(loss)
    precision.clip_grad_norm_(a, 100.0, oa)
    precision.clip_grad_norm_(b, 100.0, ob)
    expected = b.weight.grad.clone()  # unscaled once: the true gradient, 4 per weight
    before = b.weight.detach().clone()
    assert precision.step(oa, ob) is True
    assert torch.allclose(expected, torch.full_like(expected, 4.0))
    assert torch.allclose(b.weight, before - expected)  # not unscaled a second time
    with pytest.raises(ValueError, match="needs the optimizer"):
        precision.step()


def test_precision_errors() -> None:
    with pytest.raises(ValueError, match="precision mode \\('fp8'\\)"):
        rp.Precision("fp8")
    with pytest.raises(ValueError, match="needs the optimizer"):
        rp.Precision("fp16", device="cpu").clip_grad_norm_(nn.Linear(2, 2), 1.0)
    with pytest.raises(ValueError, match="max_norm \\(0\\)"):
        rp.clip_grad_norm(nn.Linear(2, 2), 0)


# -- gradient checkpointing --------------------------------------------------------------------


def test_activation_checkpointing_lives_apart_from_training_checkpoints() -> None:
    # "checkpointing" is the trainer's word for saved state; this module recomputes activations.
    activation = importlib.import_module("rankwise.parallel.activation")
    assert rp.enable_gradient_checkpointing is activation.enable_gradient_checkpointing
    assert rp.find_blocks is activation.find_blocks
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("rankwise.parallel.checkpointing")


def test_gradient_checkpointing_leaves_results_unchanged() -> None:
    plain = mlp(dropout=0.3)
    checkpointed = copy.deepcopy(plain)
    assert rp.enable_gradient_checkpointing(checkpointed) == ["0", "3", "5"]
    assert rp.enable_gradient_checkpointing(checkpointed) == ["0", "3", "5"]  # idempotent
    assert checkpointed.state_dict().keys() == plain.state_dict().keys()
    x = torch.randn(8, 6, requires_grad=True)
    torch.manual_seed(7)  # same dropout masks: checkpointing restores the RNG to recompute
    plain(x).square().sum().backward()
    torch.manual_seed(7)
    checkpointed(x).square().sum().backward()
    for p, q in zip(plain.parameters(), checkpointed.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)
    # A deep copy runs its own parameters, not the original's.
    clone = copy.deepcopy(checkpointed)
    with torch.no_grad():
        clone[0].weight.zero_()
        clone[0].bias.zero_()
    clone.eval()
    assert torch.equal(clone(torch.ones(1, 6)), clone[5](clone[4](clone[3](torch.zeros(1, 16)))))


def test_find_blocks_and_errors() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
            self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    net = Net()
    assert rp.find_blocks(net) == list(net.layers)  # the container with most parameters
    assert rp.find_blocks(net, nn.Linear) == [*net.stem, *net.layers]
    assert rp.enable_gradient_checkpointing(net, [net.stem]) == ["stem"]
    with pytest.raises(ValueError, match="found no blocks"):
        rp.enable_gradient_checkpointing(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="blocks must be"):
        rp.find_blocks(net, ["stem"])  # type: ignore[list-item]


# -- sync report and PowerSGD state ------------------------------------------------------------


def test_sync_report_text() -> None:
    two = rp.Mismatch("fc.weight", ((0, 1), (2,)), 0.25)
    assert (
        str(two) == "fc.weight: rank 2 differs from ranks [0, 1] (checksums differ by up to 0.25)"
    )
    three = rp.Mismatch("b", ((0, 3), (1,), (2,)), 1.0)
    assert "ranks disagree in 3 groups [0, 3] | [1] | [2]" in str(three)
    report = rp.SyncReport(world_size=4, checked=5, mismatches=(two, three))
    assert not report and report.names == ["fc.weight", "b"]
    assert str(report).startswith("2 of 5 tensors differ across 4 ranks:\n  fc.weight")
    with pytest.raises(ValueError, match="atol \\(-1\\)"):
        rp.check_parameters_in_sync(nn.Linear(2, 2), atol=-1)


def test_powersgd_state_round_trip() -> None:
    state = PowerSGDState(process_group=None, start_powerSGD_iter=2, random_seed=0)
    state.rng.randint(10)
    state.iter = 7
    state.error_dict[0] = torch.ones(3)
    saved = powersgd_state_dict(state)
    assert saved["iter"] == 7 and isinstance(saved["rng_state"][1], list)
    expected = state.rng.randint(1_000_000)
    fresh = PowerSGDState(process_group=None, start_powerSGD_iter=2, random_seed=0)
    fresh.error_dict[0] = torch.ones(3)
    load_powersgd_state_dict(fresh, saved)
    assert fresh.iter == 7 and fresh.error_dict == {}
    assert fresh.rng.randint(1_000_000) == expected
