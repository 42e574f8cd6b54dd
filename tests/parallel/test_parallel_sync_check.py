"""The divergence check never passes vacuously: FSDP2 / HSDP layouts, DDP buffers, empty models.

Multi-rank cases run on real gloo ranks; the replica-set maths is pure and tested without them.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import Replicate, Shard

import rankwise.parallel as rp
from helpers.training import mlp
from rankwise.testing import run_distributed


def _error(fn: Any, *args: Any, **kwargs: Any) -> str:
    try:
        fn(*args, **kwargs)
    except ValueError as exc:
        return str(exc)
    return "no error"


# -- FSDP2 and HSDP ----------------------------------------------------------------------------


def _fsdp_cases() -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank = dist.get_rank()
    out: dict[str, Any] = {}
    # Plain FSDP2 (Shard(0) on a 1-D mesh): each element lives on one rank, so the ranks can
    # only agree on the layout; the report must say it compared 4 tensors, not "all 0".
    sharded = rp.wrap_model(mlp(4, 6, 3), rp.FSDPConfig(), strategy="fsdp")
    sharded(torch.randn(2, 4)).sum().backward()
    report = rp.check_parameters_in_sync(sharded, gradients=True)
    out["sharded"] = (bool(report), report.checked, report.by_value, str(report))

    # HSDP (Replicate() x Shard(0) on a 2x1 mesh): both ranks hold a copy of every shard, so a
    # copy that drifted is divergence and must be named.
    hsdp = mlp(4, 6, 3)
    fully_shard(hsdp, mesh=init_device_mesh("cpu", (2, 1), mesh_dim_names=("replicate", "shard")))
    out["hsdp_in_sync"] = bool(rp.check_parameters_in_sync(hsdp))
    if rank == 1:
        with torch.no_grad():
            hsdp[2].weight.to_local()[0, 0] += 1e-3
    report = rp.check_parameters_in_sync(hsdp)
    out["hsdp"] = (report.names, str(report), report.checked)
    return out


def test_fsdp2_compares_layouts_and_hsdp_replicas() -> None:
    for out in run_distributed(_fsdp_cases, 2, timeout=120):
        ok, checked, by_value, text = out["sharded"]
        assert ok and checked == 8 and by_value == 0, out  # 4 parameters + 4 gradients
        assert "8 sharded with no replica" in text, text
        assert out["hsdp_in_sync"]
        names, text, checked = out["hsdp"]
        assert names == ["2.weight"] and checked == 4, out
        assert "2.weight: rank 1 differs from rank 0" in text, text


def test_replica_sets_follow_the_replicate_dims() -> None:
    from rankwise.parallel.sync_check import _replica_sets

    grid = torch.tensor([[0, 1], [2, 3]])
    assert _replica_sets(grid, (Replicate(), Shard(0))) == ((0, 2), (1, 3))  # HSDP
    assert _replica_sets(grid, (Shard(0), Replicate())) == ((0, 1), (2, 3))
    assert _replica_sets(grid, (Shard(0), Shard(0))) == ((0,), (1,), (2,), (3,))
    assert _replica_sets(torch.tensor([0, 1, 2]), (Replicate(),)) == ((0, 1, 2),)
    assert _replica_sets(torch.tensor([0, 1, 2]), (Shard(0),)) == ((0,), (1,), (2,))


def test_a_drifted_hsdp_copy_is_named_with_its_shard() -> None:
    from rankwise.parallel.sync_check import _compare_entry, _Entry

    # 2x2 HSDP mesh: ranks 0 and 2 hold shard 0, ranks 1 and 3 shard 1; rank 3's copy drifted.
    # Ranks 0 and 1 hold different shards, so their different checksums are no divergence.
    rows = torch.tensor(
        [[7.0, 0.1, 0.2, 0.3], [7.0, 0.5, 0.6, 0.7], [7.0, 0.1, 0.2, 0.3], [7.0, 0.5, 0.6, 0.9]],
        dtype=torch.float64,
    )
    entry = _Entry("2.weight", torch.zeros(1), torch.zeros(1), "", ((0, 2), (1, 3)))
    found, compared = _compare_entry(entry, rows, 0.0, 4)
    assert compared and [str(m) for m in found] == [
        "2.weight (shard 1): rank 3 differs from rank 1 (checksums differ by up to 0.2)"
    ]
    # A layout digest that differs on one rank is named as such, whatever the values.
    rows[2, 0] = 8.0
    found, _ = _compare_entry(entry, rows, 0.0, 4)
    assert [str(m) for m in found] == [
        "2.weight: rank 2 differs from ranks [0, 1, 3] (dtype or sharding placements differ)"
    ]


# -- DDP buffers -------------------------------------------------------------------------------


def _ddp_batchnorm() -> dict[str, Any]:
    model = rp.wrap_model(
        nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)),
        rp.DDPConfig(broadcast_buffers=False),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # Each rank normalises its own batch: running statistics drift apart, legitimately.
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(dist.get_rank()))
    model(x).square().mean().backward()
    optimizer.step()
    default = rp.check_parameters_in_sync(model)
    with_buffers = rp.check_parameters_in_sync(model, buffers=True)
    return {
        "default": (bool(default), default.checked),
        "buffers": (bool(with_buffers), with_buffers.names, with_buffers.checked),
    }


def test_ddp_buffers_are_compared_only_on_request() -> None:
    for out in run_distributed(_ddp_batchnorm, 2, timeout=90):
        assert out["default"] == (True, 6)
        ok, names, checked = out["buffers"]
        assert not ok and checked == 9
        assert names == ["buffer 1.running_mean", "buffer 1.running_var"]


# -- nothing to compare ------------------------------------------------------------------------


def _empty_model() -> str:
    return _error(rp.check_parameters_in_sync, nn.Sequential(nn.ReLU()))


def test_comparing_nothing_is_an_error_on_every_rank() -> None:
    for text in run_distributed(_empty_model, 2):
        assert "found nothing to compare in Sequential: it has 0 parameters" in text


def test_comparing_nothing_is_an_error_in_a_world_of_one() -> None:
    with pytest.raises(
        ValueError, match=r"Identity: it has 0 parameters\. Pass the model .*a check of nothing"
    ):
        rp.check_parameters_in_sync(nn.Identity())
    # Buffers only, and buffers not asked for: the message says how to include them.
    text = _error(rp.check_parameters_in_sync, nn.BatchNorm1d(3, affine=False))
    assert "0 parameters and 3 buffers (pass buffers=True to compare them)" in text
    assert rp.check_parameters_in_sync(nn.BatchNorm1d(3, affine=False), buffers=True).checked == 3
