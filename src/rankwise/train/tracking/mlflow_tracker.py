"""MLflow as a :class:`~rankwise.train.tracking.sink.Sink`: :class:`MlflowTracker`, through
``MlflowClient``; the options it reads are :class:`rankwise.train.config.MlflowOptions`, the
rest is MLflow's own variables."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rankwise.train.config.loggers import MlflowOptions
from rankwise.train.tracking.probe import probe
from rankwise.train.tracking.sink import Tracker

__all__ = ["MlflowTracker"]


class MlflowTracker(Tracker):
    """MLflow through ``MlflowClient`` (no global active run). The server is
    ``MLFLOW_TRACKING_URI`` (or ``options["tracking_uri"]``), the experiment
    ``options["experiment_name"]`` / ``["experiment_id"]``, else ``MLFLOW_EXPERIMENT_NAME`` /
    ``MLFLOW_EXPERIMENT_ID``, else MLflow's default one; ``run_name`` and ``tags`` name the run.
    Authentication is MLflow's own (``MLFLOW_TRACKING_TOKEN``, ``MLFLOW_TRACKING_USERNAME``...).

    The config goes in as the run's parameters (once: MLflow refuses a changed parameter). The
    run keeps the last global step logged in its tag ``rankwise.global_step``, which a
    resumed job reads as ``last_step``.
    """

    name = "mlflow"
    title = "MLflow"
    fix = (
        "check MLFLOW_TRACKING_URI (is the server up, and reachable from rank 0?) and its "
        "credentials (MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME / _PASSWORD); "
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES and MLFLOW_HTTP_REQUEST_TIMEOUT bound how long a "
        "call waits"
    )
    STEP_TAG = "rankwise.global_step"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = MlflowOptions(**dict(options or {}))
        self.last_step: int | None = None
        self.client: Any = None
        self.run_id: str | None = None

    def start(self, config: Mapping[str, Any], run_id: str | None) -> str:
        import mlflow
        from mlflow import MlflowClient
        from mlflow.entities import Param, RunStatus

        uri = self.options.tracking_uri or mlflow.get_tracking_uri()
        where = "tracking_uri" if self.options.tracking_uri else "MLFLOW_TRACKING_URI"
        probe(str(uri), f"the MLflow server at {where}")
        self.client = client = MlflowClient(tracking_uri=uri)
        if run_id is not None:
            run = client.get_run(run_id)
            held = run.data.tags.get(self.STEP_TAG)
            self.last_step = int(held) if held is not None else None
            client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            self.run_id = run_id
            return run_id
        tags = {str(k): str(v) for k, v in (self.options.tags or {}).items()}
        run = client.create_run(
            self._experiment_id(client), run_name=self.options.run_name, tags=tags
        )
        self.run_id = run.info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in _flatten(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 per batch
            client.log_batch(self.run_id, params=params[i : i + 100])
        return self.run_id

    def _experiment_id(self, client: Any) -> str:
        from mlflow.environment_variables import MLFLOW_EXPERIMENT_ID, MLFLOW_EXPERIMENT_NAME

        given = self.options.experiment_id or MLFLOW_EXPERIMENT_ID.get()
        if given:
            return str(given)
        name = self.options.experiment_name or MLFLOW_EXPERIMENT_NAME.get()
        if not name:
            return "0"  # MLflow's "Default" experiment
        found = client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(client.create_experiment(name))
        except Exception:  # another job created it in between
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
            return str(found.experiment_id)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        rows = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        tags = [RunTag(self.STEP_TAG, str(step))]
        self.client.log_batch(self.run_id, metrics=rows, tags=tags)

    def log_artifact(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def finish(self, failed: bool = False) -> None:
        client, self.client = self.client, None
        if client is not None and self.run_id is not None:
            client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (MLflow's parameters are flat).

    >>> _flatten({"lr": 0.1, "compile_options": {"mode": None}, "logger_options": {}})
    {'lr': 0.1, 'compile_options.mode': None, 'logger_options': {}}
    """
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
