"""The checkpoint writer when roles change or the folder fails (issue 23, findings 3, 4, 10):
whoever started a background write waits for it and reports it, whatever its role now; per-rank
folders follow the slot under ``--on-failure continue``; a relative folder is refused for a
continue job across nodes; an unwritable folder stops ``fit`` before its first step; SIGTERM is
caught only where a write can be in flight. No processes: a fake manager and membership."""

from __future__ import annotations

import concurrent.futures
import signal
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch

import rankwise.distributed as rd
from rankwise.distributed.config import MemberConfig
from rankwise.train import DistributedTrainer, DistributedTrainingConfig
from rankwise.train.checkpoint import manager_for
from rankwise.train.checkpoint.writer import CheckpointWriteError, CheckpointWriter
from rankwise.train.sigterm import SigtermGuard


class _Manager:
    """A CheckpointManager's background side: each save_async leaves a future the test ends."""

    sharded = False
    may_stall = False  # a folder's: a save waits for the write before it
    directory = Path("/ckpt")

    def __init__(self) -> None:
        self._pending: concurrent.futures.Future[Path] | None = None

    def pending(self) -> concurrent.futures.Future[Path] | None:
        return self._pending

    def wait(self, timeout: float | None = None, *, first: bool = False) -> Path | None:
        pending, self._pending = self._pending, None
        return pending.result(timeout) if pending is not None else None

    def path_for(self, epoch: int, step: int) -> Path:
        return self.directory / f"ckpt-s{step}.pt"

    def save_async(
        self, state: Any, *, epoch: int, step: int, behind: bool = False
    ) -> concurrent.futures.Future[Path]:
        self._pending = concurrent.futures.Future()
        return self._pending


class _State:
    epoch = 0

    def __init__(self, step: int) -> None:
        self.step = step

    def state_dict(self, *, sharded: bool = False) -> dict[str, Any]:
        return {}


def _writer(
    manager: _Manager, role: list[bool], reported: list[Any], final_wait_s: float = 600.0
) -> CheckpointWriter:
    return CheckpointWriter(
        manager,  # type: ignore[arg-type]
        writes=lambda: role[0],
        background=True,
        shared=True,
        saved=lambda path: reported.append((path, manager_future[0].done())),
        final_wait_s=final_wait_s,
    )


manager_future: list[Any] = [None]


def test_a_write_started_as_rank_0_is_waited_for_after_the_role_moved() -> None:
    # This rank was rank 0 and started writing step 3; slot 0 rejoined and is rank 0 now.
    # Its next save must wait for its own write (the pointer never goes back) and only then
    # report it as saved (durable).
    manager, role, reported = _Manager(), [True], []
    writer = _writer(manager, role, reported)
    writer.save(_State(3))
    manager_future[0] = pending = manager.pending()
    role[0] = False
    threading.Timer(0.3, pending.set_result, args=(Path("/ckpt/ckpt-s3.pt"),)).start()
    writer.save(_State(6))
    assert reported == [(Path("/ckpt/ckpt-s3.pt"), True)]  # reported, and durable by then
    assert manager.pending() is None


def test_a_failed_write_started_under_the_old_role_is_raised() -> None:
    manager, role, reported = _Manager(), [True], []
    writer = _writer(manager, role, reported)
    writer.save(_State(3))
    manager_future[0] = manager.pending()
    role[0] = False
    manager.pending().set_exception(OSError(28, "No space left on device"))
    with pytest.raises(CheckpointWriteError, match=r"ckpt-s3\.pt failed: .*No space left"):
        writer.save(_State(6))
    assert reported == []  # never reported as saved


def test_the_wait_for_a_write_started_under_the_old_role_is_bounded() -> None:
    # issue 30: a store that never answers held the old rank 0 (and so every rank) at the
    # next save for as long as it was silent. It waits checkpoint_final_wait_s, then every
    # rank stops naming the store and the bound (the pointer still never goes back).
    manager, role, reported = _Manager(), [True], []
    writer = _writer(manager, role, reported, final_wait_s=0.3)
    writer.save(_State(3))
    manager_future[0] = pending = manager.pending()
    role[0] = False
    late = threading.Timer(10.0, pending.set_result, args=(Path("/ckpt/ckpt-s3.pt"),))
    late.start()  # before the bound: it landed after 10 s, and the save waited for it
    started = time.monotonic()
    try:
        with pytest.raises(CheckpointWriteError) as e:
            writer.save(_State(6))
    finally:
        late.cancel()
    assert time.monotonic() - started < 6.0
    said = str(e.value)
    assert "ckpt-s3.pt" in said and "checkpoint_final_wait_s=0.3 s" in said, said
    assert "/ckpt did not answer" in said and "regroup" in said, said
    assert reported == []  # never reported as saved
    writer.drain()  # the bound was spent: no second wait
    assert time.monotonic() - started < 6.0


def test_the_sigterm_handler_follows_the_write_in_flight() -> None:
    manager, role = _Manager(), [True]
    writer = _writer(manager, role, [])
    before = signal.getsignal(signal.SIGTERM)
    drain = SigtermGuard([writer.sigterm_duty()])
    try:
        drain.update()
        assert signal.getsignal(signal.SIGTERM) is not before  # rank 0: a write may come
        writer.save(_State(3))
        role[0] = False  # a regroup made another process rank 0
        drain.update()
        assert signal.getsignal(signal.SIGTERM) is not before  # its own write is in flight
        manager.pending().set_result(Path("/ckpt/ckpt-s3.pt"))
        manager.wait()
        drain.update()
        assert signal.getsignal(signal.SIGTERM) is before  # nothing of its own to wait for
    finally:
        drain.remove()


def _roles(slot: int, world: int, per_node: int = 0, pending: bool = False) -> rd.Roles:
    cfg = MemberConfig(slot=slot, world_size=world, host="h", port=1, local_world_size=per_node)
    return rd.Roles(types.SimpleNamespace(cfg=cfg, pending=pending))  # type: ignore[arg-type]


def test_per_rank_folders_follow_the_slot_under_continue(tmp_path) -> None:
    # A restarted slot 2 runs its set-up as rank 0 of a world of one: its folder is rank-2/.
    cfg = DistributedTrainingConfig(checkpoint_dir=str(tmp_path), save_on_master_only=False)
    manager = manager_for(cfg, _roles(2, 3, pending=True))
    assert manager is not None and manager.directory == tmp_path / "rank-2"
    assert manager_for(cfg).directory == tmp_path / "rank-0"  # outside continue: the rank's


def test_a_relative_folder_is_refused_for_a_continue_job_across_nodes() -> None:
    across = _roles(0, 4, per_node=2)
    with pytest.raises(ValueError, match="relative, and this --on-failure continue job runs on 2"):
        manager_for(DistributedTrainingConfig(checkpoint_dir="ckpt"), across)
    assert manager_for(DistributedTrainingConfig(checkpoint_dir="/shared/ckpt"), across) is not None
    one_node = _roles(0, 4, per_node=4)
    assert manager_for(DistributedTrainingConfig(checkpoint_dir="ckpt"), one_node) is not None


def test_an_unwritable_folder_stops_fit_before_the_first_step(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    trainer = DistributedTrainer(
        model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1)
    )
    steps: list[int] = []
    trainer.on_batch = lambda trainer, epoch, step, ids: steps.append(step)
    cfg = DistributedTrainingConfig(
        epochs=1, batch_size=8, verbose=False, checkpoint_dir=str(blocker / "ckpt"),
        checkpoint_every_n_steps=2,
    )  # fmt: skip
    with pytest.raises(CheckpointWriteError) as stopped:
        trainer.fit(torch.randn(64, 6), torch.randint(0, 3, (64,)), cfg)
    assert f"{blocker / 'ckpt'} is not writable" in str(stopped.value)
    assert "Not a directory" in str(stopped.value)  # the OS error
    assert steps == []  # before the first step, not one interval later
