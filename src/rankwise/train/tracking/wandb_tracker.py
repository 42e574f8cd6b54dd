"""Weights & Biases as a :class:`~rankwise.train.tracking.sink.Sink`: :class:`WandbTracker`,
thin over ``wandb.init``; W&B reads its own variables (``WANDB_PROJECT``, ``WANDB_MODE``,
``WANDB_DIR``, ``WANDB_API_KEY``, ...), rankwise none of them."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rankwise.train.tracking.probe import probe
from rankwise.train.tracking.sink import Tracker
from rankwise.validation import did_you_mean

__all__ = ["STEP_KEY", "WANDB_FLUSH_SECONDS", "TrackerOptionError", "WandbTracker"]

# The metric every W&B row carries: the global step, as a value (W&B's x-axis choice).
STEP_KEY = "trainer/global_step"
# How often W&B writes a run's buffered data to its ``.wandb`` file (its own default: 15 s, and
# a SIGKILLed offline part kept nothing it had not written): what a kill can lose.
WANDB_FLUSH_SECONDS = 1.0
_WANDB_FLUSH = "x_transaction_log_flush_interval"  # wandb >= 0.2x's setting for it


class TrackerOptionError(ValueError):
    """A tracker's ``logger_options`` its package does not take (found where rank 0 starts
    the run: W&B's are ``wandb.init``'s arguments, whichever wandb is installed)."""


class WandbTracker(Tracker):
    """Weights & Biases through ``wandb.init``; ``options`` are its keyword arguments
    (``project``, ``entity``, ``name``, ``group``, ``tags``, ``mode``, ``dir``, ``settings``
    ...), else W&B's variables (``WANDB_PROJECT``, ``WANDB_MODE``, ``WANDB_DIR``,
    ``WANDB_API_KEY`` ...) decide. A run id given goes on with that run (``resume="allow"``).

    W&B writes what it was given to its run file every :data:`WANDB_FLUSH_SECONDS` (its own
    default is 15 s), so a process killed by SIGKILL loses about that much of an offline run.
    Offline runs (``WANDB_MODE=offline``) each write a folder that ``wandb sync`` uploads;
    such a run cannot be asked for its last step, so ``last_step`` stays None there.
    """

    name = "wandb"
    title = "W&B"
    fix = (
        "check WANDB_API_KEY (or `wandb login`), WANDB_BASE_URL and the network, or set "
        "WANDB_MODE=offline and `wandb sync` the run later"
    )

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})
        self.last_step: int | None = None
        self.run: Any = None

    def start(self, config: Mapping[str, Any], run_id: str | None) -> str:
        import wandb

        kwargs = dict(self.options)
        takes = inspect.signature(wandb.init).parameters
        for key in kwargs:
            if key not in takes:
                raise TrackerOptionError(
                    f"logger_options['wandb'] has {key!r}, which wandb.init() does not take"
                    f"{did_you_mean(key, list(takes), ignore_case=True)}"
                )
        # The config at the start and again on a resume, the world it goes on in (a new world
        # size after a lost rank): an offline part killed by SIGKILL may have kept nothing.
        kwargs["config"] = dict(config)
        kwargs["settings"] = self._with_flush(wandb, kwargs.get("settings"))
        mode, base_url = self._mode_and_server(wandb, kwargs)
        if mode == "online":
            probe(base_url, "the W&B server (WANDB_BASE_URL)")
        if run_id is not None:
            kwargs.update(id=run_id, resume="allow", allow_val_change=True)
        self.run = run = wandb.init(**kwargs)
        if run_id is not None and run.resumed:
            held = run.summary.get(STEP_KEY)
            self.last_step = int(held) if held is not None else max(run.step - 1, 0)
        return str(run.id)

    @staticmethod
    def _with_flush(wandb: Any, given: Any) -> Any:
        """``given`` (``settings=`` for ``wandb.init``: None, a dict or a ``wandb.Settings``)
        with W&B's file flushed every :data:`WANDB_FLUSH_SECONDS`, where the installed wandb
        has the setting and neither ``given`` nor ``WANDB__TRANSACTION_LOG_FLUSH_INTERVAL``
        sets it."""
        if _WANDB_FLUSH not in getattr(wandb.Settings, "model_fields", {}):
            return given
        if _WANDB_FLUSH in wandb.setup().settings.model_fields_set:  # its variable is set
            return given
        if given is None:
            return wandb.Settings(**{_WANDB_FLUSH: WANDB_FLUSH_SECONDS})
        if isinstance(given, Mapping):
            return {_WANDB_FLUSH: WANDB_FLUSH_SECONDS, **given}
        if _WANDB_FLUSH in getattr(given, "model_fields_set", {_WANDB_FLUSH}):
            return given
        return given.model_copy(update={_WANDB_FLUSH: WANDB_FLUSH_SECONDS})

    @staticmethod
    def _mode_and_server(wandb: Any, kwargs: Mapping[str, Any]) -> tuple[str, str]:
        """The mode (``online``, ``offline``, ``disabled``...) and server W&B would use with
        ``kwargs``: theirs, else its settings from the environment (``WANDB_MODE``,
        ``WANDB_BASE_URL``) as ``wandb.setup()`` read them (it starts the process that
        ``wandb.init`` would start anyway)."""
        settings = wandb.setup().settings
        given = kwargs.get("settings")
        if given is not None and not isinstance(given, Mapping):  # a wandb.Settings
            given = {k: getattr(given, k) for k in getattr(given, "model_fields_set", ())}
        given = dict(given or {})
        mode = str(kwargs.get("mode") or given.get("mode") or settings.mode)
        base_url = given.get("base_url")
        return mode, str(base_url or settings.base_url)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log({**metrics, STEP_KEY: step}, step=step)

    def log_artifact(self, path: Path) -> None:
        import wandb

        name = re.sub(r"[^A-Za-z0-9_.-]", "-", f"{self.run.id}-{path.name}")
        artifact = wandb.Artifact(name, type="rankwise")
        artifact.add_file(str(path))
        self.run.log_artifact(artifact)

    def finish(self, failed: bool = False) -> None:
        run, self.run = self.run, None
        if run is not None:
            run.finish(exit_code=1 if failed else 0)
