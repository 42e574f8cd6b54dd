"""Experiment trackers on rank 0, one tracker run per job: :class:`TrackerSet`.

The trackers are :class:`~rankwise.train.tracking.sink.Sink` s like rankwise's own files:
:class:`~rankwise.train.tracking.wandb_tracker.WandbTracker` and
:class:`~rankwise.train.tracking.mlflow_tracker.MlflowTracker`, thin over each library, which
reads its own environment variables (``WANDB_PROJECT``, ``WANDB_MODE``, ``WANDB_DIR``, ...;
``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``, ...): rankwise reads none of them.
``logger_options[name]`` adds what a user would pass in code.

:class:`TrackerSet` is what the :class:`~rankwise.train.tracking.logger.TrainingLogger` owns:
it fans each call out to every tracker and guards it, so that a tracker never stops training.
A tracker that raises (an unreachable server, a refused key, a failure mid-run) gives one
:class:`TrackerWarning` naming it and the fix, and is switched off; the CSV log keeps every
metric. Before a run starts its server is asked for one answer within
:data:`~rankwise.train.tracking.probe.PROBE_SECONDS`
(:func:`~rankwise.train.tracking.probe.probe`): a misspelt or silent ``MLFLOW_TRACKING_URI`` /
``WANDB_BASE_URL`` costs seconds and a warning naming the URL, not the library's minutes of
retries. A missing package is the one failure that stops a run, before its first step, on
every rank (:func:`require`), naming the extra to install.

One run, whatever happens: the run ids live in the :class:`~rankwise.train.state.TrainState`
(so in every checkpoint, and on every rank through :func:`share_run_ids`). A job resumed from
a checkpoint (``--max-restarts``, ``resume="auto"``) or continued by a new rank 0 (``--on-failure
continue``) logs into the same runs. Steps are never logged twice: a resumed run is asked for
the last global step it holds, and the steps up to it, which the resumed job trains again,
are not sent to it (rows at a global step are sent only past that step).

>>> require(["csv"])  # nothing to check for rankwise's own CSV
>>> TrackerSet([]).start({"lr": 0.1}, {})
{}
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import rankwise.distributed as rd
from rankwise.distributed.errors import RankwiseWarning
from rankwise.storage import Storage, redacted, scrub, secret_values
from rankwise.train.checkpoint import manifest_path
from rankwise.train.tracking.history import DistributedTrainingHistory
from rankwise.train.tracking.mlflow_tracker import MlflowTracker
from rankwise.train.tracking.sink import EpochRow, StepRow, Tracker, tracker_metrics
from rankwise.train.tracking.wandb_tracker import TrackerOptionError, WandbTracker
from rankwise.validation import installed

__all__ = [
    "EXTRAS",
    "TrackerSet",
    "TrackerWarning",
    "build_trackers",
    "require",
    "run_artifacts",
    "share_run_ids",
]

# logger name -> (the module it imports, the rankwise extra that installs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}


class TrackerWarning(RankwiseWarning):
    """A tracker failed and was switched off; training goes on (the message says the fix)."""


def require(names: Iterable[str]) -> None:
    """Fail now if a logger in ``names`` needs a package that is not installed, naming the
    extra: ``ImportError: loggers lists 'wandb' but wandb is not installed: pip install
    'rankwise[wandb]'``. Looks the package up without importing it (cheap on every rank)."""
    for name in names:
        if name not in EXTRAS:
            continue
        module, extra = EXTRAS[name]
        if not installed(module):
            raise ImportError(
                f"DistributedTrainingConfig.loggers lists {name!r}, but the {module} package is "
                f"not installed: pip install 'rankwise[{extra}]' (or pip install {module}), or "
                f"leave {name!r} out of loggers."
            )


_KINDS: dict[str, type[WandbTracker] | type[MlflowTracker]] = {
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
}


def build_trackers(names: Iterable[str], options: Mapping[str, Any]) -> list[Tracker]:
    """The trackers among the logger ``names``, each with its ``options[name]`` (none is
    started yet); checks their packages first (:func:`require`)."""
    names = [n for n in names if n in _KINDS]
    require(names)
    return [_KINDS[n](options.get(n)) for n in names]


class TrackerSet:
    """The trackers of one run, driven together with the rows every
    :class:`~rankwise.train.tracking.sink.Sink` takes; each call is guarded (see module doc). ``around_calls``: a context entered around every
    call into a tracker's library (fit passes its SIGTERM guard's ``deferred``).

    ``running``: the trackers with a run open; a tracker that failed (``failed``) stays off
    for the rest of the process. ``through[name]``: rows at a global step up to this one are
    not sent to that tracker (its run holds them already: a resumed job trains those steps
    again).
    """

    def __init__(
        self,
        trackers: Sequence[Tracker],
        options: Mapping[str, Any] | None = None,
        *,
        around_calls: Callable[[], contextlib.AbstractContextManager[Any]] = (
            contextlib.nullcontext
        ),
    ) -> None:
        self.trackers = list(trackers)
        self.running: list[Tracker] = []
        self.failed: set[str] = set()
        self.through: dict[str, int] = {}
        self._scrub = secret_values(dict(options or {}))  # never in a warning
        # Around every call into a tracker's library: fit's SIGTERM guard defers the signal
        # there (rankwise.train.sigterm: a handler must not re-enter the library).
        self.around_calls = around_calls

    def __bool__(self) -> bool:
        return any(t.name not in self.failed for t in self.trackers)

    def start(
        self,
        config: Mapping[str, Any],
        run_ids: Mapping[str, str],
        *,
        logged_through: int | None = None,
        resume_only: bool = False,
    ) -> dict[str, str]:
        """Start every tracker (going on with the run in ``run_ids`` where there is one);
        return ``{name: run id}`` of those that started. ``logged_through``: the last global
        step rankwise logged before (its CSV), used where a resumed run cannot tell.
        ``resume_only``: start only the trackers with a run id (a new rank 0 taking over:
        one without had failed on the old rank 0, and stays off)."""
        started: dict[str, str] = {}
        safe_config = redacted(dict(config))
        for tracker in self.trackers:
            run_id = run_ids.get(tracker.name)
            if tracker.name in self.failed or tracker in self.running:
                continue
            if run_id is None and resume_only:
                continue
            new_id = self._guard(tracker, "start a run", tracker.start, safe_config, run_id)
            if tracker.name in self.failed:
                continue
            self.running.append(tracker)
            started[tracker.name] = str(new_id)
            through = tracker.last_step
            if through is None and run_id is not None:
                through = logged_through
            if through is not None:
                self.through[tracker.name] = through
        return started

    def log_step(self, row: StepRow) -> None:
        """Log a step row to every running tracker whose run does not hold its step yet."""
        self._log(row, "log metrics", "log_step")

    def log_epoch(self, row: EpochRow) -> None:
        """Log an epoch row (at its global step, 0 before any) the same way."""
        self._log(row, "log metrics", "log_epoch")

    def _log(self, row: StepRow | EpochRow, what: str, method: str) -> None:
        step = tracker_metrics(row)[0]
        for tracker in list(self.running):
            if step > self.through.get(tracker.name, -1):
                self._guard(tracker, what, getattr(tracker, method), row)

    def log_artifact(self, path: Path) -> None:
        for tracker in list(self.running):
            self._guard(tracker, f"upload {path.name}", tracker.log_artifact, path)

    def finish(self, failed: bool = False) -> None:
        """Close every open run (safe to call twice: each run is taken off ``running`` before
        it is closed)."""
        while self.running:
            tracker = self.running.pop(0)
            self._guard(tracker, "finish its run", tracker.finish, failed)

    def _guard(self, tracker: Tracker, what: str, call: Any, *args: Any) -> Any:
        try:
            with self.around_calls():
                return call(*args)
        except Exception as exc:
            self.failed.add(tracker.name)
            if tracker in self.running:
                self.running.remove(tracker)
            text = " ".join(str(exc).split()) or type(exc).__name__
            text = scrub(text, self._scrub)  # before the cut, which could split a secret
            if len(text) > 600:  # the cause is often at the end (a connection's error)
                text = f"{text[:300]} ... {text[-300:]}"
            fix = (
                f"correct logger_options[{tracker.name!r}]"
                if isinstance(exc, TrackerOptionError)
                else tracker.fix
            )
            warnings.warn(
                f"rankwise: the {tracker.title} tracker ({tracker.name}) failed to {what} "
                f"({type(exc).__name__}: {text}); training goes on without it, and the CSV "
                f"log (log_dir) keeps every metric. Fix: {fix}.",
                TrackerWarning,
                stacklevel=2,
            )
            return None


def run_artifacts(
    history: DistributedTrainingHistory,
    checkpoint: Path | str | None,
    storage_options: Mapping[str, Any] | None,
    folder: Path,
) -> list[Path]:
    """The files a run leaves its trackers at its end, written into ``folder``: the history
    (``history.json``, and ``history.png`` when matplotlib is installed) and the manifest
    (size, checksum) of the final ``checkpoint``, a local path or an object-storage URL."""
    files = [history.save(folder / "history.json")]
    with contextlib.suppress(ImportError):  # matplotlib is optional: the JSON has the numbers
        files.append(history.plot(folder / "history.png"))
    if isinstance(checkpoint, Path):
        files.append(manifest_path(checkpoint))
    elif checkpoint is not None:  # a URL: the manifest is an object beside the checkpoint
        where, _, name = checkpoint.rpartition("/")
        key = manifest_path(name).name
        storage = Storage.for_url(where, dict(storage_options or {}))
        files.append(storage.download(key, folder / key))
    return files


def share_run_ids(run_ids: Mapping[str, str]) -> dict[str, str]:
    """Rank 0's ``run_ids`` on every rank (a collective): every rank holds the run ids, so a
    new rank 0 after a lost rank goes on with the same runs. Sent as plain values
    (:func:`rankwise.distributed.broadcast_plain`), never a peer's pickle."""
    shared = rd.broadcast_plain(dict(run_ids) if rd.is_master() else None)
    if not isinstance(shared, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in shared.items()
    ):
        raise ValueError(f"rank 0 sent tracker run ids that are not names and ids: {shared!r}")
    return shared
