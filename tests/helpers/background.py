"""A launch left running while the test acts on it (a signal to the launcher or to one rank):
started in a session of its own, so that nothing of it outlives the test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from rankwise.testing import child_env


@contextlib.contextmanager
def started(
    cmd: Sequence[str], env: Mapping[str, str] | None = None, *, capture: bool = True
) -> Iterator[subprocess.Popen[str]]:
    """``cmd`` running in a session of its own (output captured, or dropped); at the end,
    whatever of that session is left is SIGKILLed."""
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    proc = subprocess.Popen(
        list(cmd), env=child_env(env), start_new_session=True, stdout=out, stderr=out, text=True
    )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):  # the ranks, should any be left
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def await_file(path: Path, proc: subprocess.Popen[str], seconds: float = 120.0) -> None:
    """Return once ``path`` exists; fail if ``proc`` ends first or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(
                f"the launch ended first ({proc.returncode}): {(err or '')[-3000:]}"
            )
        assert time.monotonic() < deadline, f"no {path.name} after {seconds:.0f} s"
        time.sleep(0.05)
