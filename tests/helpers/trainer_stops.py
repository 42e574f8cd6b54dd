"""Stopping a ``fit`` mid-run as a crash would, and seeing where each ``fit`` started: what the
resume tests share (test_train_trainer_resume, test_checkpoint_sharded_ranks,
test_checkpoint_resume_refusals)."""

from __future__ import annotations

from typing import Any

from rankwise.train import DistributedTrainer


class Stop(Exception):
    """Raised in the micro-batch of the chosen optimizer step (see :func:`stop_in_step`)."""


def stop_in_step(trainer: DistributedTrainer, step: int | None) -> None:
    """Make ``trainer.fit`` raise :class:`Stop` in optimizer step ``step`` (None: never)."""
    if step is None:
        return

    def stop(_trainer: Any, _epoch: int, done: int, _ids: Any) -> None:
        if done == step:
            raise Stop

    trainer.on_batch = stop


def fit_starts(trainer: DistributedTrainer) -> list[int]:
    """A list that gets ``trainer.global_step`` at each ``fit`` start (after any resume)."""
    started: list[int] = []
    probe = type("Probe", (), {"on_fit_start": lambda _self, t: started.append(t.global_step)})
    trainer.callbacks.append(probe())
    return started
