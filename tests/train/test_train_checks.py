"""Consistency checks on real gloo ranks: at start-up, every N steps, and a stalled rank named.

- ``fit`` stops on every rank when the ranks disagree on the model, the data's length, the
  config or the optimizer, naming the field and the ranks; fields that are rank-local by
  design (console, log paths) may differ.
- ``check_sync_every_n_steps`` stops a run whose parameters diverged on one rank, naming the
  parameter and the rank; the same run without the check (or without the divergence) passes.
- :class:`rankwise.distributed.Progress`: when one rank skips a collective, the others'
  timeout names it and the operation.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import rankwise.distributed as rd
from helpers.training import classification
from rankwise.testing import run_distributed
from rankwise.train import DistributedTrainer, DistributedTrainingConfig

pytestmark = pytest.mark.timeout(180)


def _model(hidden: int = 8) -> nn.Sequential:
    torch.manual_seed(0)  # the same weights on every rank
    return nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 3))


def _config(**overrides: Any) -> DistributedTrainingConfig:
    values: dict[str, Any] = dict(epochs=1, batch_size=4, verbose=False, checkpoint_dir=None)
    return DistributedTrainingConfig(**{**values, **overrides})


def _fit(
    hidden: int = 8, n: int = 32, lr: float = 0.1, val: int = 0, **cfg: Any
) -> tuple[str, str]:
    """Train one epoch; ``(error type, message)`` or ``("ok", <steps>)``."""
    model = _model(hidden)
    trainer = DistributedTrainer(
        model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr)
    )
    x, y = classification(n, 4, 3, seed=1)
    args: tuple[Any, ...] = (x, y, *classification(val, 4, 3, seed=1)) if val else (x, y)
    try:
        trainer.fit(*args, _config(**cfg))
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "ok", str(trainer.global_step)


# -- start-up ----------------------------------------------------------------------------------


def _start_cases(folder: str) -> dict[str, tuple[str, str]]:
    odd = rd.get_rank() == 1
    mine = f"{folder}/rank-{rd.get_rank()}"  # paths themselves may differ (node-local mounts)
    return {
        "model": _fit(hidden=6 if odd else 8),
        "dataset": _fit(n=28 if odd else 32),
        "val_dataset": _fit(val=18 if odd else 20),
        "config": _fit(seed=7 if odd else 42),
        "optimizer": _fit(lr=0.2 if odd else 0.1),
        # Rank-local fields may differ; then every rank trains.
        "rank_local": _fit(log_every_n_batches=0 if odd else 5, num_workers=1 if odd else 0),
        # Whether they are set decides the collectives (a save's broadcast, a resume's).
        "checkpoint_dir": _fit(checkpoint_dir=None if odd else mine),
        "resume": _fit(checkpoint_dir=mine, resume=None if odd else "auto"),
        "paths_differ": _fit(checkpoint_dir=mine, resume="auto", save_on_master_only=False),
    }


@pytest.fixture(scope="module")
def start_cases(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, tuple[str, str]]]:
    folder = str(tmp_path_factory.mktemp("checkpoints"))
    return run_distributed(_start_cases, 2, args=(folder,), timeout=150)


EXPECTED = {
    "model": [
        "model differs: rank 0 has",
        "rank 1 has",
        "'0.weight': \"float32[6, 4]\"",
        'instead of "float32[8, 4]"',
        "build the same model",
    ],
    "dataset": [
        "dataset_length differs: rank 0 has 32, rank 1 has 28; every rank must load the same data"
    ],
    "val_dataset": ["val_dataset_length differs: rank 0 has 20, rank 1 has 18"],
    "config": ["config differs", "(rank 1 vs rank 0: 'seed': 7 instead of 42)", "same config"],
    "optimizer": ["optimizer differs", "'param_groups[0].lr': 0.2 instead of 0.1", "(lr"],
    "checkpoint_dir": ["config differs", "'checkpoint_dir': null instead of \"a folder\""],
    "resume": ["config differs", "'resume': null instead of \"auto\""],
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_a_disagreement_stops_every_rank_naming_field_and_ranks(start_cases, case):
    for rank, cases in enumerate(start_cases):
        kind, message = cases[case]
        assert kind == "InconsistentRanksError", (rank, kind, message)
        for fragment in EXPECTED[case]:
            assert fragment in message, (rank, fragment, message)


def test_rank_local_fields_may_differ(start_cases):
    for case in ("rank_local", "paths_differ"):
        assert [cases[case] for cases in start_cases] == [("ok", "4"), ("ok", "4")], case


def test_the_sync_check_is_refused_under_fsdp():
    # Before the fix it compared nothing under FSDP2 plain sharding and passed silently.
    # Refused where the config is made, before any fit (the rules across fields: config/training.py).
    with pytest.raises(ValueError, match=r"check_sync_every_n_steps \(2\) compares the ranks"):
        _config(strategy="fsdp", check_sync_every_n_steps=2)


def test_a_lazy_module_trains_in_a_world_of_one():
    # Before the fix the start-up check read the shape of an uninitialized parameter.
    torch.manual_seed(0)
    trainer = DistributedTrainer(
        nn.Sequential(nn.LazyLinear(3)), nn.CrossEntropyLoss(), lambda p: torch.optim.SGD(p, 0.1)
    )
    trainer.fit(*classification(16, 4, 3, seed=1), _config(strategy="none"))
    assert trainer.global_step == 4


# -- every N steps -----------------------------------------------------------------------------


def _perturb_rank1_at_step_2(trainer: DistributedTrainer, epoch: int, step: int, ids: Any) -> None:
    if rd.get_rank() == 1 and step == 2:  # after step 2's backward: rank 1's weights move
        with torch.no_grad():
            trainer.module[0].weight.add_(0.5)


def _sync_cases() -> dict[str, tuple[str, str]]:
    out = {}
    for name, every, hook in (
        ("diverged", 2, _perturb_rank1_at_step_2),
        ("in_sync", 2, None),
        ("diverged_unchecked", None, _perturb_rank1_at_step_2),
    ):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
        trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), opt)
        trainer.on_batch = hook
        try:
            trainer.fit(
                *classification(48, 4, 3, seed=1), _config(epochs=2, check_sync_every_n_steps=every)
            )
            out[name] = ("ok", str(trainer.global_step))
        except Exception as exc:
            out[name] = (type(exc).__name__, str(exc))
    return out


def test_periodic_sync_check_names_the_diverged_parameter_and_rank():
    results = run_distributed(_sync_cases, 2, timeout=150)
    for rank, cases in enumerate(results):
        kind, message = cases["diverged"]
        assert kind == "OutOfSyncError", (rank, kind, message)
        # Perturbed before step 3's update; the check after step 4 is the first to see it.
        assert message.startswith("parameters out of sync after optimizer step 4 "), message
        assert "0.weight: rank 1 differs from rank 0" in message, message
        assert "2 tensors" not in message and "0.bias" not in message, message
        assert cases["in_sync"] == ("ok", "12"), (rank, cases["in_sync"])
        # Without the check the same divergence trains on silently: the check is what stops it.
        assert cases["diverged_unchecked"] == ("ok", "12"), (rank, cases["diverged_unchecked"])


# -- a rank that skips a collective ------------------------------------------------------------


def _skip_collective() -> str:
    rank = rd.get_rank()
    store = dist.distributed_c10d._get_default_store()
    # Line the ranks up with a generous timeout: only the skipped collective may time out.
    dist.monitored_barrier(timeout=timedelta(seconds=60))
    progress = rd.Progress("test/skip")
    with progress.operation("all_reduce of the warm-up tensor"):
        rd.all_reduce(torch.ones(1))
    message = "no error"
    if rank != 2:  # rank 2 skips the next collective
        try:
            with progress.operation("all_reduce of the loss at step 3"):
                rd.all_reduce(torch.ones(1))
        except rd.DistributedTimeoutError as exc:
            message = str(exc)
        store.set(f"test/done/{rank}", "1")
    # Keep every rank (rank 0 hosts the store) alive until both survivors have read it.
    store.wait(["test/done/0", "test/done/1"], timedelta(seconds=60))
    return message


def test_a_timeout_names_the_rank_that_skipped_the_collective():
    # 3 s is enough: a barrier lines the ranks up just before the timed collectives.
    results = run_distributed(
        _skip_collective, 3, timeout=120, env={"DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": "3000"}
    )
    assert results[2] == "no error"
    late = (
        "rank 2 did not arrive (last operation entered: rank 2: all_reduce of the warm-up tensor)."
    )
    timed_out = []
    for rank in (0, 1):
        message = results[rank]
        # The first survivor to time out closes its connections; the other may see that first
        # ("Connection closed by peer"), and is told the same about rank 2.
        own = f"all_reduce of the loss at step 3 timed out on rank {rank} after 3000 ms: {late}"
        closed = (
            f"all_reduce of the loss at step 3 failed on rank {rank}: a peer closed its "
            f"connection (it timed out waiting first, or exited), and {late}"
        )
        assert message.startswith((own, closed)), message
        assert "DISTRIBUTED_COLLECTIVE_TIMEOUT_MS" in message
        timed_out += [rank] if message.startswith(own) else []
    assert timed_out, results  # someone timed out: the other's peer closed after its timeout


def test_progress_is_an_identity_in_a_world_of_one():
    progress = rd.Progress("test/world-of-one")
    with progress.operation("all_reduce of nothing"):
        rd.all_reduce(torch.ones(1))
    assert progress.current == "all_reduce of nothing"
    assert rd.is_timeout(RuntimeError("[gloo] Timed out waiting 3000ms for recv operation"))
    assert not rd.is_timeout(RuntimeError("[gloo] Connection closed by peer"))
    assert not rd.is_timeout(RuntimeError("DataLoader timed out after 5 seconds"))
