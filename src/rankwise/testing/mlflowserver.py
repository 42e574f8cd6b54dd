"""A real MLflow tracking server for tests: ``mlflow server`` from the ``mlflow`` package (the
``mlflow`` extra), on a free port of 127.0.0.1, its runs in SQLite and its artifacts in a
folder (served through the server, as a shared server does), stopped through its own process
group.

>>> server = start_mlflow_server(tmp_dir)  # doctest: +SKIP
>>> server.uri  # doctest: +SKIP
'http://127.0.0.1:40123'
>>> server.stop()  # doctest: +SKIP

``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``: without it the server starts seven job workers
of about 230 MB each, which a tracking test never uses.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from rankwise.testing import free_port

START_TIMEOUT = 90.0  # the first start migrates a fresh SQLite database: seconds on 2 cores


@dataclass
class MlflowServer:
    """A running ``mlflow server``; :meth:`stop` ends it."""

    directory: Path
    port: int
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def uri(self) -> str:
        """What ``MLFLOW_TRACKING_URI`` is set to for a client to reach it."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.directory / "mlflow-server.log"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host=127.0.0.1",
            f"--port={self.port}",
            f"--backend-store-uri=sqlite:///{self.directory / 'mlflow.db'}",
            f"--artifacts-destination={self.directory / 'artifacts'}",
            "--workers=1",
        ]

    def start(self, timeout: float = START_TIMEOUT) -> MlflowServer:
        """Start the server and wait until its ``/health`` answers."""
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.directory,
                start_new_session=True,  # its own group: stop() ends it and its workers
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited with {self.process.returncode} before {self.uri} "
                    f"answered; log {self.log}:\n{self.log_tail()}"
                )
            try:
                urllib.request.urlopen(f"{self.uri}/health", timeout=1).close()
                return self
            except (OSError, urllib.error.URLError):
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"mlflow server at {self.uri} did not answer within {timeout:.0f} s; "
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


def start_mlflow_server(directory: Path, *, attempts: int = 3) -> MlflowServer:
    """Start ``mlflow server`` with its database, artifacts and log in ``directory`` on a
    free port; a port taken between choosing and binding it is retried on another."""
    directory.mkdir(parents=True, exist_ok=True)
    for attempt in range(attempts):
        server = MlflowServer(directory, free_port())
        try:
            return server.start()
        except RuntimeError:
            server.stop()
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")
