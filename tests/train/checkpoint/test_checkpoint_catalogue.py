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
    set_fault_hook,
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


# -- the manager's rules, once for every backend (each was a local test and a bucket twin) ---


def _state(step: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(step)
    return {"format": 1, "step": step, "w": torch.randn(64, 32, generator=g), "names": ("a",)}


def _truncate(store: Storage, name: str) -> None:
    data = store.read(name)
    store.put(data[: len(data) // 2], name)


def _flip(store: Storage, name: str) -> None:
    data = bytearray(store.read(name))
    data[900] ^= 0x01
    store.put(bytes(data), name)


def test_the_manager_saves_names_and_prunes_to_keep_last(store_root: str):
    manager, store = _manager(store_root, keep_last=2), Storage.for_url(store_root)
    assert manager.latest() is None and manager.load_latest() is None
    assert not store.exists("ckpt-latest.json")
    for step in (5, 10, 15, 20):
        manager.save(_state(step), epoch=step // 10, step=step)
    kept = ["ckpt-e000001-s000000015.pt", "ckpt-e000002-s000000020.pt"]
    assert _names(manager) == kept
    assert store.names() == sorted([*kept, "ckpt-latest.json", *(f"{n}.sha256.json" for n in kept)])
    found = manager.load_latest()
    assert found is not None and found[1]["step"] == 20
    assert str(found[0]) == str(find_latest(store_root))
    keep_all = _manager(f"{store_root}/all", keep_last=None)
    for step in range(5):
        keep_all.save(_state(step), epoch=0, step=step)
    assert len(keep_all.checkpoints()) == 5


class _Recording(Storage):
    """The real store, with its writes and deletes recorded in ``order``."""

    order: list[str]

    def put(self, source: Any, key: str, **kw: Any) -> int:
        self.order.append(f"put {key}")
        return super().put(source, key, **kw)

    def delete(self, *keys: str) -> None:
        self.order.extend(f"delete {k}" for k in keys)
        super().delete(*keys)


def test_nothing_is_pruned_or_pointed_at_before_the_new_checkpoint_is_safe(store_root: str):
    plain = Storage.for_url(store_root)
    store = _Recording(plain.url, plain.protocol, plain.path, plain.fs)
    store.order = []
    manager = CheckpointManager(store, keep_last=1)
    manager.save(_state(1), epoch=0, step=1)
    plain.put(b"torn, older", "ckpt-e000000-s000000000.pt")  # no manifest: a save killed
    seen: dict[str, tuple[list[str], str]] = {}

    def hook(point: str) -> None:
        if point not in ("before-pointer", "before-prune"):
            return  # mid-upload runs on the store client's event loop: no calls from there
        names = [n for n in plain.names() if not n.startswith(".")]
        seen[point] = (names, json.loads(plain.read("ckpt-latest.json"))["file"])

    previous = set_fault_hook(hook)
    store.order.clear()
    try:
        manager.save(_state(2), epoch=0, step=2)
    finally:
        set_fault_hook(previous)
    torn, old, new = (f"ckpt-e000000-s00000000{s}.pt" for s in (0, 1, 2))
    # Before the pointer moves, the new file and its manifest are complete; the old one is kept.
    assert seen["before-pointer"] == (
        sorted([torn, old, old + ".sha256.json", new, new + ".sha256.json", "ckpt-latest.json"]),
        old,
    )
    assert seen["before-prune"][1] == new and old in seen["before-prune"][0]
    # The data (staged and uploaded, or renamed into place) and its manifest, then the pointer,
    # then the pruning, each checkpoint's manifest before its data (the incomplete one too).
    assert store.order[-5:] == [
        "put ckpt-latest.json",
        f"delete {torn}.sha256.json",
        f"delete {torn}",
        f"delete {old}.sha256.json",
        f"delete {old}",
    ]
    assert _names(manager) == [new]


def _unfinished(store: Storage, name: str) -> None:
    store.delete(f"{name}.sha256.json")  # a save killed before its manifest


@pytest.mark.parametrize(
    ("damage", "what"),
    [(_truncate, "truncated"), (_flip, "corrupt"), (_unfinished, "has no manifest")],
)
def test_latest_falls_back_to_the_previous_good_checkpoint(store_root: str, damage, what: str):
    manager, store = _manager(store_root, keep_last=3), Storage.for_url(store_root)
    paths = [str(manager.save(_state(s), epoch=0, step=s)) for s in (1, 2, 3)]
    names = [p.rpartition("/")[2] for p in paths]
    damage(store, names[2])
    with pytest.warns(CheckpointWarning, match=what) as record:
        assert str(manager.latest()) == paths[1]
    assert [paths[2] in str(w.message) for w in record] == [True]  # named by its path or URL
    damage(store, names[1])
    with pytest.warns(CheckpointWarning) as record:
        found = manager.load_latest()
    assert found is not None and str(found[0]) == paths[0] and found[1]["step"] == 1
    said = " ".join(str(w.message) for w in record)
    assert names[1] in said and names[2] in said


def test_a_broken_or_stale_pointer_falls_back_to_scanning(store_root: str):
    manager, store = _manager(store_root, keep_last=None), Storage.for_url(store_root)
    paths = [str(manager.save(_state(s), epoch=0, step=s)) for s in (1, 2)]
    store.put(b"{not json", "ckpt-latest.json")
    with pytest.warns(CheckpointWarning, match="unreadable"):
        assert str(manager.latest()) == paths[1]
    store.put(json.dumps({"file": "ckpt-e000000-s000000009.pt"}).encode(), "ckpt-latest.json")
    with pytest.warns(CheckpointWarning, match="not in"):
        assert str(manager.latest()) == paths[1]
    # The pointer is the commit point: a valid checkpoint newer than it is a last resort only.
    store.put(json.dumps({"file": paths[0].rpartition("/")[2]}).encode(), "ckpt-latest.json")
    assert str(manager.latest()) == paths[0]
