"""``rankwise.distributed.Progress`` on real gloo ranks: what a timed-out rank can still say.

- Rank 0 (the store's host) frozen: the timed-out rank still raises, saying the progress could
  not be read, instead of waiting forever on the frozen store (torchrun could never restart).
- A ``FileStore`` group: marks leave the file alone (it appends every ``set``, never compacted).
- Keys are named, not counted: a ``Progress`` or trainer made on one rank only shifts nothing,
  so the stalled rank is still named with its real last operation.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import rankwise.distributed as rd
from rankwise.testing import run_distributed
from rankwise.testing.store_attacks import VanishingStore
from rankwise.train import DistributedTrainer, DistributedTrainingConfig

pytestmark = pytest.mark.timeout(180)


def _host_frozen() -> str:
    # Line the ranks up with a generous timeout: only the operation below may time out.
    dist.monitored_barrier(timeout=timedelta(seconds=60))
    progress = rd.Progress("test/frozen-host")
    pid = torch.tensor([os.getpid() if rd.get_rank() == 0 else 0], dtype=torch.float64)
    with progress.operation("the warm-up all_reduce"):
        rd.all_reduce(pid)
    if rd.get_rank() == 0:
        os.kill(os.getpid(), signal.SIGSTOP)  # frozen, store and all, until rank 1 says so
        return "continued"
    try:
        with progress.operation("the all_reduce at step 2"):
            rd.all_reduce(torch.ones(1))
        return "no error"
    except rd.DistributedTimeoutError as exc:
        return str(exc)
    finally:
        os.kill(int(pid.item()), signal.SIGCONT)


def test_a_timeout_with_the_store_host_frozen_still_raises():
    # Before the fix rank 1 waited on the frozen store forever: a TimeoutError here.
    results = run_distributed(
        _host_frozen, 2, timeout=90, env={"DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": "3000"}
    )
    assert results[0] == "continued"
    assert results[1].startswith(
        "the all_reduce at step 2 timed out on rank 1 after 3000 ms: the peers' progress could "
        "not be read from the store within 2 s (its host, rank 0, may have exited or be frozen)"
    ), results[1]


def _file_store_marks(path: str) -> tuple[int, int, str, str]:
    dist.init_process_group(
        "gloo", init_method=f"file://{path}", rank=int(os.environ["RANK"]), world_size=2
    )
    rd.init()  # adopts the user's group
    dist.barrier()
    before = os.path.getsize(path)
    progress = rd.Progress("test/file-store")
    for step in range(200):
        with progress.operation(f"the all_reduce at step {step}"):
            pass
    dist.barrier()
    timeout = progress.timeout_error(RuntimeError("[gloo] Timed out waiting 10ms for recv"))
    return before, os.path.getsize(path), progress.current, str(timeout)


def test_marks_leave_a_file_store_alone(tmp_path: Path):
    store = str(tmp_path / "store")
    results = run_distributed(_file_store_marks, 2, args=(store,), init_group=False, timeout=90)
    for before, after, current, timeout in results:
        assert after == before, f"the FileStore grew from {before} to {after} bytes"
        assert current == "the all_reduce at step 199"
        assert ": no rank leaves progress marks on this group's store (only a TCPStore" in timeout


def _stall_after_a_rank_local_trainer() -> str:
    rank = rd.get_rank()
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:  # built on rank 1 only (e.g. for a probe), never fitted
        DistributedTrainer(nn.Linear(4, 3), nn.CrossEntropyLoss(), lambda p: torch.optim.SGD(p))

    def stall(trainer: Any, epoch: int, step: int, ids: Any) -> None:
        if rank == 1 and step == 1:  # until rank 0 has its error
            store.wait(["test/reported"], timedelta(seconds=60))
            raise RuntimeError("rank 1 stalled on purpose")

    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters()))
    trainer.on_batch = stall
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
    cfg = DistributedTrainingConfig(epochs=1, batch_size=4, verbose=False, checkpoint_dir=None)
    try:
        trainer.fit(x, (x[:, 0] > 0).long(), cfg)
    except Exception as exc:
        if rank == 0:
            store.set("test/reported", "1")
        return str(exc)
    return "no error"


def test_a_rank_local_trainer_does_not_shift_the_marks():
    # Before the fix the extra trainer shifted rank 1's keys: "rank 1: none yet".
    results = run_distributed(
        _stall_after_a_rank_local_trainer,
        2,
        timeout=120,
        env={"DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": "5000"},  # fit's start-up lines the ranks up
    )
    assert results[0].startswith(
        "the all_reduce of the gradients at step 3 (epoch 0) timed out on rank 0 after 5000 "
        "ms: rank 1 did not arrive (last operation entered: rank 1: the all_reduce of the "
        "gradients at step 2 (epoch 0))."
    ), results[0]
    assert "rank 1 stalled on purpose" in results[1]


def test_a_progress_needs_a_name():
    with pytest.raises(ValueError, match=r"Progress needs a name .* got ''.*Progress\("):
        rd.Progress("")


CLOSED = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1")


def _explain_a_closed_peer() -> tuple[str, str, str]:
    # With 3+ ranks the first survivor to time out closes its connections: the others get
    # gloo's "Connection closed by peer", not a timeout. The marks still name the late rank.
    progress = rd.Progress("test/closed")
    progress.mark("the all_reduce at step 1")
    dist.barrier()  # both marked step 1
    if rd.get_rank() == 0:
        progress.mark("the all_reduce at step 2")  # rank 1 never gets there
    dist.barrier()
    ahead = progress.explain(CLOSED)
    other = progress.explain(RuntimeError("CUDA out of memory"))
    dist.barrier()
    return type(ahead).__name__, str(ahead), str(other)


def test_a_closed_peer_names_the_rank_that_did_not_arrive():
    results = run_distributed(_explain_a_closed_peer, 2, timeout=90)
    kind, message, other = results[0]
    assert kind == "DistributedTimeoutError" and message.startswith(
        "the all_reduce at step 2 failed on rank 0: a peer closed its connection (it timed out "
        "waiting first, or exited), and rank 1 did not arrive (last operation entered: rank 1: "
        "the all_reduce at step 1)."
    ), message
    assert "torch said: [gloo/transport/tcp/pair.cc:553] Connection closed by peer" in message
    # Every peer had arrived (rank 1's view): a crash inside the operation; torch's error
    # stands. Nor is any other error rewritten.
    assert results[1][:2] == ("NoneType", "None") and other == "None" == results[1][2]


def test_the_marks_are_read_without_a_get_that_can_wait() -> None:
    # A mark deleted between a check and its get (the old read: check, then multi_get) held
    # the timeout's message for the store's whole timeout, behind the reader's 2 s deadline.
    # On a store where each key vanishes as a check finds it, every mark set is still read.
    from rankwise.distributed.progress import _read_marks

    store = VanishingStore()
    store.set("m/1", "4\tthe all_reduce at step 2")
    store.set("m/3", "2\tthe warm-up all_reduce")
    peers = _read_marks(store, {1: "m/1", 2: "m/2", 3: "m/3"})
    assert peers == {1: (4, "the all_reduce at step 2"), 2: None, 3: (2, "the warm-up all_reduce")}
    assert store.waits == []
    assert not store.inner.check(["m/2"])  # the read set nothing
