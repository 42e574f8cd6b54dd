"""The runnable examples keep running: each layer of rankwise together, on 2 real ranks."""

from __future__ import annotations

import re
from pathlib import Path

from rankwise.testing import run_script

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_train_loop_example_trains_and_stays_in_sync() -> None:
    proc = run_script(EXAMPLES / "train_loop.py", 2, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    accuracies = [float(a) for a in re.findall(r"^epoch \d+/8 .* test_acc ([\d.]+)", out, re.M)]
    assert len(accuracies) == 8, out  # one line per epoch, from rank 0 only
    assert accuracies[-1] > 0.8 and accuracies[-1] > accuracies[0]
    # the cursor reaches the end of every epoch: 1437 training samples
    assert out.count("cursor 1437") == 8
    assert "parameters in sync across 2 rank(s): True" in out
