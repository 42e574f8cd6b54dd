"""What ``tests/scripts/fault_worker.py`` trains, for the tests that launch it (fault injection
in ``test_train_faults.py``, two hosts in ``test_launch_multihost.py``)."""

from __future__ import annotations

from pathlib import Path

from helpers.paths import SCRIPTS
from rankwise.testing import assert_exactly_once

WORKER = SCRIPTS / "fault_worker.py"
NUM_SAMPLES, EPOCHS = 192, 2  # the worker's data set and epochs


def exactly_once(out: Path, attempts: int) -> list[int]:
    """Check the worker's audit under ``out``; return each attempt's start step."""
    return assert_exactly_once(out / "audit", attempts, NUM_SAMPLES, EPOCHS)
