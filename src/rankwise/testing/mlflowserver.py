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
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rankwise.testing import free_port
from rankwise.testing.servers import ServerProcess, start_retrying

START_TIMEOUT = 90.0  # the first start migrates a fresh SQLite database: seconds on 2 cores


@dataclass
class MlflowServer(ServerProcess):
    """A running ``mlflow server``; :meth:`stop` ends it."""

    port: int = 0

    name: ClassVar[str] = "mlflow server"
    log_name: ClassVar[str] = "mlflow-server.log"

    @property
    def uri(self) -> str:
        """What ``MLFLOW_TRACKING_URI`` is set to for a client to reach it."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.uri

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

    def environment(self) -> dict[str, str]:
        return {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}

    def answers(self) -> bool:
        try:
            urllib.request.urlopen(f"{self.uri}/health", timeout=1).close()
        except OSError:  # not up yet, or up and not healthy yet (an HTTPError)
            return False
        return True

    def start(self, timeout: float = START_TIMEOUT) -> MlflowServer:
        return super().start(timeout)


def start_mlflow_server(directory: Path, *, attempts: int = 3) -> MlflowServer:
    """Start ``mlflow server`` with its database, artifacts and log in ``directory`` on a
    free port; a port taken between choosing and binding it is retried on another."""
    directory.mkdir(parents=True, exist_ok=True)
    return start_retrying(
        lambda: MlflowServer(directory, port=free_port()), START_TIMEOUT, attempts
    )
