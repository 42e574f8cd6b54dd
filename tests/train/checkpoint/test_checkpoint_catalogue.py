"""The one catalogue of checkpoints (names, pointer, candidates, prune) on every backend: a
local folder, ``memory://`` and a real S3 server (SeaweedFS). Each test is one rule the local
and the bucket stacks used to state twice, and where the copies had drifted."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from rankwise.storage import Storage, is_remote_url
from rankwise.train.checkpoint import (
    CheckpointManager,
    CheckpointWarning,
    RemoteCheckpointManager,
    find_latest,
)

pytestmark = pytest.mark.timeout(120)


def _manager(root: str, **kw: Any) -> CheckpointManager | RemoteCheckpointManager:
    if is_remote_url(root):
        return RemoteCheckpointManager(Storage.for_url(root), **kw)
    return CheckpointManager(root, **kw)


def _sharded(step: int) -> dict[str, Any]:
    """A sharded save's state (TrainState's shape): model tensors, an optimizer's groups."""
    optimizer = {"state": {}, "param_groups": []}
    return {"model": {"w": torch.ones(2)}, "optimizer": optimizer, "epoch": 0, "step": step}


def _names(manager: CheckpointManager | RemoteCheckpointManager) -> list[str]:
    return [str(p).rstrip("/").rpartition("/")[2] for p in manager.checkpoints()]


def test_a_pointer_naming_a_missing_checkpoint_is_warned_on_every_backend(store_root: str):
    manager = _manager(store_root)
    for step in (1, 2):
        manager.save({"step": step}, epoch=0, step=step)
    Storage.for_url(store_root).put(
        json.dumps({"file": "ckpt-e000000-s000000009.pt"}).encode(), "ckpt-latest.json"
    )
    with pytest.warns(CheckpointWarning, match=r"names 'ckpt-e000000-s000000009\.pt', which is"):
        found = manager.load_latest()
    assert found is not None and found[1] == {"step": 2}


def test_one_prune_covers_files_and_sharded_folders_on_every_backend(store_root: str):
    folders = _manager(store_root, keep_last=None, sharded=True)
    for step in (1, 2):
        folders.save(_sharded(step), epoch=0, step=step)
    files = _manager(store_root, keep_last=2)
    files.save({"step": 3}, epoch=0, step=3)
    assert _names(files) == ["ckpt-e000000-s000000002.dcp", "ckpt-e000000-s000000003.pt"]
    files.save({"step": 4}, epoch=0, step=4)
    folders = _manager(store_root, keep_last=2, sharded=True)
    folders.save(_sharded(5), epoch=0, step=5)
    assert _names(folders) == ["ckpt-e000000-s000000004.pt", "ckpt-e000000-s000000005.dcp"]


def test_newer_checkpoints_are_warned_once_on_every_backend(store_root: str):
    manager = _manager(store_root)
    manager.save({"step": 9}, epoch=0, step=9)
    again = _manager(store_root)  # a second run into the same place, starting over
    with pytest.warns(CheckpointWarning, match=r"holds checkpoints newer than the one just sa"):
        again.save({"step": 1}, epoch=0, step=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)
        again.save({"step": 2}, epoch=0, step=2)
    assert _names(again)[-1] == "ckpt-e000000-s000000009.pt"  # kept


@pytest.mark.parametrize("keep_last", [0, -1, 1.5, True])
def test_keep_last_is_refused_alike_on_every_backend(tmp_path: Path, keep_last: Any):
    for root in (str(tmp_path), "memory://rankwise-keep-last"):
        with pytest.raises(ValueError) as caught:
            _manager(root, keep_last=keep_last)
        assert str(caught.value) == (
            f"keep_last ({keep_last!r}) must be an integer >= 1, or None to keep every checkpoint."
        )


def test_find_latest_takes_a_url_as_read_checkpoint_does(store_root: str):
    manager = _manager(store_root)
    assert find_latest(store_root) is None
    manager.save({"step": 1}, epoch=0, step=1)
    saved = manager.save({"step": 2}, epoch=0, step=2)
    assert str(find_latest(store_root)) == str(saved)
