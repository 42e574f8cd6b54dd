"""The training state as one object: plain values out, the same run back in, on another
world size, through a file and from a live peer over the process group."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from helpers.training import classification
from rankwise.testing import run_distributed
from rankwise.train import DistributedTrainer, DistributedTrainingConfig
from rankwise.train.checkpoint import snapshot
from rankwise.train.state import TrainState, broadcast_state

PLAIN = (int, float, str, bool, bytes, type(None), torch.Tensor)


def _plain_leaves(value: Any, where: str = "state") -> list[str]:
    """Paths of the leaves that are not plain values (tensors, numbers, strings)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _plain_leaves(v, f"{where}[{k!r}]")]
    if isinstance(value, list | tuple):
        return [p for i, v in enumerate(value) for p in _plain_leaves(v, f"{where}[{i}]")]
    return [] if isinstance(value, PLAIN) else [f"{where}: {type(value).__name__}"]


class _StopAt(Exception):
    pass


def _trained_state(stop_at: int) -> TrainState:
    """A trainer stopped mid-epoch after ``stop_at`` optimizer steps (Adam: it has state)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    trainer = DistributedTrainer(
        model, nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters(), lr=0.01)
    )

    def stop(_t: Any, _epoch: int, step: int, _ids: Any) -> None:
        if step == stop_at:
            raise _StopAt

    trainer.on_batch = stop
    cfg = DistributedTrainingConfig(epochs=2, batch_size=8, verbose=False, checkpoint_dir=None)
    with pytest.raises(_StopAt):
        trainer.fit(*classification(96, 6, 3, seed=5), cfg)
    return trainer.state


def _fresh_state() -> TrainState:
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    return TrainState(model, torch.optim.Adam(model.parameters(), lr=0.01))


def test_state_dict_is_plain_values_and_round_trips_in_a_world_of_one() -> None:
    state = _trained_state(stop_at=3)
    saved = state.state_dict()
    assert _plain_leaves(saved) == []
    assert (saved["epoch"], saved["step"], saved["world_size"]) == (0, 3, 1)
    assert saved["sampler"]["consumed"] > 0  # mid-epoch: the cursor moved
    other = _fresh_state()
    other.load_state_dict(saved)
    assert (other.epoch, other.step) == (0, 3)
    assert other.sums is not None and other.sums.carried == saved["trainer"]["epoch_sums"]
    assert other.restored is not None and other.restored.cursor == saved["sampler"]
    again = other.state_dict()
    for key in ("model", "optimizer"):
        flat_a, flat_b = _tensors(saved[key]), _tensors(again[key])
        assert flat_a.keys() == flat_b.keys()
        assert all(torch.equal(flat_a[k], flat_b[k]) for k in flat_a), key


def _tensors(value: Any, where: str = "") -> dict[str, torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return {where: value}
    if isinstance(value, dict):
        return {p: t for k, v in value.items() for p, t in _tensors(v, f"{where}/{k}").items()}
    if isinstance(value, list | tuple):
        return {p: t for i, v in enumerate(value) for p, t in _tensors(v, f"{where}/{i}").items()}
    return {}


def test_snapshot_keeps_the_state_of_its_step_while_training_goes_on() -> None:
    state = _trained_state(stop_at=2)
    taken = snapshot(state.state_dict())
    before = {k: v.clone() for k, v in taken["model"].items()}
    with torch.no_grad():
        for p in state.model.parameters():
            p.add_(1.0)
    assert all(torch.equal(taken["model"][k], v) for k, v in before.items())
    refilled = snapshot(state.state_dict(), into=taken)
    key = next(iter(before))
    assert refilled["model"][key] is taken["model"][key]  # the buffer was reused
    assert torch.equal(refilled["model"][key], before[key] + 1.0)


def test_a_state_from_two_ranks_loads_in_a_world_of_one(tmp_path: Path) -> None:
    path = tmp_path / "state.pt"
    run_distributed(_save_on_two_ranks, 2, args=(str(path),), timeout=90)
    saved = torch.load(path, weights_only=False)
    assert saved["world_size"] == 2 and len(saved["trainer"]["rng_per_rank"]) == 2
    state = _fresh_state()
    state.load_state_dict(saved, path)
    assert (state.epoch, state.step) == (saved["epoch"], saved["step"])
    model = state.model.state_dict()
    assert all(torch.equal(model[k], v) for k, v in saved["model"].items())
    # A world of one takes rank 0's random stream (there is no right answer for the others).
    assert torch.equal(torch.get_rng_state(), saved["rng"]["torch"])


def _save_on_two_ranks(path: str) -> None:
    import rankwise.distributed as rd

    saved = _trained_state(stop_at=2).state_dict()  # a collective: sums, RNGs
    if rd.get_rank() == 0:
        torch.save(saved, path)


def _send_from_rank_zero() -> dict[str, Any]:
    import rankwise.distributed as rd

    state = _trained_state(stop_at=4)
    saved = state.state_dict()
    if rd.get_rank() == 1:  # the joining rank: a fresh model, nothing trained
        torch.manual_seed(123)
        state = _fresh_state()
    received = broadcast_state(saved if rd.get_rank() == 0 else None, src=0)
    state.load_state_dict(received, "rank 0")
    return {
        "weights": [p.detach().clone() for p in state.model.parameters()],
        "adam": _tensors(state.optimizer.state_dict()["state"]) if state.optimizer else {},
        "where": (state.epoch, state.step, state.restored.cursor if state.restored else None),
        "saved_step": saved["step"],
    }


def test_a_live_peer_sends_its_state_over_the_process_group() -> None:
    sender, joiner = run_distributed(_send_from_rank_zero, 2, timeout=90)
    assert sender["saved_step"] == 4
    assert joiner["where"] == sender["where"]
    assert all(torch.equal(a, b) for a, b in zip(sender["weights"], joiner["weights"], strict=True))
    assert sender["adam"].keys() == joiner["adam"].keys() and sender["adam"]
    assert all(torch.equal(sender["adam"][k], joiner["adam"][k]) for k in sender["adam"])


def test_broadcast_state_in_a_world_of_one_returns_the_state_itself() -> None:
    state = {"a": torch.arange(3), "b": [1, (2.0, "x")]}
    assert broadcast_state(state) is state
    with pytest.raises(ValueError, match="needs the state"):
        broadcast_state(None)
