"""One interface for every place a run's numbers go: a :class:`Sink`.

rankwise writes to four: its own CSV file (:class:`~rankwise.train.tracking.csv_log.CsvLog`),
TensorBoard event files (:class:`~rankwise.train.tracking.tensorboard_log.TensorBoardLog`),
W&B and MLflow (:class:`~rankwise.train.tracking.wandb_tracker.WandbTracker`,
:class:`~rankwise.train.tracking.mlflow_tracker.MlflowTracker`). Each is given the same rows,
rank 0's only: a :class:`StepRow` every ``log_every_n_batches`` micro-batches and an
:class:`EpochRow` at each epoch's end, and writes them its own way (the CSV one row each, the
others scalars at a step). The experiment trackers share :class:`Tracker`, which turns rows
into metrics at a global step (``step/loss``, ``epoch/train_loss``, ...).

>>> class Printed(Tracker):
...     name, title, fix = "printed", "Printed", "nothing to fix"
...     def log_metrics(self, step, metrics):
...         print(step, metrics)
>>> Printed().log_step(StepRow(0, 10, 5, loss=None, samples_per_second=100.0))
5 {'step/samples_per_second': 100.0}
>>> Printed().log_epoch(EpochRow(0, 5, {"train_loss": 0.5}))
5 {'epoch/epoch': 1.0, 'epoch/train_loss': 0.5}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = ["EpochRow", "Sink", "StepRow", "Tracker", "tracker_metrics"]


@dataclass(frozen=True)
class StepRow:
    """``micro_batches`` micro-batches of epoch ``epoch`` (counted from 0) are done, counted
    from 1, and ``global_step`` optimizer steps in all. ``loss`` is None while no loss has
    reached the host yet (the trainer never waits for the device to show one)."""

    epoch: int
    micro_batches: int
    global_step: int
    loss: float | None
    samples_per_second: float


@dataclass(frozen=True)
class EpochRow:
    """Epoch ``epoch`` (counted from 0) is over after ``global_step`` optimizer steps (None:
    none seen yet); ``metrics`` are its numbers by name (``train_loss``, ``val_accuracy``,
    ``epoch_seconds``, ...), none of them None."""

    epoch: int
    global_step: int | None
    metrics: Mapping[str, float]


class Sink(Protocol):
    """One place a run's rows go, driven by rank 0.

    ``start(config, run_id)`` opens it: files are opened to append, a tracker starts a run
    with ``config`` (the hyper-parameters, plain values) or, given ``run_id``, goes on with
    that run; returns the run's id (None: files have no run). After it, ``last_step`` is the
    last global step it held already (None: new, or it cannot tell). ``log_step`` and
    ``log_epoch`` write a row; ``log_artifact(path)`` uploads a file (files: nothing);
    ``finish(failed)`` closes it (``failed``: the fit raised).
    """

    name: str
    last_step: int | None

    def start(self, config: Mapping[str, Any], run_id: str | None) -> str | None: ...

    def log_step(self, row: StepRow) -> None: ...

    def log_epoch(self, row: EpochRow) -> None: ...

    def log_artifact(self, path: Path) -> None: ...

    def finish(self, failed: bool = False) -> None: ...


def tracker_metrics(row: StepRow | EpochRow) -> tuple[int, dict[str, float]]:
    """A row as an experiment tracker logs it: ``(global step, {metric: number})``, Nones
    left out.

    >>> tracker_metrics(EpochRow(1, None, {"val_loss": 0.25}))
    (0, {'epoch/epoch': 2.0, 'epoch/val_loss': 0.25})
    """
    if isinstance(row, StepRow):
        step = row.global_step
        values: dict[str, float | None] = {
            "step/loss": row.loss,
            "step/samples_per_second": row.samples_per_second,
        }
    else:
        step = row.global_step or 0
        values = {"epoch/epoch": row.epoch + 1, **{f"epoch/{k}": v for k, v in row.metrics.items()}}
    return step, {k: float(v) for k, v in values.items() if v is not None}


class Tracker:
    """A :class:`Sink` over an experiment tracker: rows become metrics at a global step
    (:func:`tracker_metrics`), which a subclass logs in :meth:`log_metrics`.

    ``title`` names it as users do ("W&B", "MLflow"); ``fix`` says what to check when it
    fails (both in :class:`~rankwise.train.tracking.tracker_set.TrackerWarning`).
    """

    name: str
    title: str
    fix: str
    last_step: int | None = None

    def start(self, config: Mapping[str, Any], run_id: str | None) -> str:
        raise NotImplementedError

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        raise NotImplementedError

    def log_step(self, row: StepRow) -> None:
        self.log_metrics(*tracker_metrics(row))

    def log_epoch(self, row: EpochRow) -> None:
        self.log_metrics(*tracker_metrics(row))

    def log_artifact(self, path: Path) -> None:
        raise NotImplementedError

    def finish(self, failed: bool = False) -> None:
        raise NotImplementedError
