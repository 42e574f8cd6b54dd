"""The rules of the loggers' fields: ``loggers`` (which sinks a run writes to) and
``logger_options`` (each tracker's own), and the one list of the options rankwise's MLflow
tracker reads (:class:`MlflowOptions`; W&B's are ``wandb.init``'s arguments, checked against
its signature where wandb is imported: :mod:`rankwise.train.tracking.wandb_tracker`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rankwise.train.config.plain import check_yaml_values, refuse_redacted
from rankwise.train.config.rules import fail
from rankwise.validation import did_you_mean

# The loggers a run may write to: rankwise's own files, and the experiment trackers
# (rankwise.train.tracking), each configured by its own variables plus logger_options.
LOGGERS = ("csv", "tensorboard", "wandb", "mlflow")
TRACKERS = ("wandb", "mlflow")  # the loggers that take logger_options


@dataclasses.dataclass(frozen=True)
class MlflowOptions:
    """``logger_options['mlflow']``: the options rankwise's MLflow tracker reads, each None
    where MLflow's own variables decide (``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``,
    ``MLFLOW_EXPERIMENT_ID``). Their names are :data:`MLFLOW_OPTIONS`, which the config checks.

    >>> MlflowOptions(**{"experiment_name": "mnist"}).experiment_name
    'mnist'
    """

    tracking_uri: Any = None  # the server; None: MLFLOW_TRACKING_URI
    experiment_name: Any = None  # None: MLFLOW_EXPERIMENT_NAME, else MLflow's default
    experiment_id: Any = None  # None: MLFLOW_EXPERIMENT_ID
    run_name: Any = None  # the new run's name (None: MLflow picks one)
    tags: Any = None  # {name: value} set on the new run


MLFLOW_OPTIONS = tuple(f.name for f in dataclasses.fields(MlflowOptions))


def check_loggers(value: Any) -> list[str] | None:
    """``loggers`` as a list of names from :data:`LOGGERS` (repeats dropped), or None.

    A string is a comma-separated list (``loggers=csv,wandb`` on a command line).

    >>> check_loggers("csv, wandb"), check_loggers(["MLflow", "csv", "mlflow"])
    (['csv', 'wandb'], ['mlflow', 'csv'])
    """
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        fail("loggers", value, f"must be a list of logger names from {LOGGERS}, or None")
    names: list[str] = []
    for item in items:
        name = item.strip().lower() if isinstance(item, str) else item
        if name not in LOGGERS:
            choices = ", ".join(repr(c) for c in LOGGERS)
            fail(
                "loggers",
                value,
                f"has an unknown logger {item!r}{did_you_mean(name, LOGGERS, ignore_case=True)}; the loggers "
                f"are {choices} (None: "
                "'csv' and 'tensorboard' when log_dir is set)",
            )
        if name not in names:
            names.append(name)
    return names


def check_logger_options(value: Any) -> dict[str, Any]:
    """``logger_options`` as ``{tracker: {option: plain value}}`` for the trackers in
    :data:`TRACKERS` (W&B's ``wandb.init`` arguments, MLflow's experiment and run names).

    >>> check_logger_options({"wandb": {"project": "mnist"}})
    {'wandb': {'project': 'mnist'}}
    """
    name = "logger_options"
    if value is None:
        return {}
    example = "e.g. {'wandb': {'project': 'mnist'}, 'mlflow': {'experiment_name': 'mnist'}}"
    if not isinstance(value, Mapping):
        fail(name, type(value).__name__, f"must be a dict of options per tracker, {example}")
    for tracker, options in value.items():
        if tracker not in TRACKERS:
            trackers = ", ".join(repr(t) for t in TRACKERS)
            fail(
                name,
                tracker,
                f"is not a tracker that takes options{did_you_mean(tracker, TRACKERS, ignore_case=True)}; the "
                f"keys are {trackers} ({example})",
            )
        if not isinstance(options, Mapping):
            fail(name, f"{tracker}: {type(options).__name__}", f"must map to a dict, {example}")
        if tracker == "mlflow":
            for key in options:
                if key not in MLFLOW_OPTIONS:
                    fail(
                        name,
                        f"mlflow: {key!r}",
                        f"is not an MLflow option{did_you_mean(key, MLFLOW_OPTIONS, ignore_case=True)}; they are "
                        f"{', '.join(MLFLOW_OPTIONS)} (the rest is MLflow's own variables: "
                        "MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME, ...)",
                    )
        check_yaml_values(name, options, tracker)
        refuse_redacted(
            f"{name}[{tracker!r}]",
            options,
            "the tracker's own variables (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, ...)",
        )
    return {tracker: dict(options) for tracker, options in value.items()}
