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
from rankwise.train.closings import DONE, FIGURES, SAVE, WORKING, Closings, Position, _Section
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


def _sections_meet() -> list[float]:
    """Each rank stops where the lost peer's non-atomic collectives left it (set by hand:
    a real loss is the launch tests'), then does what catch_up's gather decides."""
    rank, got = rd.get_rank(), []
    model = nn.Linear(2, 2)
    state = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1), step=16)
    mark = Mark(16, None, None)

    def reduce(value: float) -> float:
        return float(rd.all_reduce(torch.tensor([value], dtype=torch.float64))[0])

    # 1. The figures' all-reduce ended on ranks 0 and 2 (at the barrier), failed on rank 1:
    #    all three do it again, in the same collective.
    closings = Closings()
    closings.in_steps(1)
    if rank != 1:
        closings._section = _Section((1, FIGURES), None, result=-1.0, done=True)
    closings.position = Position(1, FIGURES, WORKING if rank == 1 else DONE)
    catch_up(state, mark, "a test", closings)
    got.append(closings.run(1, FIGURES, lambda: reduce(rank + 1.0)))
    # 2. Rank 0 failed at the figures' barrier that ranks 1 and 2 passed (they are in the
    #    save's first collective): rank 0 keeps its result, and all meet in the save.
    closings = Closings()
    closings.position = Position(1, SAVE, WORKING)
    if rank == 0:
        closings._section = _Section((1, FIGURES), None, result=-2.0, done=True)
        closings.position = Position(1, FIGURES, DONE)
    catch_up(state, mark, "a test", closings)
    if rank == 0:
        got.append(closings.run(1, FIGURES, lambda: reduce(100.0)))  # not done again
    got.append(closings.run(1, SAVE, lambda: reduce(10.0 * (rank + 1))))
    return got


def test_survivors_stopped_in_and_past_a_closing_section_meet_in_the_same_collective() -> None:
    ranks = run_distributed(_sections_meet, 3)
    assert ranks[0] == [6.0, -2.0, 60.0]
    assert ranks[1] == ranks[2] == [6.0, 60.0]
