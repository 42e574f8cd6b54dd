"""TrainingLogger: console lines, progress bar, CSV and TensorBoard files, silence off rank 0.

Pure: the logger is told whether it is the master, so no process group is needed.
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import pytest
import torch

from rankwise.train.tracking import CSV_COLUMNS, TrainingLogger


def run_epochs(logger: TrainingLogger, epochs: int = 2, steps: int = 12) -> None:
    """Feed the logger what the trainer would: every step, then the epoch's metrics."""
    for epoch in range(epochs):
        logger.start_epoch(epoch, steps)
        for step in range(1, steps + 1):
            logger.step(step, epoch * steps + step, loss=1.0 / step, samples_per_second=1234.5)
        metrics = {"train_loss": 0.5 - epoch / 10, "train_accuracy": 0.8, "val_loss": None}
        logger.end_epoch(epoch, {**metrics, "epoch_seconds": 1.5, "grad_norm": 2.0})
    logger.close()


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_lines_every_n_steps_and_epoch_summaries(capsys: pytest.CaptureFixture[str]) -> None:
    logger = TrainingLogger(None, True, log_every_n_batches=5, is_master=True, epochs=2)
    run_epochs(logger)  # under capsys stderr is no terminal: lines, not a bar
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "epoch 1/2 batch 5/12 loss 0.2000 1,234 samples/s",
        "epoch 1/2 batch 10/12 loss 0.1000 1,234 samples/s",
        "epoch 1/2 done: train_loss 0.5000 train_accuracy 80.00% epoch_seconds 1.5s grad_norm 2.0000",
        "epoch 2/2 batch 5/12 loss 0.2000 1,234 samples/s",
        "epoch 2/2 batch 10/12 loss 0.1000 1,234 samples/s",
        "epoch 2/2 done: train_loss 0.4000 train_accuracy 80.00% epoch_seconds 1.5s grad_norm 2.0000",
    ]
    assert err == ""


def test_forced_progress_bar_shows_loss_and_samples_per_second(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logger = TrainingLogger(None, True, 5, is_master=True, progress_bar=True, epochs=2)
    run_epochs(logger)
    out, err = capsys.readouterr()
    assert "epoch 1/2" in err and "epoch 2/2" in err
    assert "12/12" in err and "loss 0.0833, 1,234 samples/s" in err  # the last step's postfix
    assert "batch 5/12" not in out  # the bar replaces the step lines
    assert "epoch 2/2 done: train_loss 0.4000" in out


def test_quiet_when_not_verbose_but_still_logs_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_epochs(TrainingLogger(tmp_path, False, 5, is_master=True, progress_bar=True))
    assert capsys.readouterr() == ("", "")
    assert len(read_csv(tmp_path / "metrics.csv")) == 2 * 2 + 2


def test_non_master_prints_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_dir = tmp_path / "logs"
    run_epochs(TrainingLogger(log_dir, True, 1, is_master=False, progress_bar=True))
    assert capsys.readouterr() == ("", "")
    assert not log_dir.exists()


def test_follow_hands_the_log_to_a_new_rank_zero(tmp_path: Path) -> None:
    # --on-failure continue: rank 0 died, this process is rank 0 now (and may stop being it).
    old, new = (TrainingLogger(tmp_path, False, 1, is_master=m) for m in (True, False))
    old.step(1, 1, 0.5, 10.0)
    old.close()  # the lost rank 0's log ends at step 1
    new.step(1, 1, 0.5, 10.0)  # not rank 0 yet: nothing
    new.follow(True)
    new.step(2, 2, 0.4, 10.0)
    new.follow(False)
    new.step(3, 3, 0.3, 10.0)
    new.close()
    text = (tmp_path / "metrics.csv").read_text()
    assert text.count("wall_time,") == 1  # the same log, appended to
    assert [r["global_step"] for r in read_csv(tmp_path / "metrics.csv")] == ["1", "2"]


def test_csv_has_one_header_a_row_per_logged_step_and_per_epoch(tmp_path: Path) -> None:
    run_epochs(TrainingLogger(tmp_path, False, 4, is_master=True))
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines[0] == ",".join(CSV_COLUMNS)
    rows = read_csv(tmp_path / "metrics.csv")
    steps = [(r["epoch"], r["step"], r["global_step"]) for r in rows if r["kind"] == "step"]
    assert steps == [
        *[("1", "4", "4"), ("1", "8", "8"), ("1", "12", "12")],
        *[("2", "4", "16"), ("2", "8", "20"), ("2", "12", "24")],
    ]
    epochs = [r for r in rows if r["kind"] == "epoch"]
    assert [(r["epoch"], r["global_step"]) for r in epochs] == [("1", "12"), ("2", "24")]
    assert float(epochs[1]["train_loss"]) == pytest.approx(0.4)
    assert epochs[0]["val_loss"] == "" and epochs[0]["extra"] == "grad_norm=2.0"
    assert float(rows[0]["loss"]) == pytest.approx(0.25)


def test_a_resumed_run_appends_without_a_second_header(tmp_path: Path) -> None:
    run_epochs(TrainingLogger(tmp_path, False, 6, is_master=True), epochs=1)
    run_epochs(TrainingLogger(tmp_path, False, 6, is_master=True), epochs=1)
    text = (tmp_path / "metrics.csv").read_text()
    assert text.count("wall_time,") == 1
    assert len(read_csv(tmp_path / "metrics.csv")) == 2 * (2 + 1)


def test_a_log_with_other_columns_is_never_appended_to(tmp_path: Path) -> None:
    (tmp_path / "metrics.csv").write_text("time,loss\n1,2\n")
    run_epochs(TrainingLogger(tmp_path, False, 6, is_master=True), epochs=1)
    assert (tmp_path / "metrics.csv").read_text() == "time,loss\n1,2\n"
    assert len(read_csv(tmp_path / "metrics-1.csv")) == 3


def test_no_step_rows_or_lines_when_log_every_is_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_epochs(TrainingLogger(tmp_path, True, 0, is_master=True), epochs=1)
    assert "step" not in capsys.readouterr().out
    assert [r["kind"] for r in read_csv(tmp_path / "metrics.csv")] == ["epoch"]


def test_tensorboard_event_files_hold_the_scalars(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_epochs(TrainingLogger(tmp_path, False, 4, is_master=True))
    assert list(tmp_path.glob("events.out.tfevents.*"))
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"step/loss", "step/samples_per_second", "epoch/train_loss"} <= tags
    assert "epoch/val_loss" not in tags  # None values are skipped, not logged as 0
    losses = [(e.step, e.value) for e in events.Scalars("epoch/train_loss")]
    assert [s for s, _ in losses] == [1, 2]
    assert [v for _, v in losses] == pytest.approx([0.5, 0.4])
    assert [e.step for e in events.Scalars("step/loss")] == [4, 8, 12, 16, 20, 24]


def test_without_tensorboard_one_info_line_and_the_csv_still_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import now fails
    run_epochs(TrainingLogger(tmp_path, True, 0, is_master=True), epochs=2)
    out = capsys.readouterr().out
    assert out.count("tensorboard is not installed") == 1
    assert "pip install 'rankwise[tensorboard]'" in out
    assert not list(tmp_path.glob("events.out.tfevents.*"))
    assert len(read_csv(tmp_path / "metrics.csv")) == 2


@pytest.mark.parametrize("bad", [-1, 2.5, True])
def test_bad_log_every_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match=r"log_every_n_batches .* must be"):
        TrainingLogger(None, True, bad, is_master=True)  # type: ignore[arg-type]


def test_close_twice_and_context_manager(tmp_path: Path) -> None:
    with TrainingLogger(tmp_path, False, 1, is_master=True) as logger:
        logger.start_epoch(0, 1)
        logger.step(1, 1, 0.5, 10.0)
    logger.close()
    assert len(read_csv(tmp_path / "metrics.csv")) == 1


def test_a_loss_not_yet_on_the_host_is_shown_pending(tmp_path: Path) -> None:
    out = io.StringIO()
    with TrainingLogger(
        tmp_path, True, 1, is_master=True, progress_bar=False, stream=out
    ) as logger:
        logger.start_epoch(0, 2)
        logger.step(1, 1, None, 10.0)  # the GPU has not copied a loss back yet
        logger.step(2, 2, 0.25, 10.0)
    assert "batch 1/2 loss pending 10 samples/s" in out.getvalue()
    assert "batch 2/2 loss 0.2500" in out.getvalue()
    rows = read_csv(tmp_path / "metrics.csv")
    assert [r["loss"] for r in rows] == ["", "0.25"]


def test_the_loss_readout_never_waits_and_weights_by_batch_size() -> None:
    from rankwise.train.sums import LossReadout

    readout = LossReadout(torch.device("cpu"))
    assert readout.mean() is None
    readout.issue([], [])
    readout.issue([torch.tensor(1.0), torch.tensor(2.0, dtype=torch.bfloat16)], [3, 1])
    assert readout.mean() == pytest.approx(1.25)
    readout.issue([torch.tensor(5.0)], [4])
    assert readout.mean() == pytest.approx(3.125)  # (3 + 2 + 20) / 8
    assert not readout.pending


def test_the_four_sinks_offer_one_interface() -> None:
    """CSV, TensorBoard, W&B and MLflow each take the Sink's calls with the Sink's parameters
    (the logger and the tracker set call them alike); no tracker package is imported."""
    import inspect

    from rankwise.train.tracking import (
        CsvLog,
        MlflowTracker,
        Sink,
        TensorBoardLog,
        WandbTracker,
    )

    calls = ("start", "log_step", "log_epoch", "log_artifact", "finish")
    for sink in (CsvLog, TensorBoardLog, WandbTracker, MlflowTracker):
        for call in calls:
            wanted = list(inspect.signature(getattr(Sink, call)).parameters)
            assert list(inspect.signature(getattr(sink, call)).parameters) == wanted, (sink, call)
        assert isinstance(sink.name, str) and sink.name in ("csv", "tensorboard", "wandb", "mlflow")
    assert len({s.name for s in (CsvLog, TensorBoardLog, WandbTracker, MlflowTracker)}) == 4
