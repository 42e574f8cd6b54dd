"""What the real servers tests start have in common (SeaweedFS's S3 in :mod:`s3server`,
MLflow's tracking server in :mod:`mlflowserver`): a process in a group of its own, its log
in its folder, a wait until it answers, a stop through its process group, and a start that
is retried on new ports when a port was taken between choosing and binding it.

A server says how it is started (:meth:`ServerProcess.command`), where it answers
(:attr:`ServerProcess.url`) and whether it answers now (:meth:`ServerProcess.answers`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, TypeVar

S = TypeVar("S", bound="ServerProcess")


@dataclass
class ServerProcess:
    """A server process of the tests'; :meth:`start` starts it and waits until it answers,
    :meth:`stop` ends it (and :meth:`start` may start it again, on the same ports)."""

    directory: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False, kw_only=True)

    name: ClassVar[str] = "server"  # in messages: "weed mini", "mlflow server"
    log_name: ClassVar[str] = "server.log"

    # -- what each server says -----------------------------------------------------------------

    @property
    def url(self) -> str:
        """Where it answers (in messages, and what clients are given)."""
        raise NotImplementedError

    def command(self) -> list[str]:
        raise NotImplementedError

    def answers(self) -> bool:
        """Whether it answers now (one quick request)."""
        raise NotImplementedError

    def environment(self) -> dict[str, str] | None:
        """The server's environment (None: this process's)."""
        return None

    # -- shared --------------------------------------------------------------------------------

    @property
    def log(self) -> Path:
        return self.directory / self.log_name

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def start(self: S, timeout: float) -> S:
        """Start the server and wait until it answers; a RuntimeError with its log's end if it
        exits first or does not answer within ``timeout`` seconds."""
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.environment(),
                cwd=self.directory,
                start_new_session=True,  # its own group: stop() ends it and its children
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode} before {self.url} "
                    f"answered; log {self.log}:\n{self.log_tail()}"
                )
            if self.answers():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"{self.name} at {self.url} did not answer within {timeout:.0f} s; "
            f"log {self.log}:\n{self.log_tail()}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        """End the server's process group: SIGTERM, then SIGKILL after ``timeout``."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def kill(self) -> None:
        """SIGKILL the server's process group: a server lost without warning."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def start_retrying(make: Callable[[], S], timeout: float, attempts: int = 3) -> S:
    """``make()`` a server on newly chosen free ports and start it; a port taken between
    choosing it and the server binding it makes the server exit, which is retried
    (``attempts`` in all)."""
    for attempt in range(attempts):
        server = make()
        try:
            return server.start(timeout)
        except RuntimeError:
            server.stop()
            if attempt == attempts - 1:
                raise
    raise AssertionError("attempts must be >= 1")
