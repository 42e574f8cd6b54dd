"""What the integration tests share: one real MLflow tracking server per test process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rankwise.testing.mlflowserver import MlflowServer, start_mlflow_server


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """``mlflow server`` on a free port of 127.0.0.1 (SQLite runs, artifacts in a folder),
    started once (tens of seconds on 2 busy cores) and stopped by its process group."""
    server = start_mlflow_server(tmp_path_factory.mktemp("mlflow-server"))
    try:
        yield server
    finally:
        server.stop()
