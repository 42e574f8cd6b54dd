"""Checkpoint files and the manager on disk: atomic saves, verified loads, real kills. (The
manager's rules on every backend, pruning and fallback among them: test_checkpoint_catalogue.py.)"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import xxhash

import rankwise.train.checkpoint as ck
from rankwise.testing import RankFailedError, kill_at_checkpoint, run_distributed
from rankwise.train import (
    CheckpointError,
    CheckpointManager,
    load_file,
    save_file,
)


def _state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"format": 1, "step": step, "w": torch.randn(64, 32, generator=g), "names": ("a",)}


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_a_version_1_manifest_with_sha256_still_verifies_and_catches_a_flip(
    tmp_path: Path,
) -> None:
    path = save_file(_state(1), tmp_path / "old.pt")
    data = path.read_bytes()
    old = {"version": 1, "file": path.name, "size": len(data)}
    old["sha256"] = hashlib.sha256(data).hexdigest()  # what rankwise wrote before XXH3
    ck.manifest_path(path).write_text(json.dumps(old))
    assert ck.verify_file(path)["version"] == 1
    assert torch.equal(load_file(path)["w"], _state(1)["w"])
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0xFF
    path.write_bytes(bytes(flipped))
    with pytest.raises(ck.CheckpointError, match="is corrupt: sha256"):
        ck.verify_file(path)


def test_save_load_round_trip_with_manifest(tmp_path: Path) -> None:
    state = _state(1)
    path = save_file(state, tmp_path / "sub" / "model.pt", meta={"epoch": 2})
    loaded = load_file(path)
    assert loaded.keys() == state.keys() and torch.equal(loaded["w"], state["w"])
    manifest = json.loads(ck.manifest_path(path).read_text())
    # The digest computed while writing is the digest of the bytes on disk.
    assert manifest["xxh3_128"] == xxhash.xxh3_128(path.read_bytes()).hexdigest()
    assert manifest["size"] == path.stat().st_size and manifest["meta"] == {"epoch": 2}
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.pt", "model.pt.sha256.json"]
    assert torch.equal(torch.load(path, weights_only=True)["w"], state["w"])  # a plain file


@pytest.mark.parametrize(
    ("damage", "what"), [(_truncate, "truncated"), (lambda p: _flip_byte(p, 700), "corrupt")]
)
def test_torn_or_flipped_file_is_refused_by_name(tmp_path: Path, damage, what: str) -> None:
    path = save_file(_state(1), tmp_path / "model.pt")
    damage(path)
    with pytest.raises(CheckpointError, match=what) as info:
        load_file(path)
    assert str(path) in str(info.value)


def test_file_without_manifest_is_not_valid(tmp_path: Path) -> None:
    path = save_file(_state(1), tmp_path / "model.pt")
    ck.manifest_path(path).unlink()
    with pytest.raises(CheckpointError, match="no manifest"):
        load_file(path)
    with pytest.raises(FileNotFoundError, match=r"nothere\.pt"):
        load_file(tmp_path / "nothere.pt")


def test_save_refuses_values_that_would_not_load_safely(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"obj\['history'\]\['loss'\]\[1\] is a numpy.float64"):
        save_file({"history": {"loss": [1.0, np.float64(0.5)]}}, tmp_path / "x.pt")
    with pytest.raises(TypeError, match="takes a dict"):
        save_file([1, 2], tmp_path / "x.pt")  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())  # nothing written


def test_trainer_like_content_round_trips_with_weights_only(tmp_path: Path) -> None:
    from rankwise.data import DistributedSampler

    net = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(net.parameters(), lr=0.1)
    net(torch.ones(2, 3)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    scaler = torch.amp.GradScaler("cpu")
    state = {
        "format": ck.FORMAT_VERSION,
        "model": ck.model_state_dict(net),
        "optimizer": ck.optimizer_state_dict(net, opt),
        "scheduler": sched.state_dict(),
        "scaler": scaler.state_dict(),
        "sampler": DistributedSampler(100, num_replicas=1, rank=0).state_dict(),
        "rng": ck.rng_state(),
        "config": {"epochs": 3, "precision": "fp32", "grad_clip_norm": None},
    }
    loaded = load_file(save_file(state, tmp_path / "c.pt"))
    assert loaded["scheduler"] == state["scheduler"] and loaded["sampler"] == state["sampler"]
    assert torch.equal(loaded["model"]["weight"], net.weight)


def test_manager_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"keep_last \(0\) must be an integer >= 1"):
        CheckpointManager(tmp_path, keep_last=0)
    with pytest.raises(ValueError, match="prefix"):
        CheckpointManager(tmp_path, prefix="a/b")
    with pytest.raises(ValueError, match=r"step \(-1\)"):
        CheckpointManager(tmp_path).save({}, epoch=0, step=-1)


def _killed_save(folder: str, point: str, background: bool = False) -> None:
    """Two good saves, then a third that SIGKILLs this process at ``point``."""
    manager = CheckpointManager(folder, keep_last=2)
    for step in (1, 2):
        manager.save({"step": step, "w": torch.full((1000, 100), float(step))}, epoch=0, step=step)
    kill_at_checkpoint(point)
    if background:  # the kill comes from the writer thread of save_async
        manager.save_async({"step": 3, "w": torch.full((1000, 100), 3.0)}, epoch=0, step=3)
        manager.wait()
    else:
        manager.save({"step": 3, "w": torch.full((1000, 100), 3.0)}, epoch=0, step=3)
    Path(folder, "survived").touch()


@pytest.mark.parametrize(
    ("point", "background"),
    [
        (p, False) for p in ck.FAULT_POINTS if p != "mid-upload"
    ],  # on disk + [("mid-write", True), ("before-pointer", True)],
)
def test_a_real_kill_at_any_point_of_a_save_leaves_a_valid_latest(
    tmp_path: Path, point: str, background: bool
) -> None:
    # A process of its own (from the forkserver, torch already imported) killed by SIGKILL: no
    # finally block, atexit handler or buffered write survives it.
    # (The exit code reads None when the pipe closes before the process is reaped.)
    with pytest.raises(RankFailedError, match=r"exited \(code (-9|None)\) without a result"):
        run_distributed(_killed_save, 1, args=(str(tmp_path), point, background), init_group=False)
    assert not (tmp_path / "survived").exists()
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert bool(leftovers) == (point in ("mid-write", "before-rename")), leftovers
    manager = CheckpointManager(tmp_path, keep_last=2)
    committed = 3 if point == "before-prune" else 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the pointer's file verifies: nothing to skip
        found = manager.load_latest()
    assert found is not None and found[1]["step"] == committed
    assert torch.equal(found[1]["w"], torch.full((1000, 100), float(committed)))
    # The next save works, cleans the dead writer's temporary file and prunes to keep_last.
    manager.save({"step": 4}, epoch=0, step=4)
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]
    kept = ["003", "004"] if point in ("before-pointer", "before-prune") else ["002", "004"]
    assert [p.name[-6:-3] for p in manager.checkpoints()] == kept


def test_async_save_writes_the_state_as_it_was_when_called(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=2)
    w = torch.zeros(1000, 100)
    first = manager.save_async({"w": w, "step": 1}, epoch=0, step=1)
    w.add_(1.0)  # training goes on in place while the file is written
    second = manager.save_async({"w": w, "step": 2}, epoch=0, step=2)
    w.add_(1.0)
    assert manager.wait() == second.result() and first.done()
    assert torch.equal(load_file(first.result())["w"], torch.zeros(1000, 100))
    found = manager.load_latest()
    assert found is not None and found[0] == second.result()
    assert torch.equal(found[1]["w"], torch.ones(1000, 100))
    assert manager.wait() is None


def test_async_save_errors_surface_in_the_caller(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("a file where the folder should be")
    manager = CheckpointManager(tmp_path / "f")
    with pytest.raises(TypeError, match="numpy"):
        manager.save_async({"x": np.float32(1)}, epoch=0, step=0)
    manager.save_async({"x": 1}, epoch=0, step=0)
    with pytest.raises(OSError):
        manager.wait()


def test_overwrite_killed_before_its_manifest_reads_as_unfinished(tmp_path: Path) -> None:
    path = save_file(_state(1), tmp_path / "model.pt")

    def stop(point: str) -> None:
        if point == "before-manifest":
            raise KeyboardInterrupt  # stands in for a kill: nothing after this point runs

    previous = ck.set_fault_hook(stop)
    try:
        with pytest.raises(KeyboardInterrupt):
            save_file(_state(2), path)
    finally:
        ck.set_fault_hook(previous)
    with pytest.raises(CheckpointError, match="no manifest"):
        load_file(path)
