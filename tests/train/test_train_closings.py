"""The closing sections of continue mode (rankwise.train.closings), against a model of the
collectives between two epochs' steps.

The model is the sequence of collectives every rank makes: an epoch's steps (one collective
each), its figures (an all-reduce, then the barrier), its save (0-3 collectives, then the
barrier) and, after the last epoch, the end of fit's save (no barrier). A peer dies inside one
collective; each survivor either got through it (and then fails in the next one, which needs
the dead peer) or failed in it: a collective is not atomic. From where each survivor stopped
the real :func:`after_regroup` decides, and the model follows the code's moves (past the
section, or the section again from its start; catch_up for the steps). The property: every
survivor's next collective is the same one, no survivor goes past a section whose work it did
not finish, and none does again a section whose barrier a survivor passed.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwise.distributed.membership import RegroupError
from rankwise.train.closings import (
    COMMITTED,
    DONE,
    END,
    FIGURES,
    SAVE,
    STEPS,
    WORKING,
    Closings,
    Position,
    after_regroup,
)


def _collectives(epochs: int, steps: int, save_sizes: list[int], end_size: int) -> list[Any]:
    """Every collective in order, each ``(epoch, stage, index, is_barrier)``."""
    out: list[Any] = []
    for e in range(epochs):
        out += [(e, STEPS, i, False) for i in range(steps)]
        out += [(e, FIGURES, 0, False), (e, FIGURES, 1, True)]
        out += [(e, SAVE, i, False) for i in range(save_sizes[e])] + [
            (e, SAVE, save_sizes[e], True)
        ]
    out += [(epochs - 1, END, i, False) for i in range(end_size)]
    return out


def _position(c: Any) -> Position:
    e, stage, _, barrier = c
    return Position(e, stage, DONE if barrier else WORKING)


def _next(collectives: list[Any], failed_at: list[int], rank: int, advance: bool) -> Any:
    """The collective rank ``rank`` makes next, as the code moves after the regroup."""
    e, stage, _, _ = collectives[failed_at[rank]]
    if stage == STEPS:
        # catch_up: a rank a step behind takes the furthest state; if a survivor is already
        # in the figures, the epoch is over for all (epoch_over) and the figures start.
        furthest = collectives[max(failed_at)]
        if furthest[1] == FIGURES:
            return (e, FIGURES, 0, False)
        return furthest  # the furthest survivor's step, trained again by all
    first = next(i for i, c in enumerate(collectives) if c[:2] == (e, stage))
    if not advance:
        return collectives[first]
    after = max(i for i, c in enumerate(collectives) if c[:2] == (e, stage)) + 1
    return collectives[after] if after < len(collectives) else "fit ends"


@st.composite
def _failures(draw: st.DrawFn) -> tuple[list[Any], list[int]]:
    epochs = draw(st.integers(1, 3))
    saves = draw(st.lists(st.integers(0, 3), min_size=epochs, max_size=epochs))
    collectives = _collectives(epochs, draw(st.integers(1, 3)), saves, draw(st.integers(0, 2)))
    # the peer dies in collective j; j + 1 exists (a survivor that got through j fails there)
    j = draw(st.integers(0, len(collectives) - 2))
    survivors = draw(st.integers(2, 4))
    through = draw(st.lists(st.booleans(), min_size=survivors, max_size=survivors))
    return collectives, [j + 1 if t else j for t in through]


@settings(max_examples=400, deadline=None)
@given(_failures())
def test_after_a_regroup_every_survivor_makes_the_same_next_collective(case: Any) -> None:
    collectives, failed_at = case
    positions = [_position(collectives[i]) for i in failed_at]
    moves = [after_regroup(positions, rank) for rank in range(len(positions))]
    nexts = [_next(collectives, failed_at, r, moves[r]) for r in range(len(positions))]
    assert len(set(nexts)) == 1, (positions, moves, nexts)
    for rank, advance in enumerate(moves):
        if advance:  # past its section: its own work was done, and so was everyone's
            assert positions[rank].phase == DONE
            assert all(collectives[i][:2] != (*positions[rank][:2],) or collectives[i][3]
                       for i in failed_at)  # fmt: skip
    # A section is done again only where no survivor passed its barrier.
    redone = {(p.epoch, p.stage) for p, a in zip(positions, moves, strict=True) if not a}
    passed = {collectives[i - 1][:2] for i in failed_at if i and collectives[i - 1][3]}
    assert not redone & passed


@pytest.mark.parametrize(
    ("positions", "said"),
    [
        # two sections apart: the figures' work not done, the others in the next epoch
        ([Position(1, FIGURES, WORKING), Position(2, STEPS)], "rank 0: epoch 1's figures"),
        # the save's barrier passed while a survivor had not done the figures' work
        ([Position(1, FIGURES, WORKING), Position(1, SAVE, WORKING)], "epoch 1's save"),
        # a step behind a survivor that finished the figures' work
        ([Position(0, STEPS), Position(0, FIGURES, DONE)], "epoch 0's steps"),
        # past the figures' barrier straight into the next epoch's steps: the save skipped
        ([Position(1, FIGURES, DONE), Position(2, STEPS)], "epoch 2's steps"),
        # three places at once
        ([Position(1, FIGURES, DONE), Position(1, SAVE, WORKING), Position(2, STEPS)], "save"),
        # a rank past a barrier and in no section: no recovered collective runs there
        ([Position(1, SAVE, DONE), Position(1, SAVE, COMMITTED)], "(committed)"),
    ],
)
def test_positions_no_lost_peer_explains_stop_the_job(positions: list[Position], said: str) -> None:
    with pytest.raises(RegroupError, match=said) as caught:
        after_regroup(positions, 0)
    assert "relaunch with resume='auto'" in str(caught.value)


class _Kept:
    """A stand-in for the checkpointer's choices (what a retried section restores)."""

    def __init__(self) -> None:
        self.choice = "step 16 due"

    def snapshot(self) -> str:
        return self.choice

    def restore(self, snapshot: str) -> None:
        self.choice = snapshot


def test_a_section_done_again_starts_from_its_first_choices_and_a_finished_one_is_skipped() -> None:
    closings, kept, calls = Closings(), _Kept(), []

    def work() -> str:
        calls.append(kept.choice)
        kept.choice = "step 16 saved"  # what the first try changed before it failed
        if len(calls) == 1:
            raise RuntimeError("a peer was lost")
        return "saved"

    closings.in_steps(1)
    with pytest.raises(RuntimeError):
        closings.run(1, SAVE, work, kept)
    assert closings.position == Position(1, SAVE, WORKING)
    closings.regrouped([closings.position, Position(1, SAVE, DONE)], 0)  # do it again
    assert closings.run(1, SAVE, work, kept) == "saved"
    assert calls == ["step 16 due", "step 16 due"]  # the retry saw the first try's choices
    assert closings.position == Position(1, SAVE, COMMITTED)
    # Past a section every survivor finished (this rank at its barrier): not done again.
    closings._section.done, closings.position = True, Position(1, SAVE, DONE)  # type: ignore[union-attr]
    closings.regrouped([closings.position, Position(1, END)], 0)
    assert closings.run(1, SAVE, work, kept) == "saved" and len(calls) == 2
    assert closings.run(1, END, lambda: "ended", kept, commit=False) == "ended"


@pytest.mark.parametrize("ran_last_after_step", [True, False])
def test_the_deferred_step_save_is_read_from_the_state_not_from_who_ran_the_step(
    tmp_path: Any, ran_last_after_step: bool
) -> None:
    """After a regroup a survivor a step behind takes a peer's state at the epoch's last step
    (catch_up) and never runs that step's ``after_step``: its ``after_epoch`` must save the
    deferred step checkpoint all the same, or the others' save meets its barrier."""
    import torch
    from torch import nn

    from rankwise.train import DistributedTrainingConfig
    from rankwise.train.checkpoint import Checkpointer, CheckpointManager
    from rankwise.train.state import TrainState

    cfg = DistributedTrainingConfig(
        checkpoint_dir=str(tmp_path), checkpoint_every_n_steps=3, checkpoint_every_n_epochs=0,
        async_checkpoints=False, verbose=False,
    )  # fmt: skip
    model = nn.Linear(2, 2)
    state = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1), step=6)
    checkpointer = Checkpointer(CheckpointManager(tmp_path), cfg, on_saved=lambda path: None)
    if ran_last_after_step:
        checkpointer.after_step(state, ends_epoch=True)  # the epoch's last step: deferred
    assert not list(tmp_path.glob("*.pt"))
    state.epoch = 1  # the epoch closed
    path = checkpointer.after_epoch(state, 0)
    assert path is not None and [p.name for p in tmp_path.glob("*.pt")] == [path.name]
    assert checkpointer.after_epoch(state, 0) is None  # saved: not again
