"""TrackerSet: the fan-out's rules, with a tracker written here that keeps what it is given (the
real W&B and MLflow runs are in tests/integrations/test_integrations_trackers.py).

Pure: no process group, no tracker package needed.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from rankwise.train import DistributedTrainingHistory, TrackerWarning, save_file
from rankwise.train.tracking import (
    EpochRow,
    StepRow,
    Tracker,
    TrackerSet,
    require,
    run_artifacts,
)


def step_row(step: int, loss: float | None = 0.5) -> StepRow:
    return StepRow(0, step, step, loss=loss, samples_per_second=100.0)


class Notebook(Tracker):
    """A tracker that writes into lists (rows as the Tracker base turns them into metrics);
    ``fail_on`` names the call that raises."""

    title, fix = "Notebook", "check the notebook"

    def __init__(self, name: str, last_step: int | None = None, fail_on: str = "") -> None:
        self.name, self.held, self.fail_on = name, last_step, fail_on
        self.last_step: int | None = None
        self.rows: list[tuple[int, dict[str, float]]] = []
        self.started: list[str | None] = []
        self.finished: list[bool] = []

    def _maybe_fail(self, call: str) -> None:
        if call == self.fail_on:
            raise ConnectionError(f"{self.name} is down (token=s3cr3t-value)")

    def start(self, config: Mapping[str, Any], run_id: str | None) -> str:
        self._maybe_fail("start")
        self.started.append(run_id)
        self.last_step = self.held if run_id is not None else None
        return run_id or f"{self.name}-1"

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._maybe_fail("log")
        self.rows.append((step, dict(metrics)))

    def log_artifact(self, path: Path) -> None:
        self._maybe_fail("artifact")

    def finish(self, failed: bool = False) -> None:
        self.finished.append(failed)


def caught_warnings(fn: Any, *args: Any) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(*args)
    return [str(w.message) for w in caught if issubclass(w.category, TrackerWarning)]


def test_a_failing_tracker_warns_once_is_switched_off_and_the_others_go_on() -> None:
    broken, fine = Notebook("broken", fail_on="log"), Notebook("fine")
    trackers = TrackerSet([broken, fine], {"broken": {"token": "s3cr3t-value"}})
    assert trackers.start({"lr": 0.1}, {}) == {"broken": "broken-1", "fine": "fine-1"}

    def steps() -> None:
        for step in range(1, 4):
            trackers.log_step(step_row(step, loss=None if step == 1 else 1.0 / step))

    [message] = caught_warnings(steps)
    assert "the Notebook tracker (broken) failed to log metrics (ConnectionError" in message
    assert "training goes on without it" in message and "Fix: check the notebook." in message
    assert "s3cr3t-value" not in message  # a credential in the library's text is scrubbed
    assert [step for step, _ in fine.rows] == [1, 2, 3]
    assert fine.rows[0][1] == {"step/samples_per_second": 100.0}  # a loss of None: left out
    assert fine.rows[1][1] == {"step/loss": 0.5, "step/samples_per_second": 100.0}
    assert trackers.failed == {"broken"}
    trackers.finish()
    assert (broken.finished, fine.finished) == ([], [False])
    # Off for the rest of the process: a new rank 0's start does not bring it back.
    assert trackers.start({}, {"broken": "b", "fine": "f"}, resume_only=True) == {"fine": "f"}


def test_a_tracker_that_cannot_start_warns_and_the_fit_goes_on() -> None:
    down = Notebook("down", fail_on="start")
    trackers = TrackerSet([down])
    [message] = caught_warnings(trackers.start, {}, {})
    assert "failed to start a run" in message
    assert not trackers and trackers.running == []
    trackers.log_step(step_row(1))  # nothing to send to: no error, no warning


def test_a_long_error_keeps_its_end_where_the_cause_is() -> None:
    class Verbose(Notebook):
        def start(self, config: Mapping[str, Any], run_id: str | None) -> str:
            raise ConnectionError("Max retries exceeded " * 60 + "(Connection refused)")

    [message] = caught_warnings(TrackerSet([Verbose("verbose")]).start, {}, {})
    assert " ... " in message and "(Connection refused)); training goes on" in message
    assert len(message) < 1000


def test_a_wandb_option_wandb_init_does_not_take_names_it_and_the_fix() -> None:
    pytest.importorskip("wandb")
    from rankwise.train.tracking import WandbTracker

    trackers = TrackerSet([WandbTracker({"projct": "mnist"})])
    [message] = caught_warnings(trackers.start, {}, {})  # before wandb.init: nothing started
    assert "logger_options['wandb'] has 'projct', which wandb.init() does not take" in message
    assert "(did you mean 'project'?)" in message
    assert "Fix: correct logger_options['wandb']." in message


def test_steps_a_resumed_run_holds_are_not_sent_again() -> None:
    asked = Notebook("asked", last_step=7)  # the run says how far it got
    offline = Notebook("offline")  # it cannot say: rankwise's own CSV tells (8)
    fresh = Notebook("fresh")  # a new run: nothing to skip
    trackers = TrackerSet([asked, offline, fresh])
    ids = trackers.start({}, {"asked": "a", "offline": "o"}, logged_through=8)
    assert ids == {"asked": "a", "offline": "o", "fresh": "fresh-1"}
    for step in range(6, 11):
        trackers.log_step(step_row(step))
    trackers.log_epoch(EpochRow(0, 10, {"train_loss": 0.25}))  # at the epoch's global step
    assert [s for s, _ in asked.rows] == [8, 9, 10, 10]
    assert [s for s, _ in offline.rows] == [9, 10, 10]
    assert [s for s, _ in fresh.rows] == [6, 7, 8, 9, 10, 10]
    assert fresh.rows[-1][1] == {"epoch/epoch": 1.0, "epoch/train_loss": 0.25}


def test_a_new_rank_0_resumes_only_the_runs_it_has_ids_for() -> None:
    kept, lost = Notebook("kept"), Notebook("lost")
    trackers = TrackerSet([kept, lost])
    assert trackers.start({}, {"kept": "k"}, resume_only=True) == {"kept": "k"}
    assert (kept.started, lost.started) == (["k"], [])


def test_run_artifacts_are_the_history_and_the_final_manifest(tmp_path: Path) -> None:
    history = DistributedTrainingHistory()
    history.append_epoch(0.5, 0.75, None, None, 1.0)
    checkpoint = save_file({"w": torch.ones(2)}, tmp_path / "ckpt.pt")
    files = run_artifacts(history, checkpoint, None, tmp_path / "out")
    names = [f.name for f in files]
    assert names[0] == "history.json" and names[-1] == "ckpt.pt.sha256.json"
    assert all(f.is_file() for f in files)


def test_require_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # as on a machine without it
    with pytest.raises(ImportError, match=r"pip install 'rankwise\[wandb\]'"):
        require(["csv", "wandb"])
    require(["csv", "tensorboard"])  # installed with the dev extra


def test_default_loggers_do_not_need_tensorboard(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    # loggers=None writes TensorBoard files only where tensorboard is installed (the demo extra
    # does not bring it): a fit on a machine without it trains and writes the CSV.
    import sys

    from rankwise.train import DistributedTrainer, DistributedTrainingConfig

    for name in ("tensorboard", "torch.utils.tensorboard"):
        monkeypatch.setitem(sys.modules, name, None)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    trainer = DistributedTrainer(
        model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1)
    )
    cfg = DistributedTrainingConfig(epochs=1, batch_size=8, log_dir=str(tmp_path / "logs"))
    cfg.checkpoint_dir = None
    cfg.verbose = False
    trainer.fit(torch.randn(32, 4), torch.randint(0, 2, (32,)), cfg)
    assert (tmp_path / "logs" / "metrics.csv").is_file()
    assert not list((tmp_path / "logs").glob("events.out.tfevents.*"))
