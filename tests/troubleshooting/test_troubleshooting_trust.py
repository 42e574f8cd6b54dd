"""docs/troubleshooting.md's rows for checkpoint trust (a manifest that does not vouch for the
checkpoint, a key set wrongly), each provoked in this process on real files. The pairing of
rows and triggers is checked by tests/troubleshooting/test_troubleshooting.py."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers.troubleshooting_table import check_row, raised
from rankwise.testing.tamper import tamper_checkpoint
from rankwise.train import DistributedTrainingConfig
from rankwise.train.checkpoint import CheckpointManager, read_checkpoint
from rankwise.train.checkpoint.manifests import KEY_VARIABLE
from rankwise.train.state import TrainState


def _saved(key: str | None = None, sharded: bool = False) -> Path:
    """A checkpoint of step 2 in a fresh folder (a sharded folder in a world of one)."""
    net = nn.Linear(2, 2)
    state = TrainState(net, torch.optim.SGD(net.parameters(), lr=0.1))
    state.step = 2
    manager = CheckpointManager(tempfile.mkdtemp(), sharded=sharded, key=key)
    return manager.save(state.state_dict(sharded=sharded), epoch=0, step=2)


def _tampered(how: str, sharded: bool = False, key: str | None = None) -> BaseException:
    path = tamper_checkpoint(_saved(key, sharded), how)
    return raised(read_checkpoint, path, key=key)


def _env_key_empty() -> BaseException:
    saved = os.environ.get(KEY_VARIABLE)
    os.environ[KEY_VARIABLE] = ""
    try:
        return raised(read_checkpoint, _saved("a-key"))
    finally:
        if saved is None:
            del os.environ[KEY_VARIABLE]
        else:
            os.environ[KEY_VARIABLE] = saved


def _config_redacted() -> BaseException:
    saved = DistributedTrainingConfig(checkpoint_key="a-key").to_dict()  # what to_yaml writes
    return raised(DistributedTrainingConfig.from_dict, saved)


TRIGGERS = {
    "checkpoint-no-mac": lambda: raised(read_checkpoint, _saved(), key="the-run-s-key"),
    "checkpoint-mac-mismatch": lambda: raised(read_checkpoint, _saved("a-key"), key="other-key"),
    "checkpoint-renamed": lambda: _tampered("rename-step"),
    "checkpoint-unlisted-file": lambda: _tampered("unlisted-file", sharded=True),
    "checkpoint-key-env-empty": _env_key_empty,
    "config-checkpoint-key": lambda: raised(DistributedTrainingConfig, checkpoint_key=""),
    "config-checkpoint-key-redacted": _config_redacted,
}


@pytest.mark.parametrize("row_id", sorted(TRIGGERS))
def test_documented_message_is_the_one_raised(row_id: str) -> None:
    check_row(row_id, TRIGGERS[row_id])
