"""docs/troubleshooting.md's rows for the training layer (rankwise.train: checkpoint files and
folders, the background writer, resume, the trainer's inputs and config files), each provoked
in this process. tests/troubleshooting/test_troubleshooting.py checks that these rows and triggers pair up."""

from __future__ import annotations

import contextlib
import functools
import json
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from helpers.training import make_trainer
from helpers.troubleshooting_table import check_row, raised, run_cases, warned
from rankwise.testing import run_distributed
from rankwise.train import (
    AuditLog,
    CheckpointManager,
    ConfigTree,
    DistributedTrainer,
    DistributedTrainingConfig,
    DistributedTrainingHistory,
    RayReport,
    TrainingLogger,
    load_file,
    load_optimizer_state_dict,
    optimizer_state_dict,
    rankwise_checkpoint,
    read_audit,
    save_file,
    set_rng_state,
)
from rankwise.train.checkpoint import RemoteCheckpointManager, Storage, set_fault_hook
from rankwise.train.checkpoint import writer as writer_module
from rankwise.train.checkpoint.writer import CheckpointWriter
from rankwise.train.tracking.ray_report import check_checkpoint_dir

_X, _Y = np.zeros((8, 2), np.float32), np.zeros((8, 2), np.float32)


def _config(**fields: object) -> DistributedTrainingConfig:
    return DistributedTrainingConfig(
        **{"epochs": 1, "batch_size": 4, "verbose": False, "checkpoint_dir": None, **fields}
    )


def _folder() -> Path:
    return Path(tempfile.mkdtemp())


# -- checkpoint files -------------------------------------------------------------------------


def _manifest(text: str) -> BaseException:
    path = save_file({"x": torch.ones(3)}, _folder() / "ckpt.pt")
    Path(f"{path}.sha256.json").write_text(text)
    return raised(load_file, path)


def _background_write_fails() -> BaseException:
    """A write in flight fails (its folder is a file) while the fit is failing already."""
    blocker = _folder() / "not-a-folder"
    blocker.write_text("")
    manager = CheckpointManager(blocker / "ckpts")
    writer = CheckpointWriter(
        manager, writes=True, background=True, shared=False, saved=lambda _path: None
    )
    manager.save_async({"x": torch.ones(3)}, epoch=0, step=1)
    return warned(writer.drain)


def _write_fails() -> BaseException:
    """A synchronous save whose disk is full (the fault hook raises ENOSPC mid-write)."""
    manager = CheckpointManager(_folder())
    writer = CheckpointWriter(
        manager, writes=True, background=False, shared=True, saved=lambda _path: None
    )

    def full(point: str) -> None:
        if point == "mid-write":
            raise OSError(28, "No space left on device")

    previous = set_fault_hook(full)
    try:
        return raised(writer.save, _Savable())
    finally:
        set_fault_hook(previous)


class _Savable:
    epoch, step = 0, 1

    def state_dict(self, *, sharded: bool = False) -> dict[str, object]:
        return {"x": torch.ones(3)}


@contextlib.contextmanager
def _silent_store() -> Iterator[RemoteCheckpointManager]:
    """A ``memory://`` store whose next write hangs before its pointer until the block ends."""
    release = threading.Event()

    def hang(point: str) -> None:
        if point == "before-pointer":
            release.wait(30)

    previous = set_fault_hook(hang)
    try:
        yield RemoteCheckpointManager(Storage.for_url(f"memory://rankwise-ts-{_folder().name}"))
    finally:
        release.set()
        set_fault_hook(previous)


def _silent_store_warns() -> BaseException:
    with _silent_store() as manager, _silent_after(0.0):
        writer = CheckpointWriter(
            manager, writes=True, background=True, shared=True, saved=lambda _path: None
        )
        writer.save(_Savable())
        saved = _Savable()
        saved.step = 2
        return warned(writer.save, saved)


@contextlib.contextmanager
def _silent_after(seconds: float) -> Iterator[None]:
    before, writer_module.SILENT_S = writer_module.SILENT_S, seconds
    try:
        yield
    finally:
        writer_module.SILENT_S = before


def _final_wait_ends() -> BaseException:
    with _silent_store() as manager:
        writer = CheckpointWriter(
            manager,
            writes=True,
            background=True,
            shared=True,
            saved=lambda _path: None,
            final_wait_s=0.2,
        )
        writer.save(_Savable())
        return raised(writer.finish)


def _moved_writer_gives_up() -> BaseException:
    # This rank started a write as rank 0; a regroup made another rank rank 0 before it ended.
    with _silent_store() as manager:
        role = [True]
        writer = CheckpointWriter(
            manager,
            writes=lambda: role[0],
            background=True,
            shared=True,
            saved=lambda _path: None,
            final_wait_s=0.2,
        )
        writer.save(_Savable())
        role[0] = False
        return raised(writer.save, _Savable())


def _wait_times_out() -> BaseException:
    with _silent_store() as manager:
        manager.save_async({"x": torch.ones(3)}, epoch=0, step=1)
        return raised(manager.wait, 0.1)


# -- checkpoint folders (resume='auto' and CheckpointManager) ----------------------------------


def _torn_newest() -> BaseException:
    folder = _folder()
    manager = CheckpointManager(folder)
    manager.save({"x": torch.ones(3)}, epoch=0, step=1)
    newest = manager.save({"x": torch.ones(3)}, epoch=0, step=2)
    newest.write_bytes(newest.read_bytes()[:-10])
    return warned(CheckpointManager(folder).latest)


def _pointer(text: str | None) -> BaseException:
    folder = _folder()
    manager = CheckpointManager(folder)
    manager.save({"x": torch.ones(3)}, epoch=0, step=1)
    if text is None:  # the pointer names a file someone deleted
        manager.save({"x": torch.ones(3)}, epoch=0, step=2).unlink()
    else:
        manager.pointer_path.write_text(text)
    return warned(CheckpointManager(folder).latest)


def _older_save_into_a_used_folder() -> BaseException:
    folder = _folder()
    CheckpointManager(folder).save({"x": torch.ones(3)}, epoch=1, step=20)
    return warned(CheckpointManager(folder).save, {"x": torch.ones(3)}, epoch=0, step=5)


# -- resume -----------------------------------------------------------------------------------


def _global_batch_changed_warns() -> BaseException:
    folder = str(_folder())
    make_trainer(loss=nn.MSELoss()).fit(_X, _Y, _config(checkpoint_dir=folder))  # 4 x 1 x 1
    again = _config(epochs=2, batch_size=2, checkpoint_dir=folder, resume="auto")
    return warned(make_trainer(loss=nn.MSELoss()).fit, _X, _Y, again)


# -- the trainer's inputs -----------------------------------------------------------------------


def _no_optimizer_yet() -> BaseException:
    model = nn.Linear(2, 2)
    trainer = DistributedTrainer(model, nn.MSELoss(), lambda p: torch.optim.SGD(p, lr=0.1))
    return raised(trainer.save_checkpoint, _folder() / "early.pt")


def _yaml(text: str) -> BaseException:
    path = _folder() / "train.yaml"
    path.write_text(text)
    return raised(DistributedTrainingConfig.from_yaml, path)


# -- config trees, history, loggers -----------------------------------------------------------


def _tree_file(text: str) -> BaseException:
    path = _folder() / "settings.yaml"
    path.write_text(text)
    return raised(ConfigTree.from_file, path)


def _history_file(text: str) -> BaseException:
    path = _folder() / "history.json"
    path.write_text(text)
    return raised(DistributedTrainingHistory.load, path)


def _plot_without_matplotlib() -> BaseException:
    import sys

    history = DistributedTrainingHistory()
    history.append_epoch(0.5, None, None, None, 1.0)
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] == "matplotlib"}
    # As if not installed: matplotlib and any submodule an earlier test imported.
    for name in {"matplotlib", *saved}:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        return raised(history.plot, _folder() / "history.png")
    finally:
        for name in {"matplotlib", *saved}:
            del sys.modules[name]
        sys.modules.update(saved)


def _ray_report_outside_ray() -> BaseException:
    trainer = DistributedTrainer(
        nn.Linear(2, 2), nn.MSELoss(), torch.optim.SGD, callbacks=[RayReport()]
    )
    return raised(trainer.fit, _X, _Y, _config())


def _ray_report_without_ray() -> BaseException:
    import sys

    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] == "ray"}
    for name in {"ray", "ray.train", *saved}:  # as if not installed
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        trainer = DistributedTrainer(
            nn.Linear(2, 2), nn.MSELoss(), torch.optim.SGD, callbacks=[RayReport()]
        )
        return raised(trainer.fit, _X, _Y, _config())
    finally:
        for name in {"ray", "ray.train", *saved}:
            del sys.modules[name]
        sys.modules.update(saved)


class _RayCheckpoint:
    """What rankwise_checkpoint reads of a ray.train.Checkpoint: its path, as a folder."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        yield self.path


def _epoch(**values: object) -> BaseException:
    fields = {"train_loss": 0.5, "train_acc": None, "val_loss": None, "val_acc": None, **values}
    return raised(DistributedTrainingHistory().append_epoch, **fields, seconds=1.0)


# -- the trainer's data and evaluation --------------------------------------------------------


class _Stream(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter([(torch.zeros(2), torch.zeros(2))] * 4)


def _loader(n: int = 8, batch: int = 4) -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(TensorDataset(torch.zeros(n, 2), torch.zeros(n, 2)), batch)


class _Triples(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        return torch.zeros(2), torch.zeros(2), torch.zeros(1)


class _TupleOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer(x), x


def _predict_tuple() -> BaseException:
    """A model returning (output, features), trained with a loss that takes the first."""
    model = _TupleOut()
    trainer = DistributedTrainer(
        model, lambda out, y: nn.functional.mse_loss(out[0], y), torch.optim.SGD(model.parameters())
    )
    trainer.fit(_X, _Y, _config())
    return raised(trainer.predict, _X)


def _cuda_device_without_cuda() -> BaseException:
    if torch.cuda.is_available():
        pytest.skip("device='cuda' is valid on a machine with CUDA")
    return raised(DistributedTrainer, nn.Linear(2, 2), nn.MSELoss(), torch.optim.SGD, device="cuda")


def _fitted(model: nn.Module | None = None) -> DistributedTrainer:
    trainer = make_trainer(model, loss=nn.MSELoss())
    trainer.fit(_X, _Y, _config())
    return trainer


def _strategy_changed() -> BaseException:
    trainer = make_trainer(loss=nn.MSELoss())
    trainer.fit(_X, _Y, _config(strategy="ddp"))
    return raised(trainer.fit, _X, _Y, _config(strategy="none"))


def _foreign_optimizer() -> BaseException:
    other = nn.Linear(2, 2)
    trainer = DistributedTrainer(nn.Linear(2, 2), nn.MSELoss(), torch.optim.SGD(other.parameters()))
    return raised(trainer.fit, _X, _Y, _config())


def _audit_with_loader() -> BaseException:
    model = nn.Linear(2, 2)
    trainer = DistributedTrainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters()), callbacks=[AuditLog(_folder())]
    )
    return raised(trainer.fit, _loader(), config=_config())


def _audit_without_size() -> BaseException:
    folder = _folder()
    head = {"start_step": 0, "rank": 0, "world_size": 1, "time": 0.0}  # an older header
    (folder / "audit-001-rank0.jsonl").write_text(json.dumps(head) + "\n")
    return raised(read_audit(folder).violations)


class _Stop(Exception):
    pass


def _stop_at_step_2(_trainer: object, _epoch: int, step: int, _ids: object) -> None:
    if step == 2:
        raise _Stop  # the job died in step 2, after the checkpoint of step 1


def _resume_mid_epoch_without_sampler() -> BaseException:
    folder = str(_folder())
    killed = make_trainer(loss=nn.MSELoss())
    killed.on_batch = _stop_at_step_2
    cfg = _config(batch_size=2, checkpoint_dir=folder, checkpoint_every_n_steps=1)
    raised(killed.fit, _loader(batch=2), config=cfg)
    again = _config(batch_size=2, checkpoint_dir=folder, resume="auto")
    return raised(make_trainer(loss=nn.MSELoss()).fit, _loader(batch=2), config=again)


# -- on real ranks: wrapped models, uneven loaders, per-rank checkpoints (one 2-rank run) -------


def _on_ranks(case: str) -> BaseException:
    """Errors and warnings that need a process group, from rank 1; one 2-rank run for all."""
    kind, message = _rank_errors()[case]
    return type(kind, (Exception,), {})(message)  # a stand-in with the same type name


@functools.cache
def _rank_errors() -> dict[str, tuple[str, str]]:
    return dict(run_distributed(_rank_cases, 2, args=(str(_folder()),), timeout=120)[1])


def _wrapped_fit(model: nn.Module, device: str | None = None, **fields: object) -> None:
    trainer = DistributedTrainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters()), device=device
    )
    trainer.fit(_X, _Y, _config(**fields))


def _counting_hook(state, bucket):  # type: ignore[no-untyped-def]  # torch reads the annotations
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    state["calls"] += 1
    return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]


def _hook_state_fit() -> None:
    model = nn.parallel.DistributedDataParallel(nn.Linear(2, 2))
    model.register_comm_hook({"calls": 0}, _counting_hook)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the warning as the case's error
        _wrapped_fit(model)


class _RankStream(IterableDataset):  # type: ignore[type-arg]
    """4 samples on rank 0, 2 on rank 1: a loader without len() that is uneven."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        count = 4 if torch.distributed.get_rank() == 0 else 2
        return iter([(torch.zeros(2), torch.zeros(2))] * count)


def _per_rank_checkpoints_differ(folder: str) -> None:
    """Each rank keeps its own checkpoints; rank 1 lost its newest one."""
    cfg = _config(
        batch_size=2, checkpoint_dir=folder, save_on_master_only=False, checkpoint_every_n_steps=1
    )
    make_trainer(loss=nn.MSELoss()).fit(_X, _Y, cfg)
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 1:
        manager = CheckpointManager(Path(folder) / "rank-1")
        newest = manager.checkpoints()[-1]
        newest.unlink()
        Path(f"{newest}.sha256.json").unlink()
    torch.distributed.barrier()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rank 1's pointer names the removed file
        again = _config(
            epochs=2, batch_size=2, checkpoint_dir=folder, save_on_master_only=False, resume="auto"
        )
        make_trainer(loss=nn.MSELoss()).fit(_X, _Y, again)


def _fsdp_with_scheduler_instance() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)
    trainer = DistributedTrainer(model, nn.MSELoss(), optimizer, scheduler)
    trainer.fit(_X, _Y, _config(strategy="fsdp"))


def _fsdp_with_stepped_optimizer() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.zeros(1, 2)).sum().backward()
    optimizer.step()  # e.g. a warm-up before handing it to the trainer
    DistributedTrainer(model, nn.MSELoss(), optimizer).fit(_X, _Y, _config(strategy="fsdp"))


def _rank_cases(folder: str) -> dict[str, tuple[str, str]]:
    ddp = nn.parallel.DistributedDataParallel
    cases: dict[str, Callable[[], object]] = {
        "compression": lambda: _wrapped_fit(ddp(nn.Linear(2, 2)), compression="fp16"),
        "strategy_none": lambda: _wrapped_fit(ddp(nn.Linear(2, 2)), strategy="none"),
        "strategy_fsdp": lambda: _wrapped_fit(ddp(nn.Linear(2, 2)), strategy="fsdp"),
        "data_parallel": lambda: _wrapped_fit(nn.DataParallel(nn.Linear(2, 2))),
        "device": lambda: _wrapped_fit(ddp(nn.Linear(2, 2)), device="meta"),
        "hook_state": _hook_state_fit,
        "uneven_stream": lambda: make_trainer(loss=nn.MSELoss()).fit(
            DataLoader(_RankStream(), batch_size=2), config=_config(batch_size=2)
        ),
        "checkpoints_differ": lambda: _per_rank_checkpoints_differ(folder),
        "fsdp_scheduler": _fsdp_with_scheduler_instance,
        "fsdp_stepped": _fsdp_with_stepped_optimizer,
    }
    return run_cases(cases)


def _tensor_subclass() -> BaseException:
    class Sharded(torch.Tensor):
        pass

    return raised(save_file, {"w": torch.ones(2).as_subclass(Sharded)}, _folder() / "x.pt")


def _optimizer_groups_differ() -> BaseException:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    saved = optimizer_state_dict(model, torch.optim.SGD(model.parameters(), lr=0.1))
    split = torch.optim.SGD(
        [{"params": model[0].parameters()}, {"params": model[1].parameters()}], lr=0.1
    )
    return raised(load_optimizer_state_dict, model, split, saved)


# -- experiment trackers ----------------------------------------------------------------------


def _tracker_package_missing() -> BaseException:
    """wandb made unimportable, as on a machine without it."""
    import sys

    saved = sys.modules.get("wandb")
    sys.modules["wandb"] = None  # type: ignore[assignment]
    try:
        return raised(make_trainer(loss=nn.MSELoss()).fit, _X, _Y, _config(loggers=["wandb"]))
    finally:
        if saved is None:
            del sys.modules["wandb"]
        else:
            sys.modules["wandb"] = saved


def _tracker_unreachable() -> BaseException:
    """MLflow at a port where nobody listens: the probe before the run says so at once."""
    import os

    from rankwise.testing import free_port

    saved = dict(os.environ)
    os.environ["MLFLOW_TRACKING_URI"] = f"http://127.0.0.1:{free_port()}"
    try:
        return warned(make_trainer(loss=nn.MSELoss()).fit, _X, _Y, _config(loggers=["mlflow"]))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _tracker_refuses() -> BaseException:
    """MLflow answering with an error: its file store (in a fresh folder) refuses new runs."""
    import os

    saved = dict(os.environ)
    os.environ["MLFLOW_TRACKING_URI"] = Path(tempfile.mkdtemp()).as_uri()
    try:
        return warned(make_trainer(loss=nn.MSELoss()).fit, _X, _Y, _config(loggers=["mlflow"]))
    finally:
        os.environ.clear()
        os.environ.update(saved)


TRIGGERS: dict[str, Callable[[], BaseException]] = {
    "config-loggers": lambda: raised(_config, loggers=["csv", "neptune"], log_dir="logs"),
    "tracker-package-missing": _tracker_package_missing,
    "tracker-failed": _tracker_refuses,
    "tracker-unreachable": _tracker_unreachable,
    "config-redacted-secret": lambda: raised(
        _config, checkpoint_storage_options={"key": "AKIA-EXAMPLE", "secret": "***"}
    ),
    "tracker-option": lambda: warned(
        make_trainer(loss=nn.MSELoss()).fit,
        _X,
        _Y,
        _config(loggers=["wandb"], logger_options={"wandb": {"projct": "mnist"}}),
    ),
    "checkpoint-manifest-unreadable": lambda: _manifest("{not json"),
    "checkpoint-manifest-newer": lambda: _manifest('{"size": 1, "blake9": "00"}'),
    "checkpoint-not-plain": lambda: raised(save_file, {"step": np.float64(1.0)}, "x.pt"),
    "checkpoint-background-write-failed": _background_write_fails,
    "checkpoint-write-failed": _write_fails,
    "checkpoint-store-silent": _silent_store_warns,
    "checkpoint-final-wait": _final_wait_ends,
    "checkpoint-moved-writer-wait": _moved_writer_gives_up,
    "checkpoint-wait-timeout": _wait_times_out,
    "config-final-wait": lambda: raised(DistributedTrainingConfig, checkpoint_final_wait_s=0),
    "checkpoint-auto-skips": _torn_newest,
    "checkpoint-pointer-unreadable": lambda: _pointer("{not json"),
    "checkpoint-pointer-dangling": lambda: _pointer(None),
    "checkpoint-folder-has-newer": _older_save_into_a_used_folder,
    "checkpoint-keep-last": lambda: raised(CheckpointManager, "ckpts", keep_last=0),
    "resume-global-batch-changed": _global_batch_changed_warns,
    "trainer-not-set-up": _no_optimizer_yet,
    "fit-lengths-differ": lambda: raised(
        make_trainer(loss=nn.MSELoss()).fit, _X, _Y[:7], _config()
    ),
    "fit-no-config": lambda: raised(make_trainer(loss=nn.MSELoss()).fit, _X, _Y),
    "fit-validation-split-empty": lambda: raised(
        make_trainer(loss=nn.MSELoss()).fit, _X[:2], _Y[:2], _config(validation_split=0.9)
    ),
    "fit-loss-fn-none": lambda: raised(make_trainer(loss=None).fit, _X, _Y, _config()),
    "trainer-model-type": lambda: raised(
        DistributedTrainer, "model.pt", nn.MSELoss(), lambda p: torch.optim.SGD(p, lr=0.1)
    ),
    "gradient-checkpointing-no-blocks": lambda: raised(
        make_trainer(loss=nn.MSELoss()).fit, _X, _Y, _config(gradient_checkpointing=True)
    ),
    "config-yaml-invalid": lambda: _yaml("epochs: [1\n"),
    "config-yaml-not-mapping": lambda: _yaml("- epochs\n- 5\n"),
    "config-from-dict-type": lambda: raised(DistributedTrainingConfig.from_dict, ["epochs", 5]),
    "config-storage-options-list": lambda: raised(
        DistributedTrainingConfig,
        checkpoint_storage_options={"client_kwargs": {"region_name": ["eu-west-1"]}},
    ),
    "config-override-yaml": lambda: raised(
        DistributedTrainingConfig().with_overrides, ["epochs=[1"]
    ),
    "config-override-not-scalar": lambda: raised(
        DistributedTrainingConfig().with_overrides, ["epochs=[1, 2]"]
    ),
    "config-tree-type": lambda: raised(ConfigTree, ["lr", 0.1]),
    "config-tree-file-missing": lambda: raised(ConfigTree.from_file, "no_such_settings.yaml"),
    "config-tree-yaml-invalid": lambda: _tree_file("model: [1\n"),
    "config-tree-not-mapping": lambda: _tree_file("- lr\n- 0.1\n"),
    "config-tree-reserved-key": lambda: raised(ConfigTree, {"model": {"keys": 3}}),
    "checkpoint-prefix": lambda: raised(CheckpointManager, "ckpts", prefix="../ckpt"),
    "checkpoint-save-step": lambda: raised(
        CheckpointManager(_folder()).save, {"x": torch.ones(1)}, epoch=0, step=-1
    ),
    "checkpoint-save-not-dict": lambda: raised(save_file, [torch.ones(1)], _folder() / "x.pt"),
    "checkpoint-save-manifest-name": lambda: raised(
        save_file, {"x": torch.ones(1)}, _folder() / "x.pt.sha256.json"
    ),
    "checkpoint-tensor-subclass": _tensor_subclass,
    "sync-check-fsdp": lambda: raised(_config, strategy="fsdp", check_sync_every_n_steps=2),
    "fit-array-type": lambda: raised(
        make_trainer(loss=nn.MSELoss()).fit, _X, _Y.tolist(), _config()
    ),
    "fit-arrays-count": lambda: raised(make_trainer(loss=nn.MSELoss()).fit, _X, _Y, _X, _config()),
    "fit-data-arguments": lambda: raised(
        make_trainer(loss=nn.MSELoss()).fit, _loader(), _loader(), _loader(), config=_config()
    ),
    "fit-validation-split-iterable": lambda: raised(
        make_trainer(loss=nn.MSELoss()).fit, _Stream(), config=_config(validation_split=0.25)
    ),
    "fit-validation-split-loader": lambda: raised(
        make_trainer(loss=nn.MSELoss()).fit, _loader(), config=_config(validation_split=0.25)
    ),
    "fit-batch-not-pair": lambda: raised(
        make_trainer(loss=nn.MSELoss()).fit, _Triples(), config=_config()
    ),
    "evaluate-arguments": lambda: raised(_fitted().evaluate, _X, _Y, _X),
    "evaluate-type": lambda: raised(_fitted().evaluate, "val.npy"),
    "evaluate-empty": lambda: raised(_fitted().evaluate, _X[:0], _Y[:0]),
    "predict-empty": lambda: raised(_fitted().predict, _X[:0]),
    "predict-not-tensor": _predict_tuple,
    "history-from-dict-type": lambda: raised(DistributedTrainingHistory.from_dict, [0.5]),
    "history-unknown-field": lambda: raised(
        DistributedTrainingHistory.from_dict, {"train_loss_": [0.5]}
    ),
    "history-lengths": lambda: raised(
        DistributedTrainingHistory.from_dict, {"train_losses": [0.5, 0.4], "epoch_times": [1.0]}
    ),
    "history-not-json": lambda: _history_file("{not json"),
    "history-not-history": lambda: _history_file('{"losses": [0.5]}'),
    "history-plot-matplotlib": _plot_without_matplotlib,
    "ray-report-outside-ray": _ray_report_outside_ray,
    "ray-report-without-ray": _ray_report_without_ray,
    "ray-checkpoint-dir-relative": lambda: warned(check_checkpoint_dir, "checkpoints"),
    "ray-checkpoint-not-rankwise": lambda: raised(rankwise_checkpoint, _RayCheckpoint(_folder())),
    "history-number": lambda: _epoch(val_loss=torch.tensor(0.5)),
    "history-fraction": lambda: _epoch(train_acc=95.0),
    "logger-every-type": lambda: raised(TrainingLogger, None, False, 2.5, True),
    "logger-every-negative": lambda: raised(TrainingLogger, None, False, -1, True),
    "optimizer-foreign-parameters": lambda: raised(
        optimizer_state_dict, nn.Linear(2, 2), torch.optim.SGD(nn.Linear(2, 2).parameters())
    ),
    "optimizer-groups-differ": _optimizer_groups_differ,
    "rng-state-missing": lambda: raised(set_rng_state, {"torch": torch.get_rng_state()}),
    "resume-mid-epoch-no-sampler": _resume_mid_epoch_without_sampler,
    "optimizer-factory-result": lambda: raised(
        DistributedTrainer(nn.Linear(2, 2), nn.MSELoss(), lambda p: None).fit, _X, _Y, _config()
    ),
    "trainer-optimizer-type": lambda: raised(
        DistributedTrainer, nn.Linear(2, 2), nn.MSELoss(), "adam"
    ),
    "trainer-device": lambda: raised(
        DistributedTrainer, nn.Linear(2, 2), nn.MSELoss(), torch.optim.SGD, device="gpu0"
    ),
    "trainer-device-no-cuda": _cuda_device_without_cuda,
    "trainer-strategy-changed": _strategy_changed,
    "optimizer-not-model-parameters": _foreign_optimizer,
    "audit-needs-sampler": _audit_with_loader,
    "audit-needs-size": _audit_without_size,
    "wrapped-compression": lambda: _on_ranks("compression"),
    "wrapped-strategy-none": lambda: _on_ranks("strategy_none"),
    "wrapped-strategy-differs": lambda: _on_ranks("strategy_fsdp"),
    "wrapped-data-parallel": lambda: _on_ranks("data_parallel"),
    "wrapped-device": lambda: _on_ranks("device"),
    "wrapped-hook-state": lambda: _on_ranks("hook_state"),
    "fit-stream-uneven": lambda: _on_ranks("uneven_stream"),
    "resume-ranks-differ": lambda: _on_ranks("checkpoints_differ"),
    "fsdp-scheduler-instance": lambda: _on_ranks("fsdp_scheduler"),
    "fsdp-optimizer-stepped": lambda: _on_ranks("fsdp_stepped"),
    "evaluate-batch-size-unknown": lambda: raised(
        _fitted().evaluate, DataLoader([1.0, 2.0], batch_size=None)
    ),
}


@pytest.mark.parametrize("row_id", sorted(TRIGGERS))
def test_documented_message_is_the_one_raised(row_id: str) -> None:
    check_row(row_id, TRIGGERS[row_id])
