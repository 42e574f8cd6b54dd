"""The trainer's consistency checks: at start-up, every N steps, and naming a stalled rank.

- :func:`check_start` (every ``fit`` in a world of more than one): the ranks agree on the config, the optimizer's settings,
  the model's parameter names, shapes and dtypes, and the data's length; one all-gather of a
  32-byte digest when they do, else :class:`~rankwise.parallel.InconsistentRanksError` on
  every rank naming the field and the ranks.
- :func:`check_sync` (every ``check_sync_every_n_steps`` optimizer steps): the parameters are
  still equal on every rank, else :class:`~rankwise.parallel.OutOfSyncError` naming them.
- The trainer marks each collective it enters with :class:`rankwise.distributed.Progress`, so
  a collective timeout names the operation and the ranks that did not arrive.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

import rankwise.distributed as rd
from rankwise.parallel import (
    OutOfSyncError,
    check_consistent,
    check_parameters_in_sync,
    model_signature,
)
from rankwise.train.config import DistributedTrainingConfig

# Fields that may differ between ranks: what rank 0 alone uses (console, log files), the
# loader's workers, prefetch and pinning (per-machine resources that change no result), and paths (a node-local mount may be named
# differently on each machine; the resume checks compare what was loaded). Whether
# checkpoint_dir is set and the kind of resume decide which collectives run, so those are
# compared (see _path_kinds).
RANK_LOCAL_FIELDS = frozenset(
    {
        "verbose",
        "log_every_n_batches",
        "log_dir",
        "num_workers",
        "prefetch_factor",
        "pin_memory",
        "checkpoint_dir",
        "resume",
        "checkpoint_storage_options",  # the same on every rank, but may hold credentials
        "logger_options",  # rank 0's trackers' (may hold credentials); loggers is compared
    }
)


def begin_fit(
    cfg: DistributedTrainingConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    data: tuple[Any, Any],
    fit_number: int,
) -> rd.Progress:
    """This fit's own :class:`~rankwise.distributed.Progress`, once the ranks agree on
    ``cfg``, ``model``, ``optimizer`` and the ``(train, validation)`` data.

    The Progress is named by the trainer's fit count (``trainer/fit-2``), never by a
    process-wide counter: a Progress or trainer made on some ranks only shifts nothing.
    """
    progress = rd.Progress(f"trainer/fit-{fit_number}")
    if rd.get_world_size() > 1:  # one rank agrees with itself
        check_start(cfg, model, optimizer, data, progress)
    return progress


def check_start(
    cfg: DistributedTrainingConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    data: tuple[Any, Any],
    progress: rd.Progress,
) -> None:
    """Stop on every rank unless all ranks have the same config, optimizer, model and data.

    Runs before the model is wrapped, so a model of another shape is named here rather than
    in DDP's own check. Data given as a DataLoader is the user's to shard (its length may
    differ legitimately); only datasets and arrays the trainer shards are compared.
    """
    config = {k: v for k, v in cfg.to_dict().items() if k not in RANK_LOCAL_FIELDS}
    config.update(_path_kinds(cfg))
    fields: dict[str, Any] = {"config": config, "model": model_signature(model)}
    if optimizer is not None:  # a factory is built later, from the same code
        fields["optimizer"] = optimizer_settings(optimizer)
    for name, part in zip(("dataset_length", "val_dataset_length"), data, strict=True):
        length = _length(part)
        if length is not None:
            fields[name] = length
    with progress.operation("the start-up consistency check (one all_gather)"):
        check_consistent(fields, hints=_HINTS)


def check_sync(
    model: nn.Module, cfg: DistributedTrainingConfig, step: int, progress: rd.Progress
) -> None:
    """Every ``check_sync_every_n_steps`` optimizer steps: raise :class:`OutOfSyncError` on
    every rank if a parameter differs across ranks."""
    every = cfg.check_sync_every_n_steps
    if not every or step % every:
        return
    with progress.operation(f"check_parameters_in_sync at step {step}"):
        report = check_parameters_in_sync(model)
    if not report:
        differ = f"{len(report.mismatches)} of {report.checked} tensors differ: "
        detail = "; ".join(str(m) for m in report.mismatches)
        raise OutOfSyncError(
            f"parameters out of sync after optimizer step {step} "
            f"(check_sync_every_n_steps={every}): "
            f"{str(report) if report.structure_error else differ + detail}. The ranks must hold equal parameters after every step: something changed them on "
            "some ranks only (a callback or hook that edits weights on one rank, a rank-seeded "
            "random update, a non-deterministic custom op). Make such changes on every rank "
            "alike, or broadcast the parameters from rank 0 afterwards."
        )


def optimizer_settings(optimizer: Any) -> dict[str, Any]:
    """The optimizer's class and each param group's settings (lr, momentum, ...), flat, so a
    mismatch names the setting: ``'param_groups[0].lr': 0.2 instead of 0.1``.

    >>> import torch
    >>> optimizer_settings(torch.optim.SGD([torch.zeros(1)], lr=0.1))["param_groups[0].lr"]
    0.1
    """
    settings: dict[str, Any] = {"class": type(optimizer).__name__}
    for i, group in enumerate(optimizer.param_groups):
        settings[f"param_groups[{i}].params"] = len(group["params"])
        settings.update({f"param_groups[{i}].{k}": v for k, v in group.items() if k != "params"})
    return settings


_HINTS = {
    "optimizer": "build the same optimizer with the same settings (lr, ...) on every rank",
    "val_dataset_length": "every rank must load the same validation data",
}


def _path_kinds(cfg: DistributedTrainingConfig) -> dict[str, str | None]:
    """What of the paths decides the collectives: checkpoint_dir set or not (the save's
    broadcast and barrier), resume None / "auto" / a path (the resume's collectives)."""
    folder = None if cfg.checkpoint_dir is None else "a folder"
    return {
        "checkpoint_dir": folder,
        "resume": cfg.resume if cfg.resume in (None, "auto") else "a path",
    }


def _length(data: Any) -> int | None:
    if data is None or isinstance(data, DataLoader):
        return None
    try:
        return len(data)
    except TypeError:  # an iterable without a length
        return None
