"""Experiment trackers: Weights & Biases and MLflow, on rank 0, one tracker run per job.

A :class:`Tracker` is the small face rankwise needs of one: ``start`` a run (or go on with
one, given its id) and return its id, ``log_metrics`` at a global step, ``log_artifact``,
``finish``. :class:`WandbTracker` and :class:`MlflowTracker` are thin over each library, which
reads its own environment variables (``WANDB_PROJECT``, ``WANDB_MODE``, ``WANDB_DIR``, ...;
``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``, ...): rankwise reads none of them.
``logger_options[name]`` adds what a user would pass in code.

:class:`TrackerSet` is what the :class:`~rankwise.train.loggers.TrainingLogger` owns: it fans
each call out to every tracker and guards it, so that a tracker never stops training. A
tracker that raises (an unreachable server, a refused key, a failure mid-run) gives one
:class:`TrackerWarning` naming it and the fix, and is switched off; the CSV log keeps every
metric. Before a run starts its server is asked for one answer within :data:`PROBE_SECONDS`
(:func:`probe`): a misspelt or silent ``MLFLOW_TRACKING_URI`` / ``WANDB_BASE_URL`` costs
seconds and a warning naming the URL, not the library's minutes of retries. A missing package is the one failure that stops a run, before its first step, on
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
import importlib.util
import inspect
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import rankwise.distributed as rd
from rankwise.distributed.errors import RankwiseWarning
from rankwise.storage import Storage, redacted, scrub, secret_values
from rankwise.train.checkpoint import manifest_path
from rankwise.train.history import DistributedTrainingHistory
from rankwise.validation import did_you_mean

__all__ = [
    "EXTRAS",
    "PROBE_SECONDS",
    "WANDB_FLUSH_SECONDS",
    "MlflowTracker",
    "Tracker",
    "TrackerOptionError",
    "TrackerSet",
    "TrackerUnreachableError",
    "TrackerWarning",
    "WandbTracker",
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
# The metric every tracker row carries: the global step, as a value (W&B's x-axis choice).
STEP_KEY = "trainer/global_step"
# How long a tracker's server has to answer one request before its run starts; past it the
# tracker is switched off at once (its library's own retries can hold a call for minutes).
PROBE_SECONDS = 5.0
# How often W&B writes a run's buffered data to its ``.wandb`` file (its own default: 15 s, and
# a SIGKILLed offline part kept nothing it had not written): what a kill can lose.
WANDB_FLUSH_SECONDS = 1.0
_WANDB_FLUSH = "x_transaction_log_flush_interval"  # wandb >= 0.2x's setting for it


class TrackerWarning(RankwiseWarning):
    """A tracker failed and was switched off; training goes on (the message says the fix)."""


class TrackerOptionError(ValueError):
    """A tracker's ``logger_options`` its package does not take (found where rank 0 starts
    the run: W&B's are ``wandb.init``'s arguments, whichever wandb is installed)."""


class TrackerUnreachableError(ConnectionError):
    """A tracker's server did not answer before its run started (:func:`probe`)."""


def shown_url(url: str) -> str:
    """``url`` as a message may show it: without a user name or password.

    >>> shown_url("https://user:secret@mlflow.example.com:5000/base")
    'https://mlflow.example.com:5000/base'
    """
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def probe(url: str, what: str, seconds: float = PROBE_SECONDS) -> None:
    """Raise :class:`TrackerUnreachableError` unless the HTTP(S) server at ``url`` answers one
    GET within ``seconds`` (name lookup, connection and answer together). Any answer counts,
    an error status too (a server that wants a login has answered); only silence, a refused
    connection or an unknown host do not. ``what`` names the setting the URL came from, for
    the message. Other schemes (``file:``, ``sqlite:``, ``databricks``) are not probed.
    """
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in ("http", "https"):
        return
    outcome: list[BaseException | None] = []

    def ask() -> None:
        try:
            urllib.request.urlopen(url, timeout=seconds).close()
            outcome.append(None)
        except urllib.error.HTTPError:
            outcome.append(None)  # it answered
        except Exception as exc:  # refused, unknown host, timed out, a TLS failure
            outcome.append(exc)

    # A thread with a deadline: a name lookup is not bounded by urlopen's timeout.
    asker = threading.Thread(target=ask, name="rankwise-tracker-probe", daemon=True)
    asker.start()
    asker.join(seconds)
    if outcome and outcome[0] is None:
        return
    if outcome:
        exc = outcome[0]
        reason = getattr(exc, "reason", None) or exc
        why = f"{type(reason).__name__}: {reason}"
    else:
        why = f"no answer within {seconds:g} s"
    raise TrackerUnreachableError(f"{what} {shown_url(url)} does not answer ({why})")


def require(names: Iterable[str]) -> None:
    """Fail now if a logger in ``names`` needs a package that is not installed, naming the
    extra: ``ImportError: loggers lists 'wandb' but wandb is not installed: pip install
    'rankwise[wandb]'``. Looks the package up without importing it (cheap on every rank)."""
    for name in names:
        if name not in EXTRAS:
            continue
        module, extra = EXTRAS[name]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a module set to None in sys.modules, a bad parent
            found = False
        if not found:
            raise ImportError(
                f"DistributedTrainingConfig.loggers lists {name!r}, but the {module} package is "
                f"not installed: pip install 'rankwise[{extra}]' (or pip install {module}), or "
                f"leave {name!r} out of loggers."
            )


class Tracker(Protocol):
    """One experiment tracker, driven by rank 0.

    ``start(config, run_id)`` starts a run with ``config`` (the hyper-parameters, plain values)
    or, given ``run_id``, goes on with that run; returns the run's id. After it,
    ``last_step`` is the last global step the run already held (None: a new run, or the
    tracker cannot tell). ``log_metrics(step, metrics)`` logs numbers at a global step;
    ``log_artifact(path)`` uploads a file; ``finish(failed)`` closes the run.
    """

    name: str
    title: str  # as users call it: "W&B", "MLflow"
    fix: str  # what to check when it fails
    last_step: int | None

    def start(self, config: Mapping[str, Any], run_id: str | None) -> str: ...

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def log_artifact(self, path: Path) -> None: ...

    def finish(self, failed: bool = False) -> None: ...


class WandbTracker:
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


class MlflowTracker:
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
        self.options = dict(options or {})
        self.last_step: int | None = None
        self.client: Any = None
        self.run_id: str | None = None

    def start(self, config: Mapping[str, Any], run_id: str | None) -> str:
        import mlflow
        from mlflow import MlflowClient
        from mlflow.entities import Param, RunStatus

        uri = self.options.get("tracking_uri") or mlflow.get_tracking_uri()
        where = "tracking_uri" if self.options.get("tracking_uri") else "MLFLOW_TRACKING_URI"
        probe(str(uri), f"the MLflow server at {where}")
        self.client = client = MlflowClient(tracking_uri=uri)
        if run_id is not None:
            run = client.get_run(run_id)
            held = run.data.tags.get(self.STEP_TAG)
            self.last_step = int(held) if held is not None else None
            client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            self.run_id = run_id
            return run_id
        tags = {str(k): str(v) for k, v in (self.options.get("tags") or {}).items()}
        run = client.create_run(
            self._experiment_id(client), run_name=self.options.get("run_name"), tags=tags
        )
        self.run_id = run.info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in _flatten(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 per batch
            client.log_batch(self.run_id, params=params[i : i + 100])
        return self.run_id

    def _experiment_id(self, client: Any) -> str:
        from mlflow.environment_variables import MLFLOW_EXPERIMENT_ID, MLFLOW_EXPERIMENT_NAME

        given = self.options.get("experiment_id") or MLFLOW_EXPERIMENT_ID.get()
        if given:
            return str(given)
        name = self.options.get("experiment_name") or MLFLOW_EXPERIMENT_NAME.get()
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
    """The trackers of one run, driven together; each call is guarded (see module doc).

    ``running``: the trackers with a run open; a tracker that failed (``failed``) stays off
    for the rest of the process. ``through[name]``: rows at a global step up to this one are
    not sent to that tracker (its run holds them already: a resumed job trains those steps
    again).
    """

    def __init__(
        self, trackers: Sequence[Tracker], options: Mapping[str, Any] | None = None
    ) -> None:
        self.trackers = list(trackers)
        self.running: list[Tracker] = []
        self.failed: set[str] = set()
        self.through: dict[str, int] = {}
        self._scrub = secret_values(dict(options or {}))  # never in a warning
        # Around every call into a tracker's library: fit's SIGTERM guard defers the signal
        # there (rankwise.train.sigterm: a handler must not re-enter the library).
        self.around_calls: Callable[[], contextlib.AbstractContextManager[Any]] = (
            contextlib.nullcontext
        )

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

    def log_metrics(self, step: int, metrics: Mapping[str, float | None]) -> None:
        """Log the numbers in ``metrics`` (None: left out) at global ``step``."""
        numbers = {k: float(v) for k, v in metrics.items() if v is not None}
        for tracker in list(self.running):
            if step > self.through.get(tracker.name, -1):
                self._guard(tracker, "log metrics", tracker.log_metrics, step, numbers)

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
