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

import contextlib
import functools
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import rankwise.distributed as rd
from rankwise.distributed.interrupt import owned_by
from rankwise.parallel import Precision, unwrap_model
from rankwise.train import checks, sigterm
from rankwise.train.checkpoint import (
    Checkpointer,
    CheckpointManager,
    RemoteCheckpointManager,
    SaveStats,
    StorageError,
    load_resume,
    manager_for,
    read_checkpoint,
    save_file,
)
from rankwise.train.closings import END, SAVE
from rankwise.train.config import DistributedTrainingConfig
from rankwise.train.continuing import Continuing
from rankwise.train.data import (
    as_dataset,
    eval_data,
    fit_datasets,
    parse_fit_args,
    to_device,
    train_source,
)
from rankwise.train.evaluation import EvalBatches, eval_batches, evaluate_exact, predict_all
from rankwise.train.loop import FitRun, between_epochs, run_epoch
from rankwise.train.setup import (
    Prepared,
    is_factory,
    prepare,
    resolve_device,
    scale_lr,
    seed_everything,
)
from rankwise.train.state import TrainState
from rankwise.train.step import StepEnv, epoch_scheduler_step, micro_batch_count
from rankwise.train.sums import EpochResult, EpochSums
from rankwise.train.tracking import (
    DistributedTrainingHistory,
    TrainingLogger,
    require,
    run_artifacts,
    share_run_ids,
)

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
      epoch, metrics)``, ``on_epoch_saved(trainer, epoch, metrics, path)`` (after the
      epoch's checkpoint, if it has one, is durable: ``path`` is None when it has none),
      ``on_checkpoint_saved(trainer, path)`` (every rank, once the checkpoint is durable),
      ``on_checkpoint_written(trainer, path)`` (only a rank that wrote it, once its write
      landed: also the write a drain on an exception or SIGTERM waited for, then maybe on
      the SIGTERM guard's helper thread), ``on_fit_end(trainer, history)``,
      ``on_batch(trainer, epoch, step, sample_ids)``, ``before_backward`` (the same, after
      the forward: before this micro-batch's gradient reaches the other ranks).

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
        self.loss_fn = loss_fn
        self._optimizer_spec = optimizer
        self._scheduler_spec = scheduler
        # Where training is: the objects a step changes and the counters around them.
        self.state = TrainState(
            model,
            optimizer if isinstance(optimizer, torch.optim.Optimizer) else None,
            None if is_factory(scheduler) else scheduler,
        )
        self.callbacks = list(callbacks)
        self.on_batch: Callable[[DistributedTrainer, int, int, Any], None] | None = None
        self.config: DistributedTrainingConfig | None = None
        self.prepared: Prepared | None = None
        self.train_source: Any = None
        self.logger: Any = None
        self.device_choice = None if device is None else resolve_device(device)
        self.device = self.device_choice or rd.device()
        self._checkpointer: Checkpointer | None = None  # the last fit's: when it saves
        self.roles = rd.Roles.for_this_process()  # this process's in the job (each fit's anew)
        self.last_evaluation: dict[str, int] = {}  # samples and correct ones of evaluate()
        self.fit_count = 0  # names each fit's Progress (checks.begin_fit)
        self._loaded_from: Any = None  # the checkpoint load_checkpoint() read, until a fit
        self.progress = rd.Progress("trainer/unfitted")  # marks collectives: names who is behind

    # -- info --------------------------------------------------------------------------------

    # The guide's queries on the trainer are rankwise.distributed's own.
    is_master = staticmethod(rd.is_master)
    get_rank = staticmethod(rd.get_rank)
    get_world_size = staticmethod(rd.get_world_size)

    @property
    def precision(self) -> Any:
        return self._require_prepared().precision

    # The training state's objects and counters, under the names the guide uses.
    @property
    def model(self) -> nn.Module:
        """The model as trained: wrapped (DDP, FSDP2) by the first ``fit``."""
        return self.state.model

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer (None until ``fit`` builds one given as a factory)."""
        return self.state.optimizer

    @property
    def scheduler(self) -> Any:
        return self.state.scheduler

    @property
    def history(self) -> DistributedTrainingHistory:
        return self.state.history

    @property
    def global_step(self) -> int:
        """Optimizer steps taken (restored by a resume)."""
        return self.state.step

    @property
    def checkpoint_stats(self) -> SaveStats | None:
        """What checkpoint saves cost the loop in the last ``fit`` (None without a folder)."""
        return None if self._checkpointer is None else self._checkpointer.stats

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
        # Who this process is in the job, built once and handed to the code that acts by role
        # (the checkpoint folder, resume, the writer, continue mode's recovery, the audit log)
        self.roles = rd.Roles.for_this_process()
        # A listed logger's package missing: fail before anything runs. Only what the user
        # listed: the default (loggers=None) writes TensorBoard files only where it is installed.
        require(cfg.loggers or ())
        train_set, val_set = fit_datasets(train, val_data, cfg)
        self.fit_count += 1
        self.progress = checks.begin_fit(
            cfg, self.model, self.optimizer, (train_set, val_set), self.fit_count
        )
        self._setup(cfg)
        hooked = bool(self.batch_hooks(early=True) or self.batch_hooks())
        self.train_source = train_source(train_set, cfg, hooked, self.device)
        state = self.state
        state.sampler = getattr(self.train_source, "sampler", None)
        manager = _checked_manager(cfg, self.roles)
        resumed = self._start(cfg, manager)
        world = rd.get_world_size()
        state.history.effective_batch_size = cfg.effective_batch_size(world)
        state.history.world_size = world
        joining = self.roles.joining  # a restarted process waiting to rejoin logs nothing yet
        if not joining:  # a joiner's callbacks start once it is in (_regrouped)
            self._call("on_fit_start", self)
        logs = rd.is_master() and not joining
        saved: list[Any] = [None]  # the last checkpoint: its manifest is a tracker artifact

        def on_saved(path: Any) -> None:
            saved[0] = path
            self._call("on_checkpoint_saved", self, path)

        # SIGTERM (a launcher's stop, a preemption) lets the write in flight land, then closes
        # the trackers' runs as failed, before the process ends (sigterm.py): the checkpointer
        # and the logger each take the guard and add their duty, in that order.
        with sigterm.guarded() as guard:
            checkpointer = self._checkpointer = Checkpointer(
                manager,
                cfg,
                on_saved=on_saved,
                on_written=functools.partial(self._call, "on_checkpoint_written", self),
                progress=self.progress,
                saved_at=state.step if resumed is not None else None,  # the end: not again
                sigterm=guard,  # a save or a regroup re-decides what the guard holds
                roles=self.roles,
            )
            self.logger = TrainingLogger(
                cfg.log_dir,
                cfg.verbose,
                cfg.log_every_n_batches,
                logs,
                epochs=cfg.epochs,
                loggers=cfg.loggers,
                logger_options=cfg.logger_options,
                sigterm=guard,  # deferred around every call into a tracker's library
            )
            if resumed is not None and self.logger.enabled:  # once, on rank 0: from where
                self.logger.info(self._resume_note(cfg, resumed))
            if self.logger.trackers:  # the same on every rank: loggers is compared (checks.py)
                run_ids = self.logger.start_run(self._run_config(cfg), state.trackers)
                guard.update()  # runs to close now
                # every rank holds the ids (a new rank 0 goes on with them); a process
                # waiting to rejoin gets them with the state it is sent
                state.trackers = {} if joining else share_run_ids(run_ids)
            started = time.perf_counter()
            finished = False
            try:
                checkpointer.check_folder()  # writable, before the first step
                with checkpointer.draining():  # an exception: the write in flight still lands
                    samples, train_seconds = self._epochs(cfg, val_set, checkpointer)
                finished = True
            except RuntimeError as exc:
                if (error := self.progress.explain(exc)) is None:  # a stall names the late rank
                    raise
                raise error from exc
            finally:
                if not finished:
                    self.logger.close(failed=True)  # the trackers' runs end as failed
            self.history.total_time_seconds += time.perf_counter() - started
            if samples:  # a resume with nothing left to do keeps the recorded throughput
                self.history.samples_per_second = samples / train_seconds
            self._log_artifacts(cfg, saved[0])
            self.logger.close()
        self._call("on_fit_end", self, self.history)
        return self.history

    def _run_config(self, cfg: DistributedTrainingConfig) -> dict[str, Any]:
        """What the trackers record as the run's hyper-parameters: the config (credentials
        redacted), the world and what was trained."""
        world = rd.get_world_size()
        values = cfg.to_dict()
        values.update(world_size=world, global_batch_size=cfg.effective_batch_size(world))
        values["model"] = type(self.module).__name__
        if self.optimizer is not None:
            values["optimizer"] = type(self.optimizer).__name__
            values["lr"] = self.optimizer.param_groups[0].get("lr")
        return values

    def _log_artifacts(self, cfg: DistributedTrainingConfig, checkpoint: Any) -> None:
        """The history and the final checkpoint's manifest to the trackers (rank 0)."""
        if not (self.logger.enabled and self.logger.trackers.running):
            return
        with tempfile.TemporaryDirectory(prefix="rankwise-artifacts-") as folder:
            try:
                files = run_artifacts(
                    self.history, checkpoint, cfg.checkpoint_storage_options, Path(folder)
                )
            except Exception as exc:  # never fails the fit: the trackers are extras
                self.logger.info(f"rankwise: no tracker artifacts ({exc})")
                return
            self.logger.log_artifacts(files)

    def _epochs(
        self, cfg: DistributedTrainingConfig, val_set: Any, checkpointer: Checkpointer
    ) -> tuple[int, float]:
        """The epochs left, each closed (validation, scheduler, history, checkpoints); returns
        the samples trained (all ranks) and the seconds spent training them."""
        state = self.state
        hooks, early = ([functools.partial(h, self) for h in self.batch_hooks(e)] for e in (0, 1))
        step = StepEnv(cfg, self.loss_fn, self.device, self.progress, hooks, early)
        continuing = Continuing.for_this_job(self.roles, state, cfg, self.device_choice)
        run = FitRun(step, self.logger, checkpointer, continuing, self._regrouped)
        if continuing is not None and continuing.join_if_waiting():  # a restarted process
            self._regrouped(joined=True)
        samples, train_seconds = 0, 0.0
        reports = any(hasattr(cb, "on_epoch_saved") for cb in self.callbacks)
        for epoch in range(state.epoch, cfg.epochs):
            t0 = time.perf_counter()
            state.epoch = epoch
            state.sums = state.sums if state.sums is not None else EpochSums()  # or resumed
            result = run_epoch(state, run, self.train_source)
            samples += result.samples  # every rank's, reduced (lost ranks, uneven shares too)
            state.epoch, state.sums = epoch + 1, None  # closed: a save now starts the next
            train_seconds += time.perf_counter() - t0
            metrics = self._end_epoch(epoch, result, val_set, t0)
            self._call("on_epoch_end", self, epoch, metrics)
            # every N epochs, or a step save deferred to the epoch's end; durable before
            # on_epoch_saved hands it on (Ray's report), which then costs the write's wait.
            # The last epoch's is the end of fit's (always, and durable): its report names
            # the final checkpoint.
            if epoch == cfg.epochs - 1:
                save = functools.partial(checkpointer.at_end, state)
            else:
                save = functools.partial(checkpointer.after_epoch, state, epoch, durable=reports)
            saved = between_epochs(run, save, epoch, SAVE)
            if reports:
                self._call("on_epoch_saved", self, epoch, metrics, saved)
        # a last save unless the last step is saved; fit returns once it is durable
        between_epochs(run, functools.partial(checkpointer.at_end, state), state.epoch - 1, END)
        if continuing is not None:
            continuing.finished()  # the launcher counts this process's exit 0 as the job's end
        return samples, train_seconds

    def _setup(self, cfg: DistributedTrainingConfig) -> None:
        """Wrap the model and build optimizer, scheduler and precision (first fit only)."""
        state = self.state
        state.config = cfg
        if self.prepared is None:
            self.prepared = prepared = prepare(
                state.model,  # as the user passed it: prepare wraps it
                self._optimizer_spec,
                self._scheduler_spec,
                cfg,
                self.device,
                self.device_choice,
            )
            prepared.hand_over(state)
        else:
            cfg.check_refit(self.prepared.config)
        if not state.lr_scaled:
            scale = cfg.lr_scale(rd.get_world_size())
            if scale != 1.0:
                scale_lr(state.optimizer, state.scheduler, scale)  # type: ignore[arg-type]
            state.lr_scaled = True  # once per trainer, and recorded in checkpoints

    def _start(
        self,
        cfg: DistributedTrainingConfig,
        manager: CheckpointManager | RemoteCheckpointManager | None,
    ) -> Any:
        """Resume from a checkpoint in ``manager``'s folder (or what load_checkpoint()
        loaded), or start fresh; return the checkpoint the fit goes on from (its path or URL;
        None: a fresh start)."""
        state = self.state
        with self.progress.operation(f"the resume from the checkpoints (resume={cfg.resume!r})"):
            loaded = load_resume(
                cfg.resume,
                manager,
                not cfg.save_on_master_only,
                cfg.checkpoint_storage_options,
                cfg.checkpoint_key,
                roles=self.roles,
            )
        source, self._loaded_from = self._loaded_from, None
        if loaded is not None:
            state.load_state_dict(loaded[1], loaded[0])
            source = loaded[0]
        elif state.restored is None:  # nothing loaded: a fresh, seeded start
            seed_everything(cfg.seed, rd.get_rank())
            state.start_over()
            return None
        state.resume_data(cfg)
        state.restored = None  # used: a later fit without a resume starts fresh
        return source if source is not None else "the checkpoint load_checkpoint() read"

    def _resume_note(self, cfg: DistributedTrainingConfig, source: Any) -> str:
        """``rankwise: resumed from .../ckpt-e000001-s000000008.pt: epoch 2/3, optimizer step
        8; 4 batches of epoch 2 left (64 of its 192 samples done)`` (epochs counted from 1,
        as the progress lines; the file name counts them from 0; batches: this rank's)."""
        state = self.state
        where = f"rankwise: resumed from {source}: "
        if state.epoch >= cfg.epochs:
            return (
                f"{where}optimizer step {state.step}, all {cfg.epochs} epochs trained: "
                "nothing left to train (raise epochs to train more)"
            )
        epoch = state.epoch + 1
        note = f"{where}epoch {epoch}/{cfg.epochs}, optimizer step {state.step}"
        self.train_source.set_epoch(state.epoch)  # as the epoch's loop will: keeps the cursor
        left = micro_batch_count(self.train_source)
        if left is None:  # a loader without len
            return f"{note}; the rest of epoch {epoch} left"
        note = f"{note}; {left} batches of epoch {epoch} left"
        consumed = getattr(state.sampler, "consumed", None)  # rankwise's sampler: positions
        size: int | None = None
        with contextlib.suppress(AttributeError, TypeError):  # no dataset, or no len
            size = len(self.train_source.dataset)
        if isinstance(consumed, int) and isinstance(size, int):
            note = f"{note} ({min(consumed, size)} of its {size} samples done)"
        return note

    def _end_epoch(
        self, epoch: int, result: EpochResult, val_set: Any, t0: float
    ) -> dict[str, float | None]:
        loss, acc = result.loss, result.accuracy
        val_loss = val_acc = None
        if val_set is not None:
            self.progress.mark(f"the evaluation on the validation data after epoch {epoch}")
            val_loss, val_acc = self.evaluate(val_set)
        if self.config is not None and self.config.scheduler_interval == "epoch":
            epoch_scheduler_step(self.state.scheduler, val_loss if val_loss is not None else loss)
        seconds = time.perf_counter() - t0
        self.history.append_epoch(loss, acc, val_loss, val_acc, seconds)
        metrics = {
            "train_loss": loss,
            "train_accuracy": acc,
            "val_loss": val_loss,
            "val_accuracy": val_acc,
            "epoch_seconds": seconds,
        }
        self.logger.end_epoch(epoch, metrics, self.state.step)
        return metrics

    def _regrouped(self, joined: bool = False) -> None:
        """The world changed under ``--on-failure continue`` (continuing.py): rank 0 logs, and
        the callbacks hear of it (``on_regroup``). ``joined``: this restarted process was just
        let in, and its callbacks, which heard nothing while it waited, hear ``on_fit_start``
        now (its real rank and world) where the members hear ``on_regroup``."""
        self.logger.follow(rd.is_master(), self.state.step, self.state.trackers)
        if self._checkpointer is not None:
            self._checkpointer.regrouped()  # SIGTERM is caught where a write can be in flight
        self._call("on_fit_start" if joined else "on_regroup", self)

    def batch_hooks(self, early: bool | int = False) -> list[Callable[..., None]]:
        """``on_batch`` hooks; ``early``: the callbacks' ``before_backward`` (same arguments)."""
        if early:
            return [cb.before_backward for cb in self.callbacks if hasattr(cb, "before_backward")]
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
        return self.prepared.precision if self.prepared is not None else Precision("fp32")

    # -- checkpoints -------------------------------------------------------------------------

    def save_checkpoint(self, path: str | Path) -> Path:
        """Write a full checkpoint to ``path`` (collective: call it on every rank; rank 0
        writes atomically; its manifest signed with the last ``fit``'s ``checkpoint_key``,
        else ``RANKWISE_CHECKPOINT_KEY``, when one is set)."""
        self._require_prepared()
        saved = self.state.state_dict()
        key = None if self.config is None else self.config.checkpoint_key
        if rd.is_master():
            save_file(saved, path, key=key)
        rd.barrier()
        return Path(path)

    def load_checkpoint(
        self, path: str | Path, *, storage_options: dict[str, Any] | None = None
    ) -> None:
        """Load model, optimizer, scheduler and precision state from ``path`` (collective);
        the next ``fit`` continues from the checkpoint's epoch, step and data position.

        Works before the first ``fit`` too (e.g. to evaluate a saved model); an optimizer or
        scheduler given as a factory is then built fresh by ``fit``. ``path`` may be an
        object's URL (``s3://...``), reached with ``storage_options`` (the fsspec options, as
        ``checkpoint_storage_options``; default: the last ``fit``'s config's). It is checked
        with the last ``fit``'s ``checkpoint_key`` (else ``RANKWISE_CHECKPOINT_KEY``).
        """
        if storage_options is None and self.config is not None:
            storage_options = self.config.checkpoint_storage_options
        key = None if self.config is None else self.config.checkpoint_key
        state = read_checkpoint(path, storage_options=storage_options, key=key)
        self.state.load_state_dict(state, path)
        self._loaded_from = path

    def _call(self, name: str, *args: Any) -> None:
        for cb in self.callbacks:
            method = getattr(cb, name, None)
            if method is not None:
                method(*args)

    def _require_prepared(self) -> Prepared:
        if self.prepared is None:
            raise ValueError("the trainer is not set up yet: call fit() first.")
        return self.prepared


def _checked_manager(cfg: DistributedTrainingConfig, roles: rd.Roles) -> Any:
    """``manager_for(cfg, roles)``, with the ranks agreeing on whose check of a shared
    checkpoint URL failed (issue 33): the first rank whose check failed prints its error in
    full; every other rank ends with one line naming that rank under ``rankwise launch``, not
    the same traceback again, and never a claim that another rank failed where it did not."""
    manager, error = None, None
    try:
        manager = manager_for(cfg, roles)
    except Exception as exc:  # every rank reaches the agreement below, whatever it raised
        error = exc
    if not cfg.save_on_master_only or cfg.checkpoint_dir is None or rd.get_world_size() == 1:
        if error is not None:  # no shared store (or one rank): each rank's error is its own
            raise error
        return manager
    kinds = rd.all_gather_plain(None if error is None else type(error).__name__)
    owner = next((rank for rank, kind in enumerate(kinds) if kind is not None), None)
    if owner is None:
        return manager
    me, kind = rd.get_rank(), kinds[owner]
    if error is None:  # this rank's check passed: it stops for the owner's failure
        url = str(cfg.checkpoint_dir)
        if kind == StorageError.__name__:
            what = f"rank {owner}'s check of the checkpoint store failed"
            lost = StorageError(f"the checkpoint store {url} failed its check on rank {owner}",
                                url=url, reason="failed-on-another-rank")  # fmt: skip
            raise owned_by(lost, owner, me, what)
        what = f"rank {owner}'s set-up of the checkpoints failed ({kind})"
        follows = RuntimeError(f"rank {owner}'s set-up of the checkpoints in {url} failed")
        raise owned_by(follows, owner, me, what)
    if isinstance(error, StorageError):
        owned_by(
            error, owner, me, f"the checkpoint store failed its check here, as on rank {owner}"
        )
    raise error
