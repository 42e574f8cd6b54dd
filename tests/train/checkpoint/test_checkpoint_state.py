"""Wrapping-independent checkpoint state on real gloo ranks: DDP <-> plain, FSDP2 2 -> 3 / 1 ranks,
optimizer state included; RNG state round trip."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import rankwise.distributed as rd
import rankwise.parallel as rp
import rankwise.train.checkpoint as ck
from helpers.training import mlp
from rankwise.testing import run_distributed

Tensors = dict[str, dict[str, torch.Tensor]]


SIZES = (6, 10, 3)  # 10 rows: uneven FSDP2 shards on 3 ranks


def _wrap(model: nn.Module, strategy: str) -> nn.Module:
    if strategy == "fsdp":
        return rp.wrap_model(model, rp.FSDPConfig(), strategy="fsdp")
    return rp.wrap_model(model, strategy=strategy)


def _full(t: torch.Tensor) -> torch.Tensor:
    full = t.full_tensor() if hasattr(t, "full_tensor") else t  # a collective for DTensors
    return full.detach().cpu().clone()


def _bytes(obj: Any) -> bytes:
    # Tensors sent back from a rank through a pipe travel as shared-memory handles that die with
    # the rank; bytes do not.
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _unbytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)


def _live(model: nn.Module, optimizer: torch.optim.Optimizer) -> Tensors:
    """Full parameters and Adam state by parameter name, read straight from the live objects."""
    out: Tensors = {}
    for name, p in rp.unwrap_model(model).named_parameters():
        out[name] = {"param": _full(p)}
        out[name].update({k: _full(v) for k, v in optimizer.state[p].items()})
    return out


def _save(directory: str, strategy: str) -> dict[str, Any]:
    model = _wrap(mlp(*SIZES, seed=0), strategy)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(3):
        g = torch.Generator().manual_seed(100 * step + rd.get_rank())
        model(torch.randn(4, 6, generator=g)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    state = {
        "model": ck.model_state_dict(model),
        "optimizer": ck.optimizer_state_dict(model, optimizer),
    }
    if rd.get_rank() == 0:
        ck.CheckpointManager(directory).save(state, epoch=0, step=3)
    return {"live": _bytes(_live(model, optimizer)), "keys": sorted(state["model"])}


def _load(directory: str, strategy: str, from_rank0: bool) -> dict[str, Any]:
    model = _wrap(mlp(*SIZES, seed=7), strategy)  # other weights: the load must overwrite them
    optimizer = torch.optim.Adam(model.parameters(), lr=0.5)
    state: dict[str, Any] = {"model": {}, "optimizer": {}}
    if rd.get_rank() == 0 or not from_rank0:
        found = ck.CheckpointManager(directory).load_latest()
        assert found is not None
        state = found[1]
    ck.load_model_state_dict(model, state["model"], from_rank0=from_rank0)
    ck.load_optimizer_state_dict(model, optimizer, state["optimizer"], from_rank0=from_rank0)
    return {"live": _bytes(_live(model, optimizer)), "lr": optimizer.param_groups[0]["lr"]}


def _file(directory: Path) -> Tensors:
    found = ck.CheckpointManager(directory).load_latest()
    assert found is not None
    model, optim = found[1]["model"], found[1]["optimizer"]
    assert optim["param_groups"][0]["lr"] == 0.01
    return {k: {"param": v, **optim["state"][k]} for k, v in model.items()}


def _assert_same(a: Tensors | bytes, b: Tensors | bytes) -> None:
    a, b = (_unbytes(x) if isinstance(x, bytes) else x for x in (a, b))
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].keys() == b[name].keys() == {"param", "step", "exp_avg", "exp_avg_sq"}
        for k in a[name]:
            assert torch.equal(a[name][k], b[name][k]), (name, k)


PLAIN_KEYS = ["0.bias", "0.weight", "2.bias", "2.weight"]


def test_ddp_checkpoint_on_two_ranks_loads_into_a_plain_model(tmp_path: Path) -> None:
    saved = run_distributed(_save, 2, args=(str(tmp_path), "ddp"), timeout=90)
    assert saved[0]["keys"] == saved[1]["keys"] == PLAIN_KEYS  # no "module." prefix
    in_file = _file(tmp_path)
    _assert_same(in_file, saved[0]["live"])
    _assert_same(saved[1]["live"], saved[0]["live"])
    loaded = _load(str(tmp_path), "none", from_rank0=False)  # this process: a world of one
    _assert_same(loaded["live"], in_file)
    assert loaded["lr"] == 0.01


@pytest.mark.parametrize("from_rank0", [False, True])
def test_plain_checkpoint_loads_into_ddp_on_two_ranks(tmp_path: Path, from_rank0: bool) -> None:
    saved = _save(str(tmp_path), "none")
    assert saved["keys"] == PLAIN_KEYS
    loaded = run_distributed(_load, 2, args=(str(tmp_path), "ddp", from_rank0), timeout=90)
    for rank in loaded:  # with from_rank0, rank 1 passed {} and got rank 0's state
        _assert_same(rank["live"], saved["live"])


@pytest.fixture(scope="module")
def fsdp_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    directory = tmp_path_factory.mktemp("fsdp")
    return directory, run_distributed(_save, 2, args=(str(directory), "fsdp"), timeout=90)


def test_fsdp2_state_is_gathered_on_rank_0(fsdp_checkpoint: tuple[Path, list[Any]]) -> None:
    directory, saved = fsdp_checkpoint
    assert saved[0]["keys"] == PLAIN_KEYS and saved[1]["keys"] == []  # rank 0 only
    _assert_same(_file(directory), saved[0]["live"])
    _assert_same(saved[1]["live"], saved[0]["live"])


def test_fsdp2_checkpoint_from_two_ranks_reshards_onto_three(
    fsdp_checkpoint: tuple[Path, list[Any]],
) -> None:
    directory, _ = fsdp_checkpoint
    loaded = run_distributed(_load, 3, args=(str(directory), "fsdp", True), timeout=90)
    in_file = _file(directory)
    for rank in loaded:
        _assert_same(rank["live"], in_file)
        assert rank["lr"] == 0.01


def test_fsdp2_checkpoint_loads_into_a_plain_model(fsdp_checkpoint: tuple[Path, list[Any]]) -> None:
    directory, _ = fsdp_checkpoint
    _assert_same(_load(str(directory), "none", from_rank0=False)["live"], _file(directory))


def _sharded_state_on_all_ranks() -> list[str]:
    model = _wrap(mlp(*SIZES, seed=0), "fsdp")
    state = ck.model_state_dict(model, all_ranks=True)
    assert all(type(v) is torch.Tensor and v.device.type == "cpu" for v in state.values())
    return sorted(state)


def test_all_ranks_option_gives_every_rank_the_full_state() -> None:
    assert run_distributed(_sharded_state_on_all_ranks, 2, timeout=90) == [PLAIN_KEYS] * 2


def test_a_never_stepped_optimizer_is_saved_without_a_fake_step() -> None:
    model = mlp(*SIZES, seed=0)
    fresh = torch.optim.Adam(model.parameters(), lr=0.01)
    state = ck.optimizer_state_dict(model, fresh)
    assert state["state"] == {} and not fresh.state  # DCP alone would run a zero step here
    assert state["param_groups"][0]["params"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    other_model = mlp(*SIZES, seed=0)
    other = torch.optim.Adam(other_model.parameters(), lr=0.9)
    ck.load_optimizer_state_dict(other_model, other, state)
    assert other.param_groups[0]["lr"] == 0.01 and not other.state
    x = torch.randn(5, 6)
    for net, opt in ((model, fresh), (other_model, other)):
        net(x).sum().backward()
        opt.step()
    for a, b in zip(model.parameters(), other_model.parameters(), strict=True):
        assert torch.equal(a, b)
    wrong = torch.optim.Adam(mlp(*SIZES, seed=0)[0].parameters())
    with pytest.raises(ValueError, match="not the model's"):
        ck.optimizer_state_dict(model, wrong)


def test_module_prefix_from_a_plain_ddp_state_dict_is_accepted() -> None:
    source = mlp(*SIZES, seed=0)
    prefixed = {f"module.{k}": v for k, v in source.state_dict().items()}
    target = mlp(*SIZES, seed=5)
    ck.load_model_state_dict(target, prefixed)
    assert all(
        torch.equal(a, b) for a, b in zip(target.parameters(), source.parameters(), strict=True)
    )


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_rng_state_round_trip_reproduces_the_same_draws(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.standard_normal()  # leaves a cached Gaussian in numpy's state
    state = ck.rng_state()
    expected = _draws()
    assert _draws() != expected  # the generators moved on
    set_to = ck.load_file(ck.save_file({"rng": state}, tmp_path / "rng.pt"))["rng"]
    ck.set_rng_state(set_to)
    assert _draws() == expected
    with pytest.raises(ValueError, match=r"lacks \['numpy'\]"):
        ck.set_rng_state({"python": state["python"], "torch": state["torch"]})


def test_no_process_group_is_needed_or_created() -> None:
    ck.model_state_dict(mlp(*SIZES, seed=0))
    assert not dist.is_initialized()
