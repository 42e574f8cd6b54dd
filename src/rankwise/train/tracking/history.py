"""What a training run did: :class:`DistributedTrainingHistory`, saved as JSON, plotted to PNG.

The fields are the CyxWiz guide's (``train_losses``, ``val_accuracies``, ``samples_per_second``,
...) plus the time of every epoch. The lists hold one entry per epoch and stay aligned: epoch
``i`` (0-based) is index ``i`` of every list, and an entry is ``None`` where there was nothing to
measure (no validation data; targets that are not class labels).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankwise.validation import did_you_mean

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_PER_EPOCH = ("train_losses", "train_accuracies", "val_losses", "val_accuracies", "epoch_times")


@dataclasses.dataclass
class DistributedTrainingHistory:
    """Per-epoch losses and accuracies, and the run's throughput, as the trainer's ``fit`` returns.

    Losses and accuracies are means over every real sample of all ranks (reduced before they are
    recorded), so every rank holds the same history. Accuracies are fractions in [0, 1].

    >>> h = DistributedTrainingHistory(world_size=2, effective_batch_size=128)
    >>> h.append_epoch(train_loss=0.9, train_acc=0.7, val_loss=None, val_acc=None, seconds=1.5)
    >>> h.append_epoch(train_loss=0.4, train_acc=0.9, val_loss=None, val_acc=None, seconds=1.5)
    >>> h.epochs, h.train_losses, h.val_losses
    (2, [0.9, 0.4], [None, None])
    >>> DistributedTrainingHistory.from_dict(h.to_dict()) == h
    True
    """

    train_losses: list[float] = dataclasses.field(default_factory=list)
    train_accuracies: list[float | None] = dataclasses.field(default_factory=list)
    val_losses: list[float | None] = dataclasses.field(default_factory=list)
    val_accuracies: list[float | None] = dataclasses.field(default_factory=list)
    epoch_times: list[float] = dataclasses.field(default_factory=list)  # seconds
    total_time_seconds: float = 0.0
    samples_per_second: float = 0.0  # global: all ranks' samples over the wall time
    effective_batch_size: int = 0  # batch_size x world_size x grad_accum_steps
    world_size: int = 1

    @property
    def epochs(self) -> int:
        """How many epochs are recorded."""
        return len(self.train_losses)

    def append_epoch(
        self,
        train_loss: float,
        train_acc: float | None,
        val_loss: float | None,
        val_acc: float | None,
        seconds: float,
    ) -> None:
        """Record one finished epoch (``None`` where a value was not measured)."""
        self.train_losses.append(_number("train_loss", train_loss))
        self.train_accuracies.append(_fraction("train_acc", train_acc))
        self.val_losses.append(None if val_loss is None else _number("val_loss", val_loss))
        self.val_accuracies.append(_fraction("val_acc", val_acc))
        self.epoch_times.append(_number("seconds", seconds))

    # -- dicts and JSON ---------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain lists and numbers (what ``save`` writes and checkpoints keep)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> DistributedTrainingHistory:
        """A history from ``to_dict()``'s output; missing fields keep their defaults."""
        if not isinstance(values, Mapping):
            raise ValueError(
                f"DistributedTrainingHistory.from_dict needs a mapping, got "
                f"{type(values).__name__}; pass what to_dict() returned."
            )
        names = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in names:
                hint = did_you_mean(key, names)
                raise ValueError(
                    f"unknown DistributedTrainingHistory field {key!r}{hint}; "
                    f"the fields are: {', '.join(names)}."
                )
        copied: dict[str, Any] = {k: list(v) if k in _PER_EPOCH else v for k, v in values.items()}
        history = cls(**copied)
        lengths = {name: len(getattr(history, name)) for name in _PER_EPOCH}
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"DistributedTrainingHistory lists must have one entry per epoch, got lengths "
                f"{lengths}; pad missing values with None."
            )
        return history

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the history as JSON (to a temporary file, then renamed: never half a file).

        Returns the path. ``load`` reads it back.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> DistributedTrainingHistory:
        """Read a history that ``save`` wrote; a ValueError names the file if it is not one."""
        path = Path(path)
        try:
            values = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not a JSON history file: {exc}") from exc
        try:
            return cls.from_dict(values)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path} is not a DistributedTrainingHistory: {exc}") from exc

    # -- plot -------------------------------------------------------------------------------

    def plot(self, path: str | os.PathLike[str]) -> Path:
        """Draw loss and accuracy per epoch (train and validation) to a PNG; returns the path.

        Uses matplotlib's Agg canvas directly (no pyplot, no display, no global state).
        """
        try:
            from matplotlib.figure import Figure
        except ImportError as exc:
            raise ImportError(
                "DistributedTrainingHistory.plot needs matplotlib: pip install matplotlib "
                "(or pip install 'rankwise[demo]')."
            ) from exc
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure = Figure(figsize=(11, 4.2), dpi=110, layout="constrained")
        loss_axes, acc_axes = figure.subplots(1, 2)
        nothing = "no epochs recorded"
        no_classes = "no class targets\n(accuracy is measured for class-label targets only)"
        _draw(loss_axes, "loss", self.train_losses, self.val_losses, nothing)
        _draw(
            acc_axes,
            "accuracy",
            self.train_accuracies,
            self.val_accuracies,
            no_classes if self.epochs else nothing,
        )
        if any(v is not None for v in (*self.train_accuracies, *self.val_accuracies)):
            from matplotlib.ticker import PercentFormatter

            acc_axes.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
        figure.suptitle(self._title())
        figure.savefig(path, format="png")
        return path

    def _title(self) -> str:
        parts = [
            f"{self.epochs} epoch{'s' if self.epochs != 1 else ''}",
            f"world size {self.world_size}",
            f"effective batch {self.effective_batch_size}",
            f"{self.samples_per_second:,.0f} samples/s",
        ]
        if self.total_time_seconds:
            parts.append(f"{self.total_time_seconds:,.1f} s")
        return "  ·  ".join(parts)


def _draw(
    axes: Axes,
    what: str,
    train: Sequence[float | None],
    val: Sequence[float | None],
    empty_note: str,
) -> None:
    """One panel: train and validation curves of ``what`` against the epoch (1-based)."""
    from matplotlib.ticker import MaxNLocator

    axes.set_title(what)
    axes.set_xlabel("epoch")
    axes.set_ylabel(what)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    drawn = 0
    for label, values, style in (("train", train, "-o"), ("validation", val, "--s")):
        points = [(i + 1, v) for i, v in enumerate(values) if v is not None]
        if points:
            epochs, ys = zip(*points, strict=True)
            marker = style if len(points) <= 30 else style[:-1]  # markers only while readable
            axes.plot(epochs, ys, marker, label=label, markersize=4)
            drawn += 1
    if drawn:
        shown = [v for v in (*train, *val) if v is not None and math.isfinite(v)]
        if what == "loss" and shown and min(shown) > 0 and max(shown) / min(shown) > 100:
            axes.set_yscale("log")  # a loss falling by decades is flat on a linear axis
        axes.grid(True, alpha=0.3)
        axes.legend()
    else:
        axes.text(
            0.5, 0.5, empty_note, ha="center", va="center", color="0.4", transform=axes.transAxes
        )
        axes.set_xticks([])
        axes.set_yticks([])


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} ({value!r}) must be a number; pass a float such as loss.item().")
    return float(value)


def _fraction(name: str, value: Any) -> float | None:
    if value is None:
        return None
    value = _number(name, value)
    if not (0.0 <= value <= 1.0 or math.isnan(value)):
        raise ValueError(
            f"{name} ({value!r}) must be a fraction in [0, 1] (correct / total), or None where "
            "the targets are not class labels; divide a percentage by 100."
        )
    return value
