"""docs/troubleshooting.md's rows for the training layer (rankwise.train: checkpoint files and
folders, the background writer, resume, the trainer's inputs and config files), each provoked
in this process. tests/test_troubleshooting.py checks that these rows and triggers pair up."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from rankwise.train import (
    CheckpointManager,
    DistributedTrainer,
    DistributedTrainingConfig,
    load_file,
    save_file,
)
from rankwise.train.writer import CheckpointWriter
from troubleshooting_table import check_row, raised, warned

_X, _Y = np.zeros((8, 2), np.float32), np.zeros((8, 2), np.float32)


def _trainer(model: nn.Module | None = None, loss: nn.Module | None = None) -> DistributedTrainer:
    model = model or nn.Linear(2, 2)
    return DistributedTrainer(model, loss, torch.optim.SGD(model.parameters(), lr=0.1))


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
    _trainer(loss=nn.MSELoss()).fit(_X, _Y, _config(checkpoint_dir=folder))  # 4 x 1 x 1
    again = _config(epochs=2, batch_size=2, checkpoint_dir=folder, resume="auto")
    return warned(_trainer(loss=nn.MSELoss()).fit, _X, _Y, again)


# -- the trainer's inputs -----------------------------------------------------------------------


def _no_optimizer_yet() -> BaseException:
    model = nn.Linear(2, 2)
    trainer = DistributedTrainer(model, nn.MSELoss(), lambda p: torch.optim.SGD(p, lr=0.1))
    return raised(trainer.save_checkpoint, _folder() / "early.pt")


def _yaml(text: str) -> BaseException:
    path = _folder() / "train.yaml"
    path.write_text(text)
    return raised(DistributedTrainingConfig.from_yaml, path)


TRIGGERS: dict[str, Callable[[], BaseException]] = {
    "checkpoint-manifest-unreadable": lambda: _manifest("{not json"),
    "checkpoint-manifest-newer": lambda: _manifest('{"size": 1, "blake9": "00"}'),
    "checkpoint-not-plain": lambda: raised(save_file, {"step": np.float64(1.0)}, "x.pt"),
    "checkpoint-background-write-failed": _background_write_fails,
    "checkpoint-auto-skips": _torn_newest,
    "checkpoint-pointer-unreadable": lambda: _pointer("{not json"),
    "checkpoint-pointer-dangling": lambda: _pointer(None),
    "checkpoint-folder-has-newer": _older_save_into_a_used_folder,
    "checkpoint-keep-last": lambda: raised(CheckpointManager, "ckpts", keep_last=0),
    "resume-global-batch-changed": _global_batch_changed_warns,
    "trainer-not-set-up": _no_optimizer_yet,
    "fit-lengths-differ": lambda: raised(_trainer(loss=nn.MSELoss()).fit, _X, _Y[:7], _config()),
    "fit-no-config": lambda: raised(_trainer(loss=nn.MSELoss()).fit, _X, _Y),
    "fit-validation-split-empty": lambda: raised(
        _trainer(loss=nn.MSELoss()).fit, _X[:2], _Y[:2], _config(validation_split=0.9)
    ),
    "fit-loss-fn-none": lambda: raised(_trainer().fit, _X, _Y, _config()),
    "trainer-model-type": lambda: raised(
        DistributedTrainer, "model.pt", nn.MSELoss(), lambda p: torch.optim.SGD(p, lr=0.1)
    ),
    "gradient-checkpointing-no-blocks": lambda: raised(
        _trainer(loss=nn.MSELoss()).fit, _X, _Y, _config(gradient_checkpointing=True)
    ),
    "config-yaml-invalid": lambda: _yaml("epochs: [1\n"),
    "config-yaml-not-mapping": lambda: _yaml("- epochs\n- 5\n"),
}


@pytest.mark.parametrize("row_id", sorted(TRIGGERS))
def test_documented_message_is_the_one_raised(row_id: str) -> None:
    check_row(row_id, TRIGGERS[row_id])
