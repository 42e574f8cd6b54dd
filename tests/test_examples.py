"""The runnable examples keep running: each layer of rankwise together, on 2 real ranks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers.paths import EXAMPLES
from rankwise.testing import run_script

EXAMPLES = EXAMPLES


def test_train_loop_example_trains_and_stays_in_sync() -> None:
    # 4 of the example's 8 epochs (each ~2.5 s of CPU on 2 ranks), PowerSGD on from the first
    # (12 optimizer steps an epoch): the test accuracy by epoch is 0.81, 0.77, 0.83, 0.88,
    # clear of 0.8 and of the first epoch by 26 of the 360 test images.
    epochs = 4
    proc = run_script(
        EXAMPLES / "train_loop.py", 2, script_args=[f"--epochs={epochs}"], timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    line = rf"^epoch \d+/{epochs} .* test_acc ([\d.]+)"
    accuracies = [float(a) for a in re.findall(line, out, re.M)]
    assert len(accuracies) == epochs, out  # one line per epoch, from rank 0 only
    assert accuracies[-1] > 0.8 and accuracies[-1] > accuracies[0]
    # the cursor reaches the end of every epoch: 1437 training samples
    assert out.count("cursor 1437") == epochs
    assert "parameters in sync across 2 rank(s): True" in out


@pytest.mark.timeout(500)
def test_trainer_example_trains_then_resumes_with_nothing_left(tmp_path: Path) -> None:
    args = [f"--out={tmp_path}", "--epochs=6"]
    first = run_script(EXAMPLES / "train_trainer.py", 2, script_args=args, timeout=230)
    assert first.returncode == 0, first.stderr[-3000:]
    line = r"test loss ([\d.]+) accuracy ([\d.]+) over 397 samples; 2 rank\(s\)"
    trained = re.search(line, first.stdout)
    assert trained, first.stdout
    assert float(trained.group(2)) > 0.9
    assert first.stdout.count("best validation accuracy") == 1  # callbacks print on rank 0
    assert (tmp_path / "history.json").exists() and (tmp_path / "logs" / "metrics.csv").exists()
    # Run again: resume="auto" finds the final checkpoint, so the weights are the same.
    second = run_script(EXAMPLES / "train_trainer.py", 2, script_args=args, timeout=230)
    assert second.returncode == 0, second.stderr[-3000:]
    resumed = re.search(line, second.stdout)
    assert resumed and resumed.groups() == trained.groups(), second.stdout
