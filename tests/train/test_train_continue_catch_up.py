"""Survivors one optimizer step apart (rankwise.train.continuing.catch_up) on 3 real gloo ranks.

In a ring all-reduce a rank that received every chunk returns while a peer still waiting for
the lost rank's fails: after the regroup one survivor is a step ahead. Here ranks 0 and 2
take one more optimizer step than rank 1 (the step the lost rank's gradient went into), then
all three call ``catch_up`` as ``Continuing.recover`` does: rank 1 must end with rank 0's
model, optimizer state, step and cursor, and keep its own sums and random stream."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import rankwise.distributed as rd
from rankwise.distributed.membership import RegroupError
from rankwise.testing import run_distributed
from rankwise.train.continuing import Mark, catch_up
from rankwise.train.state import TrainState
from rankwise.train.sums import EpochSums


def _rank_catches_up() -> dict[str, Any]:
    torch.manual_seed(0)  # the same model on every rank, as DDP keeps it
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    state = TrainState(model, optimizer, sums=EpochSums(), step=4)
    ahead = rd.get_rank() in (0, 2)
    if ahead:  # the step rank 1 lost in the failed all-reduce: the same gradient on both
        for p in model.parameters():
            p.grad = torch.full_like(p, 0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state.step = 5
    state.sums.losses.append(torch.tensor(float(rd.get_rank())))  # its own
    own_sums = state.sums
    torch.manual_seed(100 + rd.get_rank())  # its own random stream
    cursor = {"epoch": 0, "consumed": 60 if ahead else 48, "from": rd.get_rank()}
    mark = Mark(state.step, cursor, own_sums.length())
    agreed = catch_up(state, mark, "a test")
    after_rng = torch.rand(1)
    torch.manual_seed(100 + rd.get_rank())
    out = {
        "step": (agreed.step, state.step),
        "cursor": agreed.cursor,
        "params": [p.detach().clone() for p in model.parameters()],
        "exp_avg": [optimizer.state[p]["exp_avg"].clone() for p in model.parameters()],
        "own_sums": state.sums is own_sums and agreed.sums == mark.sums,
        "own_rng": torch.equal(after_rng, torch.rand(1)),
        "restored": state.restored,
    }
    # Two steps apart: no lost peer explains it, and every rank stops naming the steps.
    far = Mark(state.step - 2 if rd.get_rank() == 1 else state.step, agreed.cursor, None)
    with pytest.raises(RegroupError, match=r"optimizer steps \[5, 3, 5\] after a second test"):
        catch_up(state, far, "a second test")
    return out


def test_a_survivor_a_step_behind_takes_the_furthest_state() -> None:
    ranks = run_distributed(_rank_catches_up, 3)
    for rank, r in enumerate(ranks):
        assert r["step"] == (5, 5)
        # Rank 1 takes rank 0's cursor (the first of the furthest); those ahead keep theirs.
        assert r["cursor"] == {"epoch": 0, "consumed": 60, "from": 2 if rank == 2 else 0}
        assert r["own_sums"] and r["own_rng"] and r["restored"] is None
        for name in ("params", "exp_avg"):
            assert all(torch.equal(a, b) for a, b in zip(r[name], ranks[0][name], strict=True))
    # The step was taken: rank 1's parameters are not where they started.
    torch.manual_seed(0)
    start = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    assert not torch.equal(ranks[1]["params"][0], start[0].weight.detach())
