"""rankwise's own log: ``log_dir/metrics.csv`` as a :class:`~rankwise.train.tracking.sink.Sink`,
:class:`CsvLog`. One row per logged step and per epoch end, flushed as written, appended to
by a resumed run and by a new rank 0 (``global_step`` tells repeated steps apart); the last
global step it holds is what a resumed tracker run that cannot say it skips up to."""

from __future__ import annotations

import csv
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from rankwise.train.tracking.sink import EpochRow, StepRow

__all__ = ["CSV_COLUMNS", "EPOCH_COLUMNS", "STEP_COLUMNS", "CsvLog"]

# The CSV's columns. Epoch metrics under other names go to "extra" as "name=value;...".
STEP_COLUMNS = ("loss", "samples_per_second")
EPOCH_COLUMNS = (
    "train_loss",
    "train_accuracy",
    "val_loss",
    "val_accuracy",
    "epoch_seconds",
    "samples_per_second",
    "lr",
)
CSV_COLUMNS = (
    "wall_time",
    "kind",
    "epoch",
    "step",
    "global_step",
    *dict.fromkeys((*STEP_COLUMNS, *EPOCH_COLUMNS)),  # in order, without repeats
    "extra",
)


class CsvLog:
    """``metrics.csv`` in ``log_dir`` (or the next free ``metrics-N.csv`` when an existing one
    has other columns): ``start`` opens it to append, ``finish`` closes it.

    >>> import tempfile
    >>> log = CsvLog(Path(tempfile.mkdtemp()))
    >>> log.start({}, None)
    >>> log.log_step(StepRow(0, 2, 2, loss=0.5, samples_per_second=100.0))
    >>> log.finish()
    >>> log.last_step, CsvLog.read_last_step(log.path)  # new when opened; now through step 2
    (None, 2)
    """

    name = "csv"

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.path = log_dir / "metrics.csv"
        self.last_step: int | None = None  # the last global step the file held when opened
        self._file: IO[str] | None = None
        self._writer: Any = None  # csv.writer

    def start(self, config: Mapping[str, Any], run_id: str | None) -> None:
        self.path = path = _csv_path(self.log_dir)
        fresh = not path.exists() or path.stat().st_size == 0
        # Appending: a resumed run continues the same log (it may repeat the steps since the
        # checkpoint it resumed from; "global_step" tells them apart). The last step it holds
        # tells a resumed tracker run that cannot say it which steps it has already.
        self.last_step = None if fresh else self.read_last_step(path)
        self._file = path.open("a", newline="")
        self._writer = csv.writer(self._file)
        if fresh:
            self._writer.writerow(CSV_COLUMNS)
            self._file.flush()

    def log_step(self, row: StepRow) -> None:
        self._write_row(
            "step",
            row.epoch,
            row.micro_batches,
            row.global_step,
            loss=row.loss,
            samples_per_second=row.samples_per_second,
        )

    def log_epoch(self, row: EpochRow) -> None:
        self._write_row("epoch", row.epoch, None, row.global_step, **row.metrics)

    def log_artifact(self, path: Path) -> None:
        """Nothing: the trackers keep artifacts, the CSV its rows."""

    def finish(self, failed: bool = False) -> None:
        if self._file is not None:
            self._file.close()
            self._file = self._writer = None

    def _write_row(
        self,
        kind: str,
        epoch: int,
        step: int | None,
        global_step: int | None,
        **values: float | None,
    ) -> None:
        if self._writer is None or self._file is None:
            return
        row: dict[str, Any] = {
            "wall_time": f"{time.time():.3f}",
            "kind": kind,
            "epoch": epoch + 1,
            "step": step,
            "global_step": global_step,
        }
        extra = []
        for name, value in values.items():
            if name in CSV_COLUMNS:
                row[name] = value
            else:
                extra.append(f"{name}={value}")
        row["extra"] = ";".join(extra)
        self._writer.writerow(["" if row.get(c) is None else row[c] for c in CSV_COLUMNS])
        self._file.flush()

    @staticmethod
    def read_last_step(path: Path, tail: int = 1 << 16) -> int | None:
        """The largest ``global_step`` in the last rows of the CSV at ``path`` (None: no row)."""
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - tail))
            lines = f.read().decode(errors="replace").splitlines()[1:]  # the first may be cut
        at = CSV_COLUMNS.index("global_step")
        steps = []
        for row in csv.reader(lines):
            if len(row) == len(CSV_COLUMNS) and row[at].isdigit():
                steps.append(int(row[at]))
        return max(steps, default=None)


def _csv_path(log_dir: Path) -> Path:
    """``metrics.csv``, or the next free ``metrics-N.csv`` if an existing one has other columns
    (a log from another rankwise version is never mixed with this one)."""
    header = ",".join(CSV_COLUMNS)
    path, n = log_dir / "metrics.csv", 1
    while path.exists() and path.stat().st_size:
        with path.open(newline="") as f:
            if f.readline().rstrip("\r\n") == header:
                break
        path, n = log_dir / f"metrics-{n}.csv", n + 1
    return path
