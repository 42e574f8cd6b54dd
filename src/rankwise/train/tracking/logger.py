"""Rank-0 output of a training run: :class:`TrainingLogger`.

One object owns everything a run prints or logs, and on every rank but rank 0 it does nothing
(the trainer passes ``is_master``), so the logs are written once and the console is not
multiplied by the world size:

- a tqdm progress bar per epoch with the loss and the global samples/s, when ``verbose`` and
  stderr is a terminal (or ``progress_bar=True``);
- otherwise a line every ``log_every_n_batches`` steps:
  ``epoch 2/10 step 40/113 loss 0.4312 1,234 samples/s``;
- an epoch summary line;
- the same rows to every :class:`~rankwise.train.tracking.sink.Sink`:
  ``log_dir/metrics.csv`` (one row per logged step and per epoch end, flushed as written:
  :mod:`~rankwise.train.tracking.csv_log`), TensorBoard event files in ``log_dir`` when
  ``torch.utils.tensorboard`` imports (:mod:`~rankwise.train.tracking.tensorboard_log`), and
  the experiment trackers (W&B, MLflow: :mod:`~rankwise.train.tracking.tracker_set`), with the
  run's config at their start and the history and final checkpoint's manifest at their end,
  one tracker run across restarts and a new rank 0.

``loggers`` picks among ``"csv"``, ``"tensorboard"``, ``"wandb"`` and ``"mlflow"``; None is
today's default: the CSV and, when installed, TensorBoard, both when ``log_dir`` is set.

Epochs are passed counted from 0 (as the sampler and checkpoints count them) and shown counted
from 1, in the console, the CSV and TensorBoard alike.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

from rankwise.train.sigterm import Duty, SigtermGuard
from rankwise.train.tracking.csv_log import CsvLog
from rankwise.train.tracking.sink import EpochRow, Sink, StepRow
from rankwise.train.tracking.tensorboard_log import TensorBoardLog
from rankwise.train.tracking.tracker_set import TrackerSet, build_trackers

# Short names the trainer or users may use for the same quantities.
_ALIASES = {"train_acc": "train_accuracy", "val_acc": "val_accuracy", "seconds": "epoch_seconds"}


class TrainingLogger:
    """Progress bar, step lines, epoch summaries, CSV and TensorBoard logs, on rank 0 only.

    ``log_dir``: where ``metrics.csv`` and the TensorBoard files go (None: no files).
    ``verbose``: console output at all. ``log_every_n_batches``: step lines and step rows
    every N steps of an epoch (0: none). ``is_master``: False makes every method a no-op.
    ``progress_bar``: None shows the bar when stderr is a terminal; True / False force it.
    ``epochs``: the run's epoch count, shown as ``epoch 2/10``. ``stream``: where lines go
    (default: stdout at the time of writing). ``loggers``: the names of what to write to
    (None: ``csv`` and ``tensorboard`` if installed, with ``log_dir``); ``logger_options``:
    the trackers' own (``{"wandb": {"project": ...}}``). A tracker's package missing raises
    ``ImportError`` here, on every rank (before the first step), naming the extra.
    ``sigterm``: fit's SIGTERM guard, which then closes the trackers' runs as failed on
    SIGTERM (:meth:`sigterm_duty`) and is deferred around every call into a tracker.

    >>> import io
    >>> out = io.StringIO()
    >>> log = TrainingLogger(None, verbose=True, log_every_n_batches=2, is_master=True,
    ...                      progress_bar=False, stream=out)
    >>> log.start_epoch(0, total_steps=4)
    >>> for step in range(1, 5):
    ...     log.step(step, step, loss=1.0 / step, samples_per_second=1234.5)
    >>> log.end_epoch(0, {"train_loss": 0.52, "train_accuracy": 0.75})
    >>> log.close()
    >>> print(out.getvalue(), end="")
    epoch 1 batch 2/4 loss 0.5000 1,234 samples/s
    epoch 1 batch 4/4 loss 0.2500 1,234 samples/s
    epoch 1 done: train_loss 0.5200 train_accuracy 75.00%
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None,
        verbose: bool,
        log_every_n_batches: int,
        is_master: bool,
        *,
        progress_bar: bool | None = None,
        epochs: int | None = None,
        stream: TextIO | None = None,
        loggers: Iterable[str] | None = None,
        logger_options: Mapping[str, Any] | None = None,
        sigterm: SigtermGuard | None = None,
    ) -> None:
        if isinstance(log_every_n_batches, bool) or not isinstance(log_every_n_batches, int):
            raise ValueError(
                f"log_every_n_batches ({log_every_n_batches!r}) must be an integer >= 0 "
                "(0 turns step lines off)."
            )
        if log_every_n_batches < 0:
            raise ValueError(
                f"log_every_n_batches ({log_every_n_batches}) must be >= 0; 0 turns step lines off."
            )
        self.enabled = bool(is_master)
        self.verbose = bool(verbose)
        self.every = log_every_n_batches
        self.epochs = epochs
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self._force_bar = progress_bar
        self._stream = stream
        self._bar: Any = None  # tqdm.tqdm while an epoch runs with a bar
        self._epoch, self._total = 0, 0
        self._rows_at = 0  # micro-batches done at the last row
        self.files: list[Sink] = []  # the CSV and TensorBoard logs, open on the logging rank
        self._global_step: int | None = None  # the last one step() saw, for epoch rows
        names = ("csv", "tensorboard") if loggers is None else tuple(loggers)
        self._csv_wanted = "csv" in names and self.log_dir is not None
        # None: today's default, TensorBoard when it imports; True: asked for by name
        self._tb_wanted: bool | None = None if loggers is None else "tensorboard" in names
        options = dict(logger_options or {})
        around = contextlib.nullcontext if sigterm is None else sigterm.deferred
        trackers = build_trackers(names, options)  # checks packages
        self.trackers = TrackerSet(trackers, options, around_calls=around)
        if sigterm is not None:
            sigterm.add(self.sigterm_duty())
        self._run_config: dict[str, Any] = {}
        self._csv_through: int | None = None  # the last global step an existing CSV holds
        if self.enabled and self.log_dir is not None:
            self._open_logs(self.log_dir)

    # -- the trainer's calls ----------------------------------------------------------------

    def start_run(self, config: Mapping[str, Any], run_ids: Mapping[str, str]) -> dict[str, str]:
        """Start the trackers' runs with ``config`` (the hyper-parameters), or go on with the
        runs in ``run_ids`` (from a checkpoint); return ``{tracker: run id}`` ({} but on the
        logging rank; :func:`~rankwise.train.tracking.tracker_set.share_run_ids` tells the others)."""
        self._run_config = dict(config)
        if not self.enabled or not self.trackers:
            return {}
        return self.trackers.start(config, run_ids, logged_through=self._csv_through)

    def log_artifacts(self, paths: Iterable[str | os.PathLike[str]]) -> None:
        """Upload each existing file in ``paths`` to every tracker (the logging rank only)."""
        if self.enabled:
            for path in paths:
                if Path(path).is_file():
                    self.trackers.log_artifact(Path(path))

    def start_epoch(self, epoch: int, total_steps: int) -> None:
        """An epoch of ``total_steps`` micro-batches (0: unknown) begins; opens its bar."""
        if not self.enabled:
            return
        self._close_bar()
        self._epoch, self._total = epoch, total_steps
        self._rows_at = 0  # micro-batches done at the last row
        if self.verbose and self._bar_wanted():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_steps or None,
                desc=self._epoch_label(),
                unit="batch",
                file=sys.stderr,
                dynamic_ncols=True,
                leave=True,
            )

    def step(
        self, micro_batches: int, global_step: int, loss: float | None, samples_per_second: float
    ) -> None:
        """``micro_batches`` micro-batches of this epoch are done (counted from 1) and
        ``global_step`` optimizer steps in all (with gradient accumulation the two differ:
        the bar and ``log_every_n_batches`` count micro-batches, the rows carry both).

        Moves the bar; every ``log_every_n_batches`` micro-batches writes a CSV row and TensorBoard
        scalars, and prints a line when there is no bar. ``loss`` is None while no loss has
        reached the host yet (the trainer never waits for the GPU to show one): the line
        says ``loss pending`` and the CSV cell stays empty.
        """
        if not self.enabled:
            return
        self._global_step = global_step
        if self._bar is not None:
            self._bar.set_postfix_str(
                f"loss {_loss(loss)}, {samples_per_second:,.0f} samples/s", refresh=False
            )
            self._bar.update(micro_batches - self._bar.n)
        # A row at each multiple of `every` micro-batches, or at the first call past one (with
        # gradient accumulation the loop calls once per optimizer step).
        if not self.every or micro_batches // self.every <= self._rows_at // self.every:
            return
        self._rows_at = micro_batches
        if self.verbose and self._bar is None:
            of = f"/{self._total}" if self._total else ""
            self._print(
                f"{self._epoch_label()} batch {micro_batches}{of} loss {_loss(loss)} "
                f"{samples_per_second:,.0f} samples/s"
            )
        row = StepRow(self._epoch, micro_batches, global_step, loss, samples_per_second)
        for sink in self._sinks():
            sink.log_step(row)

    def end_epoch(
        self, epoch: int, metrics: Mapping[str, float | None], global_step: int | None = None
    ) -> None:
        """The epoch is over: close its bar, print a summary, log ``metrics`` (None: skipped).
        ``global_step``: the optimizer steps done (the trackers' step for the epoch's row;
        default: the last one :meth:`step` saw)."""
        if not self.enabled:
            return
        self._close_bar()
        self._epoch = epoch
        if global_step is not None:
            self._global_step = global_step
        shown = {_ALIASES.get(k, k): v for k, v in metrics.items() if v is not None}
        if self.verbose:
            summary = " ".join(f"{name} {_format(name, v)}" for name, v in shown.items())
            self._print(f"{self._epoch_label()} done: {summary}".rstrip())
        row = EpochRow(epoch, self._global_step, shown)
        for sink in self._sinks():
            sink.log_epoch(row)

    def info(self, message: str) -> None:
        """Print one line on rank 0 when verbose (for the trainer's own notes)."""
        if self.enabled and self.verbose:
            self._print(message)

    def follow(
        self,
        is_master: bool,
        global_step: int | None = None,
        run_ids: Mapping[str, str] | None = None,
    ) -> None:
        """Become the logging rank, or stop being it (``--on-failure continue``: after a
        regroup rank 0 may be another process; a restarted process logs nothing until it has
        joined). Log files are opened in append mode, so the new rank 0 continues them, and
        the trackers go on with the runs in ``run_ids`` (the state every rank holds).
        ``global_step``: where training is (the next epoch row's step)."""
        if global_step is not None:
            self._global_step = global_step
        if bool(is_master) == self.enabled:
            return
        self.close()
        self.enabled = bool(is_master)
        if self.enabled and self.log_dir is not None:
            self._open_logs(self.log_dir)
        if self.enabled and self.trackers:
            self.trackers.start(
                self._run_config,
                dict(run_ids or {}),
                logged_through=self._csv_through,
                resume_only=True,
            )

    def close(self, failed: bool = False) -> None:
        """Close the bar, the log files and the trackers' runs (``failed``: the fit raised);
        safe to call twice."""
        self._close_bar()
        self.trackers.finish(failed)
        files, self.files = self.files, []
        for sink in files:
            sink.finish(failed)

    def sigterm_duty(self) -> Duty:
        """On SIGTERM (:mod:`rankwise.train.sigterm`): the trackers' open runs end as failed
        (MLflow ``FAILED``, W&B exit code 1) rather than "running" for good. The CSV is
        flushed row by row already."""
        return Duty(
            "closing the trackers' runs",
            lambda: bool(self.trackers.running),
            lambda: self.trackers.finish(failed=True),
            if_ending=True,  # a program that goes on after SIGTERM keeps its runs open
        )

    def __enter__(self) -> TrainingLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- pieces -----------------------------------------------------------------------------

    def _bar_wanted(self) -> bool:
        if self._force_bar is not None:
            return self._force_bar
        return bool(getattr(sys.stderr, "isatty", lambda: False)())

    def _epoch_label(self) -> str:
        of = f"/{self.epochs}" if self.epochs else ""
        return f"epoch {self._epoch + 1}{of}"

    def _print(self, line: str) -> None:
        stream = self._stream if self._stream is not None else sys.stdout
        print(line, file=stream, flush=True)

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _sinks(self) -> list[Sink | TrackerSet]:
        """Where rows go, in order: the files, then the trackers (guarded)."""
        return [*self.files, self.trackers]

    def _open_logs(self, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        if self._csv_wanted:
            csv_log = CsvLog(log_dir)
            csv_log.start(self._run_config, None)
            self._csv_through = csv_log.last_step
            self.files.append(csv_log)
        if self._tb_wanted is False:
            return
        tensorboard = TensorBoardLog(log_dir)
        try:
            tensorboard.start(self._run_config, None)
        except ImportError:
            if self._tb_wanted:  # asked for by name: trackers.require checked the package
                raise
            if self.verbose:
                self._print(
                    "rankwise: tensorboard is not installed, so only the CSV log is written "
                    "(pip install 'rankwise[tensorboard]' for TensorBoard files)."
                )
            return
        self.files.append(tensorboard)


def _loss(value: float | None) -> str:
    return "pending" if value is None else f"{value:.4f}"


def _format(name: str, value: float) -> str:
    if "accuracy" in name and 0 <= value <= 1:
        return f"{value:.2%}"
    if "seconds" in name:
        return f"{value:.1f}s"
    if "samples" in name:
        return f"{value:,.0f}"
    if name == "lr" or (value != 0 and math.isfinite(value) and abs(value) < 1e-3):
        return f"{value:.3g}"
    return f"{value:.4f}"
