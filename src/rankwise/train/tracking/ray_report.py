"""Reporting a ``fit`` to Ray Train: each epoch's metrics, and where its checkpoint is.

``DistributedTrainer.fit`` runs unchanged inside ``ray.train.torch.TorchTrainer``: Ray builds
the process group and sets ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``, and rankwise adopts the
group (:func:`rankwise.distributed.init`). :class:`RayReport`, one of the trainer's callbacks,
adds what Ray Tune and Ray's dashboard read: one ``ray.train.report`` per epoch, on every
worker (Ray's report is a barrier each worker must reach as often as the others).

What a report holds, e.g. after epoch 1 (0-based, as rankwise's callbacks count) at step 24::

    {"train_loss": 0.41, "train_accuracy": 0.87, "epoch_seconds": 1.9,    # the epoch's
     "epoch": 1, "step": 24,                                              # metrics (None
     "rankwise_checkpoint": "/shared/run/ckpt-e000002-s000000024.pt"}     # ones left out)

and, from rank 0, a Ray ``Checkpoint`` that is a *pointer*: a folder with one small JSON file
(:data:`POINTER_FILE`: path, epoch, step) that Ray copies into its ``storage_path``. The state
itself stays where rankwise wrote it (``checkpoint_dir``, shared by all nodes: a shared file
system or an ``s3://`` URL), so no model and optimizer state is copied a second time at every
epoch; :func:`rankwise_checkpoint` reads a pointer back (``result.checkpoint``,
``result.best_checkpoints``). The report comes once the epoch's checkpoint is durable (the
trainer waits for a background write, which it otherwise overlaps with the next epoch), so
the metrics Ray attaches to a checkpoint are those of the epoch it holds. An epoch that saves
nothing (``checkpoint_every_n_epochs`` > 1, no ``checkpoint_dir``) is reported without a
checkpoint: Ray Tune sees its metrics, while Ray Train's ``Result.metrics`` follows the
reports that carry one.

A restart (Ray's ``FailureConfig(max_failures=N)``) resumes from rankwise's own newest valid
checkpoint with ``resume="auto"`` (not from Ray's pointer), so the epochs reported before the
failure are not reported again unless their checkpoint was lost.
"""

from __future__ import annotations

import importlib
import json
import logging
import tempfile
import warnings
from pathlib import Path
from typing import Any

import rankwise.distributed as rd
from rankwise.distributed.errors import RankwiseWarning

__all__ = [
    "CLEANER_LOGGER",
    "POINTER_FILE",
    "RayReport",
    "check_checkpoint_dir",
    "quiet_ray_workers",
    "rankwise_checkpoint",
]

# The logger of Ray Train's placement-group cleaner (ray 2.5x-2.60), an actor Ray starts beside
# every run's controller. It asks Ray's State API once a second whether the controller lives;
# without that API (no dashboard: ray[train], which rankwise[ray] is, does not bring its
# packages, and include_dashboard=False turns it off) each question logs a warning, about one
# a second of training, each forwarded to the driver's console.
CLEANER_LOGGER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"


def quiet_ray_workers() -> None:
    """A Ray ``worker_process_setup_hook``: sets :data:`CLEANER_LOGGER` to ERROR in each Ray
    worker process, so its "Failed to query Ray Train Controller actor state" warnings (one a
    second without Ray's State API) stop; Ray's other messages are untouched. Give it to
    ``ray.init(runtime_env={"worker_process_setup_hook":
    "rankwise.train.ray_report.quiet_ray_workers"})``, as examples/ray_train.py does."""
    logging.getLogger(CLEANER_LOGGER).setLevel(logging.ERROR)


POINTER_FILE = "rankwise_checkpoint.json"  # what a Ray checkpoint RayReport reported holds
_POINTER_FORMAT = 1


class RayReport:
    """Report each epoch's metrics and checkpoint to Ray Train (``ray.train.report``).

    Add it to the trainer's callbacks inside the function ``TorchTrainer`` runs on every
    worker::

        def train_func(config):
            trainer = DistributedTrainer(model, loss_fn, optimizer, callbacks=[RayReport()])
            trainer.fit(x, y, DistributedTrainingConfig(checkpoint_dir="/shared/run",
                                                        resume="auto"))

    ``checkpoint=False`` reports the metrics alone (no pointer checkpoint: Ray Tune still
    sees every epoch, Ray Train's ``Result.metrics`` stays None). Needs ``rankwise[ray]``.
    """

    def __init__(self, checkpoint: bool = True) -> None:
        self.checkpoint = checkpoint
        self._ray_train: Any = None  # the ray.train module, once fit starts

    def on_fit_start(self, trainer: Any) -> None:
        ray_train = _ray_train()
        try:
            ray_train.get_context()
        except RuntimeError:
            raise RuntimeError(
                "RayReport reports to Ray Train, but this fit() does not run in a Ray Train "
                "worker; call fit() inside the function that ray.train.torch.TorchTrainer "
                "runs (TorchTrainer(train_func, ...).fit()), or leave RayReport out of the "
                "callbacks."
            ) from None
        self._ray_train = ray_train
        check_checkpoint_dir(trainer.config.checkpoint_dir if trainer.config else None)

    def on_epoch_saved(
        self, trainer: Any, epoch: int, metrics: dict[str, float | None], path: Any
    ) -> None:
        step = trainer.global_step
        where = _absolute(path) if path is not None else None
        values: dict[str, Any] = {k: v for k, v in metrics.items() if v is not None}
        values.update(epoch=epoch, step=step)
        if where is not None:
            values["rankwise_checkpoint"] = where
        ray_train = self._ray_train
        if where is None or not self.checkpoint or not rd.is_master():
            ray_train.report(values)  # every worker reports; rank 0's pointer is the one
            return
        with tempfile.TemporaryDirectory(prefix="rankwise-ray-") as folder:
            pointer = {"format": _POINTER_FORMAT, "path": where, "epoch": epoch, "step": step}
            (Path(folder) / POINTER_FILE).write_text(json.dumps(pointer) + "\n")
            # Ray copies the folder (one small file) into its storage_path before returning.
            ray_train.report(values, checkpoint=ray_train.Checkpoint.from_directory(folder))


def check_checkpoint_dir(folder: str | None) -> None:
    """Warn when ``checkpoint_dir`` is a relative path: a Ray Train worker runs in a folder of
    Ray's session (``<temp>/session_*/artifacts/<run>``), so the checkpoints would stay on one
    node and in one Ray session, where a restart elsewhere cannot resume from them."""
    if folder is not None and "://" not in folder and not Path(folder).is_absolute():
        warnings.warn(
            f"checkpoint_dir={folder!r} is relative, and a Ray Train worker runs in Ray's "
            f"session folder ({Path.cwd()}): its checkpoints stay on this node and in this Ray "
            "session. Give an absolute path on storage every node shares (or an s3:// URL), so "
            "that a restart on another node resumes from it.",
            RankwiseWarning,
            stacklevel=3,
        )


def rankwise_checkpoint(checkpoint: Any) -> str:
    """The rankwise checkpoint a Ray checkpoint from :class:`RayReport` points to: a local
    path or a URL, for ``trainer.load_checkpoint(...)`` or ``resume=...``.

    ``checkpoint``: a ``ray.train.Checkpoint`` (``result.checkpoint``, one of
    ``result.best_checkpoints``, ``ray.train.get_checkpoint()``).
    """
    with checkpoint.as_directory() as folder:
        pointer = Path(folder) / POINTER_FILE
        if not pointer.is_file():
            raise ValueError(
                f"the Ray checkpoint at {checkpoint.path} holds no {POINTER_FILE}, so RayReport "
                "did not report it; pass a checkpoint from a run whose trainer had RayReport "
                "among its callbacks (result.checkpoint, result.best_checkpoints)."
            )
        return str(json.loads(pointer.read_text())["path"])


def _absolute(path: Any) -> str:
    """A checkpoint's location as another process reads it: a local path made absolute (a Ray
    worker's working folder is Ray's own), a URL as it is."""
    return str(path.absolute()) if isinstance(path, Path) else str(path)


def _ray_train() -> Any:
    """The ``ray.train`` module (imported by name: Ray is an optional extra)."""
    try:
        return importlib.import_module("ray.train")
    except ImportError:
        raise ImportError(
            "RayReport needs Ray Train, which is not installed: pip install -c constraints.txt "
            "'rankwise[ray]' (or pip install 'ray[train]')."
        ) from None
