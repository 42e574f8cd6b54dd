"""Shared fixtures: every test runs with its environment restored and no process group left."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fault_runs import WORKER, exactly_once
from rankwise.testing import hygiene, run_script


@pytest.fixture(autouse=True)
def _hygiene() -> Iterator[None]:
    with hygiene():
        yield


@pytest.fixture(scope="session")
def fault_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fault worker's uninterrupted run on one machine (2 ranks of batch 8): the parameters
    that test_faults.py's recoveries and test_multihost.py's two hosts must end with. One
    launch for both modules (seconds of start-up each)."""
    import torch

    out: Path = tmp_path_factory.mktemp("fault-reference")
    result = run_script(WORKER, 2, script_args=[str(out)], timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert exactly_once(out, attempts=1) == [0]
    return dict(torch.load(out / "final.pt"))


# Helper scripts run under `rankwise launch`; they are not test modules (and parse argv on import).
collect_ignore = ["scripts"]
