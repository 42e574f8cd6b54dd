"""A result made once per test run and shared by every xdist worker.

A session fixture runs once per *worker* under xdist: two modules that need the same costly
launch, handed to two workers, launch it twice. :func:`made_once` keeps the result in the
run's common temporary folder (the parent of each worker's own, ``pytest-N/``), made by
whichever worker asks first under a file lock; the others wait for it and read it. Without
xdist the folder is the session's own, so nothing outlives a run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock  # torch's own dependency


def made_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]
) -> Path:
    """``run/name``, filled by ``make(folder)`` in the first worker of this run to ask.

    ``make`` writes into a fresh folder that is renamed into place only once it returns, so
    a worker never reads half a result; if it raises, the next worker to ask tries again
    (and fails the same way, naming its own error)."""
    base = tmp_path_factory.getbasetemp()
    run = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    done = run / name
    with FileLock(str(run / f"{name}.lock")):
        if not done.exists():
            making = run / f"{name}.making"
            shutil.rmtree(making, ignore_errors=True)
            making.mkdir()
            make(making)
            making.rename(done)
    return done
