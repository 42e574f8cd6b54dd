"""docs/troubleshooting.md tells the truth: every row's error is raised with its exact message.

The table is parsed; each row's ``id`` names a trigger here that provokes the error (in this
process, or on real gloo ranks where the error needs peers). A row without a trigger, or a
trigger without a row, fails the test, so the table and the code cannot drift apart. In a
documented message ``<NAME>`` stands for a part that changes from run to run (a port).
Later rows' triggers live by layer in tests/test_troubleshooting_{train,data,distributed,
parallel,augment,models,compat}.py; the pairing check here covers all of them, and
tests/troubleshooting/test_troubleshooting_coverage.py checks that no message rankwise raises is missing.
"""

from __future__ import annotations

import argparse
import functools
import socket
import sys
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_troubleshooting_augment import TRIGGERS as AUGMENT_TRIGGERS
from test_troubleshooting_compat import TRIGGERS as COMPAT_TRIGGERS
from test_troubleshooting_continue import TRIGGERS as CONTINUE_TRIGGERS
from test_troubleshooting_data import TRIGGERS as DATA_TRIGGERS
from test_troubleshooting_distributed import TRIGGERS as DISTRIBUTED_TRIGGERS
from test_troubleshooting_models import TRIGGERS as MODELS_TRIGGERS
from test_troubleshooting_parallel import TRIGGERS as PARALLEL_TRIGGERS
from test_troubleshooting_storage import TRIGGERS as STORAGE_TRIGGERS
from test_troubleshooting_train import TRIGGERS as TRAIN_TRIGGERS
from test_troubleshooting_trust import TRIGGERS as TRUST_TRIGGERS
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import rankwise.augment as ra
import rankwise.data as rdata
import rankwise.distributed as rd
import rankwise.parallel as rp
from helpers.training import make_trainer
from helpers.troubleshooting_table import check_row, raised, rows, run_cases
from rankwise.distributed import DistributedConfig
from rankwise.distributed.config import MemberConfig, check_variables, on_failure_mode
from rankwise.distributed.membership import Membership, check_min_nproc
from rankwise.launch import check_args
from rankwise.testing import child_env, free_port, run_distributed, run_isolated
from rankwise.train import DistributedTrainer, DistributedTrainingConfig, load_file, save_file
from rankwise.train.continuing import check_split

# -- triggers: each returns the exception its row documents -------------------------------------


def _from_environment(**variables: str) -> BaseException:
    return raised(DistributedConfig.from_environment, variables)


def _port_in_use() -> BaseException:
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        return raised(rd.init, DistributedConfig(rank=0, world_size=2, master_port=port))


def _peer_never_arrives() -> BaseException:
    cfg = DistributedConfig(rank=0, world_size=2, master_port=free_port(), timeout_ms=1000)
    return raised(rd.init, cfg)


def _master_unreachable() -> BaseException:
    cfg = DistributedConfig(rank=1, world_size=2, master_port=free_port(), timeout_ms=1000)
    return raised(rd.init, cfg)


def _reinit() -> BaseException:
    rd.init()
    return raised(rd.init, DistributedConfig(rank=0, world_size=2))


def _sampler_state_other_dataset() -> BaseException:
    state = rdata.DistributedSampler(100, num_replicas=2, rank=0).state_dict()
    return raised(rdata.DistributedSampler(90, num_replicas=2, rank=0).load_state_dict, state)


def _sampler_state_missing_key() -> BaseException:
    state = rdata.DistributedSampler(100, num_replicas=2, rank=0).state_dict()
    old = {("num_samples" if k == "dataset_size" else k): v for k, v in state.items()}
    return raised(rdata.DistributedSampler(100, num_replicas=2, rank=0).load_state_dict, old)


def _sampler_state_version() -> BaseException:
    state = {**rdata.DistributedSampler(100, num_replicas=2, rank=0).state_dict(), "version": 99}
    return raised(rdata.DistributedSampler(100, num_replicas=2, rank=0).load_state_dict, state)


def _drop_last_empty() -> BaseException:
    return raised(
        rdata.FetchDataset,
        np.zeros((6, 2)),
        rdata.Streaming(),
        batch_size=4,
        drop_last=True,
        rank=0,
        world_size=2,
    )


def _launch(script: str = "train.py", nproc: str = "2", nnodes: str = "1") -> BaseException:
    args = argparse.Namespace(training_script=script, nproc_per_node=nproc, nnodes=nnodes)
    return raised(check_args, args)


def _damaged_checkpoint(damage: str) -> BaseException:
    """A saved checkpoint, then truncated, bit-flipped or stripped of its manifest."""
    path = Path(tempfile.mkdtemp()) / "ckpt.pt"
    save_file({"x": torch.ones(100)}, path)
    data = path.read_bytes()
    if damage == "torn":
        path.write_bytes(data[:-10])
    elif damage == "flip":
        path.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    else:
        Path(f"{path}.sha256.json").unlink()
    return raised(load_file, path)


def _damaged_folder(damage: str) -> BaseException:
    """A sharded checkpoint folder (a world of one), then stripped of its manifest or of a
    shard file."""
    from rankwise.train.checkpoint import CheckpointManager, read_checkpoint
    from rankwise.train.state import TrainState

    net = nn.Linear(2, 2)
    state = TrainState(net, torch.optim.SGD(net.parameters(), lr=0.1)).state_dict(sharded=True)
    path = CheckpointManager(tempfile.mkdtemp(), sharded=True).save(state, epoch=0, step=0)
    (path / ("manifest.json" if damage == "manifest" else "__0_0.distcp")).unlink()
    return raised(read_checkpoint, path)


_X, _Y = np.zeros((8, 2), np.float32), np.zeros((8, 2), np.float32)


def _resume_missing_file() -> BaseException:
    config = DistributedTrainingConfig(epochs=1, batch_size=4, resume="/no/such/ckpt.pt")
    return raised(make_trainer(loss=nn.MSELoss()).fit, _X, _Y, config)


def _checkpoint_format() -> BaseException:
    path = Path(tempfile.mkdtemp()) / "other.pt"
    save_file({"format": 99, "epoch": 0, "step": 0}, path)
    return raised(make_trainer(loss=nn.MSELoss()).load_checkpoint, path)


def _global_batch_changed() -> BaseException:
    folder = tempfile.mkdtemp()
    first = DistributedTrainingConfig(epochs=1, batch_size=4, checkpoint_dir=folder, verbose=False)
    make_trainer(loss=nn.MSELoss()).fit(_X, _Y, first)  # saved global batch: 4 x 1 rank x 1 step
    again = DistributedTrainingConfig(
        epochs=2, batch_size=1, grad_accum_steps=3, checkpoint_dir=folder, resume="auto"
    )
    return raised(make_trainer(loss=nn.MSELoss()).fit, _X, _Y, again)


def _already_wrapped() -> BaseException:
    return raised(rp.wrap_model, nn.DataParallel(nn.Linear(2, 2)))


# srun started this task (SLURM_STEP_ID) but neither MASTER_ADDR nor a node list is there.
_SLURM = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_LOCALID": "0"}


def _on_ranks(case: str) -> BaseException:
    """Errors that need peers, from rank 1 (every rank raises); one 2-rank run for all."""
    kind, message = _rank_errors()[case]
    return type(kind, (Exception,), {})(message)  # a stand-in with the same type name


@functools.cache
def _rank_errors() -> dict[str, tuple[str, str]]:
    return dict(run_distributed(_rank_cases, 2, timeout=90)[1])


def _rank_cases() -> dict[str, tuple[str, str]]:
    rank = rd.get_rank()
    cases: dict[str, Callable[[], object]] = {
        "uneven_batches": lambda: make_trainer(
            loss=nn.MSELoss()
        ).fit(  # rank 0: 3 batches of 2, rank 1: 2
            DataLoader(
                TensorDataset(torch.zeros(6 - 2 * rank, 2), torch.zeros(6 - 2 * rank, 2)), 2
            ),
            config=DistributedTrainingConfig(epochs=1, batch_size=2, verbose=False),
        ),
        "metric_names": lambda: rd.reduce_metrics(
            {"loss": 1.0} if rank == 0 else {"loss": 1.0, "acc": 0.5}
        ),
        "dataset_length": lambda: rp.check_consistent(
            {"dataset_length": 1797 if rank == 0 else 1796}
        ),
        "model_shapes": lambda: rp.wrap_model(
            nn.Linear(4, 4 if rank == 0 else 3), rp.DDPConfig(broadcast_parameters=False)
        ),
    }
    return run_cases(cases)


# -- the trainer's consistency checks and named stalls (on real ranks; two runs for all) --------


def _train_error(case: str) -> BaseException:
    kind, message = _train_errors()[case]
    return type(kind, (Exception,), {})(message)


@functools.cache
def _train_errors() -> dict[str, tuple[str, str]]:
    errors = dict(run_distributed(_train_cases, 2, timeout=120)[0])
    # Long enough that a rank started late on a loaded machine cannot trip an earlier collective.
    short = {"DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": "10000"}
    errors["timeout"] = run_distributed(_train_stall, 2, timeout=120, env=short)[0]
    return errors


def _train_fit(hidden: int = 8, seed: int = 42, hook: Any = None, every: int | None = None) -> Any:
    from rankwise.train import DistributedTrainingConfig

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 3))
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters()))
    trainer.on_batch = hook
    cfg = DistributedTrainingConfig(
        epochs=1, batch_size=4, verbose=False, checkpoint_dir=None, seed=seed,
        check_sync_every_n_steps=every,
    )  # fmt: skip
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
    return trainer.fit(x, (x[:, 0] > 0).long(), cfg)


def _move_rank1(trainer: Any, epoch: int, step: int, ids: Any) -> None:
    if rd.get_rank() == 1 and step == 1:
        with torch.no_grad():
            trainer.module[2].bias.add_(1.0)


def _stall_rank1(trainer: Any, epoch: int, step: int, ids: Any) -> None:
    if rd.get_rank() == 1 and step == 1:  # stalls until rank 0 has its timeout error
        store = torch.distributed.distributed_c10d._get_default_store()
        store.wait(["test/reported"], timedelta(seconds=100))
        raise RuntimeError("rank 1 stalled on purpose")


def _train_cases() -> dict[str, tuple[str, str]]:
    odd = rd.get_rank() == 1
    cases: dict[str, Callable[[], object]] = {
        "config": lambda: _train_fit(seed=7 if odd else 42),
        "model": lambda: _train_fit(hidden=6 if odd else 8),
        "out_of_sync": lambda: _train_fit(hook=_move_rank1, every=2),
    }
    return run_cases(cases)


def _train_stall() -> tuple[str, str]:
    try:
        _train_fit(hook=_stall_rank1)
    except Exception as exc:
        if rd.get_rank() == 0:
            torch.distributed.distributed_c10d._get_default_store().set("test/reported", "1")
        return type(exc).__name__, str(exc)
    return "NoError", "no error"


def _member_from_environment(**variables: str) -> BaseException:
    launched = {"RANKWISE_ON_FAILURE": "continue", "RANKWISE_SLOT": "0", "WORLD_SIZE": "2"}
    return raised(MemberConfig.from_environment, {**launched, "MASTER_PORT": "29500", **variables})


def _membership_store_gone() -> BaseException:
    cfg = MemberConfig(slot=1, world_size=2, host="127.0.0.1", port=free_port())
    return raised(Membership, cfg, timeout_s=1)


TRIGGERS: dict[str, Callable[[], BaseException]] = {
    "env-not-integer": lambda: _from_environment(RANK="one", WORLD_SIZE="2"),
    "env-rank-without-world": lambda: _from_environment(RANK="1"),
    "env-world-without-rank": lambda: _from_environment(WORLD_SIZE="2"),
    "slurm-no-master-addr": lambda: _from_environment(**_SLURM),
    "slurm-nodelist": lambda: _from_environment(**_SLURM, SLURM_JOB_NODELIST="node[1-2"),
    "launcher-variable-missing": lambda: _from_environment(TORCHELASTIC_RUN_ID="1", RANK="0"),
    "mpi-no-local-rank": lambda: _from_environment(
        OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="4"
    ),
    "mpi-no-master-addr": lambda: _from_environment(
        OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_LOCAL_RANK="0"
    ),
    "local-rank-across-machines": lambda: _from_environment(
        RANK="0", WORLD_SIZE="2", MASTER_ADDR="10.9.9.9"
    ),
    "rank-beyond-world": lambda: raised(DistributedConfig, rank=4, world_size=4),
    "port-range": lambda: raised(DistributedConfig, master_port=70000),
    "backend-unknown": lambda: raised(DistributedConfig, backend="mpi"),
    "continue-without-launcher": lambda: raised(
        on_failure_mode, {"RANKWISE_ON_FAILURE": "continue", "TORCHELASTIC_RUN_ID": "x"}
    ),
    "continue-mode-value": lambda: raised(on_failure_mode, {"RANKWISE_ON_FAILURE": "sometimes"}),
    "continue-variable-owned": lambda: raised(check_variables, {"RANKWISE_SLOT": "1"}),
    "continue-variable": lambda: _member_from_environment(RANKWISE_STALE_S="0"),
    "continue-variable-not-number": lambda: _member_from_environment(RANKWISE_STALE_S="soon"),
    "continue-variable-missing": lambda: _member_from_environment(WORLD_SIZE=""),
    "continue-min-nproc": lambda: raised(check_min_nproc, [0, 1], 3),
    "continue-uneven-split": lambda: raised(check_split, 8, 5, 2, "left"),
    "continue-fsdp": lambda: raised(
        DistributedTrainingConfig(strategy="fsdp").check_combinations, continue_mode=True
    ),
    "continue-store-gone": _membership_store_gone,
    "timeout-ms": lambda: raised(DistributedConfig, timeout_ms=0),
    "launch-nproc": lambda: _launch(nproc="two"),
    "launch-nnodes": lambda: _launch(nnodes="3:2"),
    "launch-script-missing": lambda: _launch(script="no_such_train.py"),
    "port-in-use": _port_in_use,
    "peer-timeout": _peer_never_arrives,
    "master-unreachable": _master_unreachable,
    "reinit-other-world": _reinit,
    "metric-names-differ": lambda: _on_ranks("metric_names"),
    "allreduce-mean-int": lambda: raised(rd.all_reduce, torch.ones(1, dtype=torch.int64), "mean"),
    "sampler-state-other-dataset": _sampler_state_other_dataset,
    "sampler-state-missing-key": _sampler_state_missing_key,
    "sampler-rank": lambda: raised(rdata.DistributedSampler, 10, num_replicas=2, rank=2),
    "sampler-state-version": _sampler_state_version,
    "splitter-world-size": lambda: raised(rdata.DistributedRangeSplitter, 23, 0),
    "splitter-sample-id": lambda: raised(
        rdata.DistributedRangeSplitter(23, 4).get_rank_for_sample, 23
    ),
    "fetch-drop-last-empty": _drop_last_empty,
    "block-size": lambda: raised(rdata.BlockShuffling, block_size=0),
    "augment-range": lambda: raised(ra.AugmentationConfig, scale_range=(1.2, 0.8)),
    "augment-preset": lambda: raised(ra.get_preset, "heavy"),
    "ddp-compression": lambda: raised(rp.DDPConfig, compression="int8"),
    "ddp-shapes-differ": lambda: _on_ranks("model_shapes"),
    "already-wrapped": _already_wrapped,
    "precision-mode": lambda: raised(rp.Precision, "fp8"),
    "accumulation-steps": lambda: raised(rp.is_sync_step, 0, accumulation_steps=0),
    "sync-check-empty": lambda: raised(rp.check_parameters_in_sync, nn.ReLU()),
    "config-int": lambda: raised(DistributedTrainingConfig, epochs=0),
    "config-choice": lambda: raised(DistributedTrainingConfig, precision="fp8"),
    "config-unknown-field": lambda: raised(DistributedTrainingConfig.from_dict, {"epoch": 3}),
    "config-override": lambda: raised(DistributedTrainingConfig().with_overrides, ["epochs"]),
    "config-lr-scaling": lambda: raised(DistributedTrainingConfig, lr_scaling="linear"),
    "config-fsdp-per-rank": lambda: raised(
        DistributedTrainingConfig, strategy="fsdp", save_on_master_only=False
    ),
    "config-compile-options": lambda: raised(
        DistributedTrainingConfig, compile=True, compile_options={"mdoe": "max-autotune"}
    ),
    "config-compile-mode-and-options": lambda: raised(
        DistributedTrainingConfig,
        compile=True,
        compile_options={"mode": "max-autotune", "options": {"shape_padding": True}},
    ),
    "config-prefetch-without-workers": lambda: raised(DistributedTrainingConfig, prefetch_factor=4),
    "checkpoint-torn": lambda: _damaged_checkpoint("torn"),
    "checkpoint-corrupt": lambda: _damaged_checkpoint("flip"),
    "checkpoint-no-manifest": lambda: _damaged_checkpoint("manifest"),
    "checkpoint-folder-no-manifest": lambda: _damaged_folder("manifest"),
    "checkpoint-shard-missing": lambda: _damaged_folder("shard"),
    "checkpoint-format": _checkpoint_format,
    "resume-missing-file": _resume_missing_file,
    "resume-global-batch": _global_batch_changed,
    "train-uneven-batches": lambda: _on_ranks("uneven_batches"),
    "consistency-dataset-length": lambda: _on_ranks("dataset_length"),
    "train-config-differs": lambda: _train_error("config"),
    "train-model-differs": lambda: _train_error("model"),
    "train-parameters-out-of-sync": lambda: _train_error("out_of_sync"),
    "train-collective-timeout": lambda: _train_error("timeout"),
}


# -- the table ---------------------------------------------------------------------------------


def test_every_row_has_a_trigger_and_every_trigger_a_row() -> None:
    documented = rows()
    assert len(documented) >= 20
    everywhere = [
        *TRIGGERS,
        *TRAIN_TRIGGERS,
        *DATA_TRIGGERS,
        *PARALLEL_TRIGGERS,
        *DISTRIBUTED_TRIGGERS,
        *AUGMENT_TRIGGERS,
        *MODELS_TRIGGERS,
        *COMPAT_TRIGGERS,
        *CONTINUE_TRIGGERS,
        *STORAGE_TRIGGERS,
        *TRUST_TRIGGERS,
    ]
    assert len(everywhere) == len(set(everywhere)), "a row id with two triggers"
    assert sorted(documented) == sorted(everywhere)


@pytest.mark.parametrize(
    ("row_id", "flags"),
    [
        ("launch-nproc", ["--nproc-per-node=two", "train.py"]),
        ("launch-nnodes", ["--nnodes=3:2", "train.py"]),
        ("launch-script-missing", ["--nproc-per-node=2", "no_such_train.py"]),
    ],
)
def test_launch_refuses_bad_flags_before_starting(row_id: str, flags: list[str]) -> None:
    """The launch rows' errors reach the user as argparse's do: one line, exit 2, no rank."""
    proc = run_isolated(
        [sys.executable, "-m", "rankwise.cli", "launch", *flags], env=child_env(), timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    _, message = rows()[row_id]
    assert proc.stderr.strip() == f"rankwise launch: error: {message}"


@pytest.mark.parametrize("row_id", sorted(TRIGGERS))
def test_documented_message_is_the_oneraised(row_id: str) -> None:
    check_row(row_id, TRIGGERS[row_id])
