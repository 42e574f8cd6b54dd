"""Sharded (DCP) checkpoints in one process, on every backend (a local folder, ``memory://``
and a real S3 server, SeaweedFS): the one sharded writer's saves, background saves staged as
they were when called, the newest kept and the rest pruned, a load into a fresh model and
optimizer, and a torn, unfinished or manifest-less folder never trusted. What takes more than
one rank (each rank's shards, resharding onto another world size) is in
``test_checkpoint_sharded_ranks.py`` (a folder) and ``test_checkpoint_bucket_sharded.py`` (a
bucket)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from helpers.states import state_after
from rankwise.storage import Storage, is_remote_url
from rankwise.train import checkpoint as ck
from rankwise.train.checkpoint import CheckpointError, CheckpointWarning, set_fault_hook
from rankwise.train.checkpoint.sharded import MANIFEST, REST
from rankwise.train.state import TrainState

pytestmark = pytest.mark.timeout(120)


def _manager(root: str, **kw: Any) -> Any:
    if is_remote_url(root):
        return ck.RemoteCheckpointManager(Storage.for_url(root), sharded=True, **kw)
    return ck.CheckpointManager(root, sharded=True, **kw)


def _at(root: str, step: int) -> str:
    return f"{root}/ckpt-e000000-s{step:09d}.dcp"


def test_sharded_saves_and_loads_on_every_backend(store_root: str) -> None:
    net = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
    manager = _manager(store_root, keep_last=2)
    first = manager.save(TrainState(net, optimizer).state_dict(sharded=True), epoch=0, step=0)
    assert str(first) == _at(store_root, 0)
    assert MANIFEST in Storage.for_url(store_root).child(Path(str(first)).name).names()
    for step in (1, 2, 3):
        state = state_after(net, optimizer, step)
        pending = manager.save_async(state.state_dict(sharded=True), epoch=0, step=step)
        expected = net.weight.detach().clone()  # as staged: the next step changes it in place
    assert str(manager.wait()) == str(pending.result()) == _at(store_root, 3)
    names = [str(p).rpartition("/")[2] for p in manager.checkpoints()]
    assert names == ["ckpt-e000000-s000000002.dcp", "ckpt-e000000-s000000003.dcp"]
    state_after(net, optimizer, 4)  # after the save: not in it
    again = nn.Linear(3, 2)
    other = torch.optim.Adam(again.parameters(), lr=0.5)
    found, loaded = manager.load_latest() or ("", {})
    local = Path(loaded["dcp"]["folder"])
    assert str(found) == _at(store_root, 3) and local.is_dir()
    TrainState(again, other).load_state_dict(loaded, found)
    assert torch.equal(again.weight, expected)
    # a bucket's folder is downloaded for the load, then deleted; a local one is the checkpoint
    assert local.exists() == (not is_remote_url(store_root))
    assert other.param_groups[0]["lr"] == 0.1 and int(other.state[again.weight]["step"]) == 3
    # an explicit path or URL of a folder reads it too (trailing slash or not)
    assert ck.read_checkpoint(f"{_at(store_root, 2)}/")["step"] == 2


def test_a_sharded_save_before_the_first_step_keeps_the_hyper_parameters(store_root: str) -> None:
    net = nn.Linear(3, 2)
    state = TrainState(net, torch.optim.Adam(net.parameters(), lr=0.1))
    path = _manager(store_root).save(state.state_dict(sharded=True), epoch=0, step=0)
    again = nn.Linear(3, 2)
    other = torch.optim.Adam(again.parameters(), lr=0.5)
    TrainState(again, other).load_state_dict(ck.read_checkpoint(path), path)
    assert other.param_groups[0]["lr"] == 0.1 and not other.state  # no zero step


def _raise_at(point: str) -> Any:
    def hook(at: str) -> None:
        if at == point:
            raise RuntimeError(f"killed at {at}")

    return hook


def test_a_torn_unfinished_or_manifestless_folder_is_never_trusted(store_root: str) -> None:
    net = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
    store = Storage.for_url(store_root)
    manager = _manager(store_root, keep_last=3)
    for step in (1, 2):
        manager.save(state_after(net, optimizer, step).state_dict(sharded=True), epoch=0, step=step)
    newest = store.child("ckpt-e000000-s000000002.dcp")
    shard = newest.read("__0_0.distcp")
    newest.put(shard[: len(shard) // 2], "__0_0.distcp")  # torn: a crash mid-write or upload
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert str(manager.latest()) == _at(store_root, 1)
    said = [str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)]
    assert len(said) == 1, said
    assert f"{_at(store_root, 2)}: __0_0.distcp is truncated (torn write)" in said[0]
    with pytest.raises(CheckpointError, match="is truncated"):
        ck.read_checkpoint(newest.display_url)
    # a save killed before its manifest: the folder is never loaded (in a bucket its objects
    # are there without one), and the next save's pruning removes it
    set_fault_hook(_raise_at("before-manifest"))
    try:
        with pytest.raises(OSError, match="killed at before-manifest"):
            manager.save(state_after(net, optimizer, 3).state_dict(sharded=True), epoch=0, step=3)
    finally:
        set_fault_hook(None)
    unfinished = "ckpt-e000000-s000000003.dcp"
    if is_remote_url(store_root):
        left = store.child(unfinished).names()
        assert REST in left and MANIFEST not in left
        with pytest.raises(CheckpointError, match=f"{_at(store_root, 3)} has no manifest"):
            ck.read_checkpoint(_at(store_root, 3))
    else:  # on disk it never got its name: a temporary folder, removed by a later save
        # once this process is gone
        assert unfinished not in store.names(folders=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)  # the torn one, again
        assert str(manager.latest()) == _at(store_root, 1)
    manager.save(state_after(net, optimizer, 4).state_dict(sharded=True), epoch=0, step=4)
    names = [str(p).rpartition("/")[2] for p in manager.checkpoints()]
    assert unfinished not in names and str(manager.latest()) == _at(store_root, 4)
    # a folder whose manifest is gone (a save that did not finish) is never loaded either
    store.child("ckpt-e000000-s000000004.dcp").delete(MANIFEST)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert str(manager.latest()) == _at(store_root, 1)
    said = [str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)]
    assert any(f"{_at(store_root, 4)} has no manifest (manifest.json)" in m for m in said), said
