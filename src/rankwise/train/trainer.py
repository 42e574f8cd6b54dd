"""``DistributedTrainer``: the CyxWiz guide's high-level API on rankwise's layers.

>>> import torch
>>> from rankwise.train import DistributedTrainer, DistributedTrainingConfig
>>> net = torch.nn.Linear(4, 3)
>>> trainer = DistributedTrainer(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1))
>>> cfg = DistributedTrainingConfig(epochs=2, batch_size=8, verbose=False, checkpoint_dir=None)
>>> history = trainer.fit(torch.randn(32, 4), torch.randint(0, 3, (32,)), cfg)
>>> len(history.train_losses), trainer.get_world_size()
(2, 1)

The same script runs on N processes under ``rankwise launch --nproc-per-node N``: each rank
trains on its own shard (rankwise's sampler), DDP averages gradients, metrics are reduced
exactly, rank 0 prints and writes checkpoints. See ``docs/train.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

import rankwise.distributed as rd
from rankwise.parallel import unwrap_model
from rankwise.train import checkpoint as ck
from rankwise.train import checks
from rankwise.train import resume as st
from rankwise.train.config import DistributedTrainingConfig
from rankwise.train.data import (
    TrainBatches,
    UserBatches,
    as_dataset,
    eval_data,
    parse_fit_args,
    split_validation,
    to_device,
)
from rankwise.train.evaluation import EvalBatches, eval_batches, evaluate_exact, predict_all
from rankwise.train.history import DistributedTrainingHistory
from rankwise.train.loggers import TrainingLogger
from rankwise.train.loop import EpochSums, train_epoch
from rankwise.train.setup import Prepared, prepare, resolve_device, scale_lr, seed_everything

OptimizerSpec = torch.optim.Optimizer | Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


class DistributedTrainer:
    """Train ``model`` data-parallel over all ranks of the world (a world of one without a
    launcher).

    - ``loss_fn(outputs, targets) -> mean loss``; ``None`` when the model returns a dict with
      a ``"loss"`` entry (e.g. a VAE), then batches may be inputs alone.
    - ``optimizer``: an optimizer over ``model.parameters()``, or a callable
      ``params -> optimizer``. Under ``strategy="fsdp"`` the parameters change when the model
      is sharded; an instance is then rebuilt with the same class and param-group settings.
    - ``scheduler``: an LR scheduler over that optimizer, or a callable ``optimizer ->
      scheduler`` (required with FSDP when the optimizer is given as an instance).
    - ``device`` (``"cpu"``, ``"cuda:1"``, a CUDA index): default ``rd.device()``. A model
      that comes wrapped (DDP, DataParallel, FSDP2) is trained as it is, never wrapped twice.
    - ``callbacks``: objects with any of ``on_fit_start(trainer)``, ``on_epoch_end(trainer,
      epoch, metrics)``, ``on_checkpoint_saved(trainer, path)``, ``on_fit_end(trainer,
      history)``, ``on_batch(trainer, epoch, step, sample_ids)``.

    ``trainer.on_batch`` (None by default) is the same per-micro-batch hook without a callback
    object: ``sample_ids`` are the dataset indices of this rank's micro-batch when the trainer
    built the sampler (arrays, Datasets), else None. Unused, it costs nothing.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[..., torch.Tensor] | None,
        optimizer: OptimizerSpec,
        scheduler: Any = None,
        callbacks: Sequence[Any] = (),
        device: torch.device | str | int | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
        if not (isinstance(optimizer, torch.optim.Optimizer) or callable(optimizer)):
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer or a callable params -> optimizer, "
                f"got {type(optimizer).__name__}."
            )
        rd.init()  # idempotent; a world of one without launcher variables
        self.module = unwrap_model(model)
        self.model: nn.Module = model
        self.loss_fn = loss_fn
        self._optimizer_spec = optimizer
        self._scheduler_spec = scheduler
        self.optimizer: torch.optim.Optimizer | None = (
            optimizer if isinstance(optimizer, torch.optim.Optimizer) else None
        )
        self.scheduler: Any = None if _is_factory(scheduler) else scheduler
        self.callbacks = list(callbacks)
        self.on_batch: Callable[[DistributedTrainer, int, int, Any], None] | None = None
        self.config: DistributedTrainingConfig | None = None
        self.prepared: Prepared | None = None
        self.history = DistributedTrainingHistory()
        self.global_step = 0
        self.lr_scaled = False
        self.train_source: Any = None
        self.logger: Any = None
        self.device_choice = None if device is None else resolve_device(device)
        self.device = self.device_choice or rd.device()
        self._manager: ck.CheckpointManager | None = None
        self._pending: st.Position | None = None  # from load_checkpoint() before fit()
        self._epoch = 0
        self._saved_at: int | None = None
        self._step_save_due = False  # a step checkpoint on an epoch's last step, see below
        self.last_evaluation: dict[str, int] = {}  # samples and correct ones of evaluate()
        self.fits = 0  # names each fit's Progress (checks.begin_fit)
        self.progress = rd.Progress("trainer/unfitted")  # marks collectives: names who is behind

    # -- info --------------------------------------------------------------------------------

    # The guide's queries on the trainer are rankwise.distributed's own.
    is_master = staticmethod(rd.is_master)
    get_rank = staticmethod(rd.get_rank)
    get_world_size = staticmethod(rd.get_world_size)

    @property
    def precision(self) -> Any:
        return self._require_prepared().precision

    def to_device(self, batch: Any) -> Any:
        return to_device(batch, self.device)

    # -- fit ---------------------------------------------------------------------------------

    def fit(
        self, *args: Any, config: DistributedTrainingConfig | None = None, val: Any = None
    ) -> DistributedTrainingHistory:
        """Train; return the history. Forms (config positional or by keyword)::

        fit(X, y, config)                    # tensors or numpy arrays
        fit(X, y, X_val, y_val, config)
        fit(train, val=None, config=config)  # Datasets or DataLoaders
        """
        cfg, train, val_data = parse_fit_args(args, config, val)
        self.config = cfg.validate()
        train_set, val_set = self._datasets(train, val_data, cfg)
        checks.begin_fit(self, cfg, train_set, val_set)
        self._setup(cfg)
        self.train_source = self._source(train_set, cfg)
        position = self._start(cfg)
        self.global_step = position.step
        self.history = position.history or DistributedTrainingHistory()
        world = rd.get_world_size()
        self.history.effective_batch_size = cfg.effective_batch_size(world)
        self.history.world_size = world
        self._step_save_due = False
        self._call("on_fit_start", self)
        self.logger = TrainingLogger(
            cfg.log_dir, cfg.verbose, cfg.log_every_n_batches, rd.is_master(), epochs=cfg.epochs
        )
        started, samples, train_seconds = time.perf_counter(), 0, 0.0
        carried = position.carried
        try:
            for epoch in range(position.epoch, cfg.epochs):
                self._epoch = epoch
                t0 = time.perf_counter()
                sums = EpochSums(carried=carried or [0.0] * 4)
                carried = None
                loss, acc, _ = train_epoch(self, self.train_source, epoch, sums)
                samples += sum(sums.counts) * world
                train_seconds += time.perf_counter() - t0
                metrics = self._end_epoch(epoch, loss, acc, val_set, t0)
                self._call("on_epoch_end", self, epoch, metrics)
                every = cfg.checkpoint_every_n_epochs
                if (every and (epoch + 1) % every == 0) or self._step_save_due:
                    self._checkpoint(epoch + 1, None)
                self._step_save_due = False
            if self._saved_at != self.global_step:
                self._checkpoint(max(self._epoch + 1, position.epoch), None)
        except RuntimeError as exc:
            if (error := self.progress.explain(exc)) is None:  # a stall names the late rank
                raise
            raise error from exc
        finally:
            self.logger.close()
        self.history.total_time_seconds += time.perf_counter() - started
        if samples:  # a resume with nothing left to do keeps the recorded throughput
            self.history.samples_per_second = samples / train_seconds
        self._call("on_fit_end", self, self.history)
        return self.history

    def _datasets(self, train: Any, val: Any, cfg: DistributedTrainingConfig) -> tuple[Any, Any]:
        if not cfg.validation_split or val is not None:
            return train, val  # validation data given: it wins over validation_split
        if isinstance(train, DataLoader):
            raise ValueError(
                f"validation_split ({cfg.validation_split}) needs the data itself, not a "
                "DataLoader; pass the Dataset (the trainer builds the loaders) or your own "
                "validation loader: fit(train_loader, val_loader, config=cfg)."
            )
        return split_validation(train, cfg.validation_split, cfg.seed)

    def _source(self, train: Any, cfg: DistributedTrainingConfig) -> Any:
        if isinstance(train, DataLoader) or not hasattr(train, "__getitem__"):
            return UserBatches(train)
        return TrainBatches(
            train,
            cfg.batch_size,
            shuffle=cfg.shuffle,
            seed=cfg.seed,
            num_workers=cfg.num_workers,
            record_ids=bool(self.batch_hooks()),
        )

    def _setup(self, cfg: DistributedTrainingConfig) -> None:
        """Wrap the model and build optimizer, scheduler and precision (first fit only)."""
        if self.prepared is None:
            self.prepared = prepare(self, cfg)
            self.model = self.prepared.model
            self.optimizer = self.prepared.optimizer
            self.scheduler = self.prepared.scheduler
        elif self.prepared.strategy != cfg.strategy:
            raise ValueError(
                f"this trainer's model was wrapped for strategy {self.prepared.strategy!r} by "
                f"an earlier fit(); config.strategy is {cfg.strategy!r}. Keep the strategy or "
                "build a new DistributedTrainer."
            )
        if not self.lr_scaled:
            scale = cfg.lr_scale(rd.get_world_size())
            if scale != 1.0:
                scale_lr(self._require_optimizer(), self.scheduler, scale)
            self.lr_scaled = True  # once per trainer, and recorded in checkpoints

    def _start(self, cfg: DistributedTrainingConfig) -> st.Position:
        """Resume from a checkpoint or start fresh (seeded)."""
        self._manager = st.manager_for(cfg)
        with self.progress.operation(f"the resume from the checkpoints (resume={cfg.resume!r})"):
            loaded = st.load_resume(cfg.resume, self._manager, not cfg.save_on_master_only)
        if loaded is not None:
            position = st.apply_state(self, loaded[1], loaded[0])
        elif self._pending is not None:
            position = self._pending
            if position.precision is not None:
                self.precision.load_state_dict(position.precision)
        else:
            seed_everything(cfg.seed, rd.get_rank())
            return st.Position()
        self._pending = None
        st.continue_data(position, cfg, getattr(self.train_source, "sampler", None))
        self._saved_at = position.step
        return position

    def _end_epoch(
        self, epoch: int, loss: float, acc: float | None, val_set: Any, t0: float
    ) -> dict[str, float | None]:
        val_loss = val_acc = None
        if val_set is not None:
            self.progress.mark(f"the evaluation on the validation data after epoch {epoch}")
            val_loss, val_acc = self.evaluate(val_set)
        scheduler, cfg = self.scheduler, self.config
        if scheduler is not None and cfg is not None and cfg.scheduler_interval == "epoch":
            if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                scheduler.step(val_loss if val_loss is not None else loss)
            else:
                scheduler.step()
        seconds = time.perf_counter() - t0
        self.history.append_epoch(loss, acc, val_loss, val_acc, seconds)
        metrics = {
            "train_loss": loss,
            "train_accuracy": acc,
            "val_loss": val_loss,
            "val_accuracy": val_acc,
            "epoch_seconds": seconds,
        }
        self.logger.end_epoch(epoch, metrics)
        return metrics

    # -- the step (called by loop.train_epoch) -----------------------------------------------

    def optimizer_step(self) -> None:
        cfg, optimizer = self.config, self._require_optimizer()
        assert cfg is not None
        precision = self.precision
        if cfg.grad_clip_norm is not None:
            precision.clip_grad_norm_(self.model, cfg.grad_clip_norm, optimizer)
        precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        if self.scheduler is not None and cfg.scheduler_interval == "step":
            self.scheduler.step()

    def after_optimizer_step(self, epoch: int, sums: EpochSums, ends_epoch: bool = False) -> None:
        checks.check_sync(self)  # every check_sync_every_n_steps optimizer steps
        every = self.config.checkpoint_every_n_steps if self.config else 0
        if every and self.global_step % every == 0:
            if ends_epoch:
                # Saved once the epoch is closed (history, epoch scheduler, validation), as
                # the start of the next epoch: saved here, the sampler would have nothing left
                # and a resume would re-enter an epoch that is already over.
                self._step_save_due = True
            else:
                self._checkpoint(epoch, sums)

    def batch_hooks(self) -> list[Callable[..., None]]:
        hooks = [cb.on_batch for cb in self.callbacks if hasattr(cb, "on_batch")]
        return hooks if self.on_batch is None else [self.on_batch, *hooks]

    # -- evaluation --------------------------------------------------------------------------

    def evaluate(self, *data: Any, batch_size: int | None = None) -> tuple[float, float | None]:
        """``(loss, accuracy)`` over every real sample exactly once, on every rank; accuracy
        is None unless targets are class indices. ``evaluate(X, y)`` or
        ``evaluate(dataset_or_loader)``."""
        batches = eval_batches(eval_data(data), batch_size or self._eval_batch())
        loss, accuracy, count, correct = evaluate_exact(
            self.model, batches, self.loss_fn, self._precision_or_default(), self.device
        )
        self.last_evaluation = {"count": count, "correct": correct}
        return loss, accuracy

    def predict(self, data: Any, batch_size: int | None = None) -> Any:
        """The model's outputs for every sample of ``data`` (X, or a Dataset yielding inputs or
        (input, target)), in dataset order, on every rank."""
        dataset = (
            data
            if hasattr(data, "__getitem__") and not isinstance(data, torch.Tensor | np.ndarray)
            else as_dataset(data)
        )
        batches = EvalBatches(dataset, batch_size or self._eval_batch())
        return predict_all(
            self.model, batches, self._precision_or_default(), self.device, len(dataset)
        )

    def _eval_batch(self) -> int:
        return self.config.batch_size if self.config is not None else 64

    def _precision_or_default(self) -> Any:
        from rankwise.parallel import Precision

        return self.prepared.precision if self.prepared is not None else Precision("fp32")

    # -- checkpoints -------------------------------------------------------------------------

    def _checkpoint(self, epoch: int, sums: EpochSums | None) -> Path | None:
        cfg = self.config
        if cfg is None or self._manager is None:
            return None
        self.progress.mark(f"the checkpoint save at step {self.global_step} (broadcast, barrier)")
        state = st.build_state(self, epoch, sums)
        path = None
        if rd.is_master() or not cfg.save_on_master_only:
            path = self._manager.save(state, epoch=epoch, step=self.global_step)
        path = st.share_path(path) if cfg.save_on_master_only else path
        rd.barrier()  # no rank runs ahead of a checkpoint that may not exist yet
        self._saved_at = self.global_step
        self._call("on_checkpoint_saved", self, path)
        return path

    def save_checkpoint(self, path: str | Path) -> Path:
        """Write a full checkpoint to ``path`` (collective: call it on every rank; rank 0
        writes atomically)."""
        self._require_prepared()
        state = st.build_state(self, self._epoch + 1 if self.history.train_losses else 0, None)
        if rd.is_master():
            ck.save_file(state, path)
        rd.barrier()
        return Path(path)

    def load_checkpoint(self, path: str | Path) -> None:
        """Load model, optimizer, scheduler and precision state from ``path`` (collective);
        the next ``fit`` continues from the checkpoint's epoch, step and data position.

        Works before the first ``fit`` too (e.g. to evaluate a saved model); an optimizer or
        scheduler given as a factory is then built fresh by ``fit``.
        """
        self._pending = st.apply_state(self, ck.load_file(path), path)
        self.global_step = self._pending.step

    # -- helpers -----------------------------------------------------------------------------

    def _call(self, name: str, *args: Any) -> None:
        for cb in self.callbacks:
            method = getattr(cb, name, None)
            if method is not None:
                method(*args)

    def _require_prepared(self) -> Prepared:
        if self.prepared is None:
            raise ValueError("the trainer is not set up yet: call fit() first.")
        return self.prepared

    def _require_optimizer(self) -> torch.optim.Optimizer:
        assert self.optimizer is not None, "set up by fit()"
        return self.optimizer


def _is_factory(obj: Any) -> bool:
    return obj is not None and callable(obj) and not hasattr(obj, "step")
