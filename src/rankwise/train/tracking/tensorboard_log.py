"""TensorBoard event files in ``log_dir`` as a :class:`~rankwise.train.tracking.sink.Sink`:
:class:`TensorBoardLog`, through ``torch.utils.tensorboard.SummaryWriter``. Step rows are
scalars at the global step (``step/loss``, ``step/samples_per_second``), epoch rows at the
epoch counted from 1 (``epoch/train_loss``, ...)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rankwise.train.tracking.sink import EpochRow, StepRow

__all__ = ["TensorBoardLog"]


class TensorBoardLog:
    """TensorBoard files in ``log_dir``; ``start`` raises ``ImportError`` where the
    ``tensorboard`` package is missing (the logger decides whether that is an error)."""

    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.last_step: int | None = None  # event files cannot be asked
        self._writer: Any = None  # torch.utils.tensorboard.SummaryWriter

    def start(self, config: Mapping[str, Any], run_id: str | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def log_step(self, row: StepRow) -> None:
        if self._writer is None:
            return
        if row.loss is not None:
            self._writer.add_scalar("step/loss", row.loss, row.global_step)
        self._writer.add_scalar("step/samples_per_second", row.samples_per_second, row.global_step)

    def log_epoch(self, row: EpochRow) -> None:
        if self._writer is None:
            return
        for name, value in row.metrics.items():
            self._writer.add_scalar(f"epoch/{name}", value, row.epoch + 1)
        self._writer.flush()

    def log_artifact(self, path: Path) -> None:
        """Nothing: TensorBoard keeps scalars, the trackers artifacts."""

    def finish(self, failed: bool = False) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
