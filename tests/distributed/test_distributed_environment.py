"""Who this process is, per launcher: pure tables (no processes), plus one real SLURM-style run."""

from __future__ import annotations

import os

import pytest
import torch

import rankwise.distributed as rd
from rankwise.distributed import DistributedConfig, DistributedConfigError
from rankwise.distributed.environment import (
    detect,
    expand_nodelist,
    is_this_host,
    slurm_master_port,
)
from rankwise.distributed.rendezvous import port_is_free
from rankwise.testing import run_distributed

HERE = ("trainbox", "10.1.1.5")  # this machine's names, so detection stays pure

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "job1", "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29400",
}  # fmt: skip
SLURM = {
    "SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_NODEID": "1",
    "SLURM_JOB_NODELIST": "gpu-[07-08]", "SLURM_JOB_ID": "31337", "SLURM_STEP_ID": "0",
}  # fmt: skip
# The shell of an allocation (sbatch's batch script, salloc's shell): no job step, so no task.
SLURM_SHELL = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_ID"}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "n0",
}  # fmt: skip
MPICH = {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3"}

# (environment, kind, rank, world, local rank, master addr, master port)
CASES = [
    ({}, "none", 0, 1, None, None, None),
    (TORCHRUN, "torchelastic", 5, 8, 1, "node0", 29400),
    (SLURM, "slurm", 6, 8, 2, "gpu-07", 15000 + 31337 % 15000),
    ({**SLURM, "MASTER_ADDR": "head", "MASTER_PORT": "29999"}, "slurm", 6, 8, 2, "head", 29999),
    (OPENMPI, "openmpi", 3, 4, 1, "n0", None),
    (MPICH, "mpich", 2, 3, 2, "127.0.0.1", None),  # all ranks on one machine
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}, "mpich", 1, 2, 1, "127.0.0.1", None),
    ({"RANK": "1", "WORLD_SIZE": "2"}, "plain", 1, 2, 1, None, None),  # one machine: local = rank
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}, "plain", 1, 2, 1, "127.0.0.1", None),
    ({"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "trainbox"}, "plain", 3, 4, 3, "trainbox", None),
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "n0"}, "plain", 3, 4, 0, "n0", None),
    ({"WORLD_SIZE": "1"}, "plain", 0, 1, None, None, None),  # a launcher's world of one
    # Precedence: torchrun's variables win over the allocation's SLURM / MPI ones ...
    ({**SLURM, **OPENMPI, **TORCHRUN}, "torchelastic", 5, 8, 1, "node0", 29400),
    # ... plain RANK / WORLD_SIZE win over SLURM and MPI ...
    ({**SLURM, "RANK": "0", "WORLD_SIZE": "1"}, "plain", 0, 1, None, None, None),
    # ... and SLURM over MPI (srun of an MPI-built program).
    ({**OPENMPI, **SLURM}, "slurm", 6, 8, 2, "n0", 15000 + 31337 % 15000),
    # srun inside salloc: the tasks inherit salloc's job name, and still are tasks.
    ({**SLURM, "SLURM_JOB_NAME": "interactive"}, "slurm", 6, 8, 2, "gpu-07", 15000 + 31337 % 15000),
    ({**SLURM, "SLURM_JOB_NAME": "bash"}, "slurm", 6, 8, 2, "gpu-07", 15000 + 31337 % 15000),
    ({**SLURM, "SLURM_JOB_NAME": "train"}, "slurm", 6, 8, 2, "gpu-07", 15000 + 31337 % 15000),
    # A one-task allocation's shell (whatever its job name) is a world of one, silently.
    ({**SLURM_SHELL, "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, "none", 0, 1, None, None, None),
    ({**SLURM_SHELL, "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "interactive"}, "none", 0, 1, None, None, None),
]  # fmt: skip


@pytest.mark.parametrize(
    "env",
    [
        SLURM_SHELL,  # sbatch --ntasks=8 running `python train.py` without srun
        {**SLURM_SHELL, "SLURM_JOB_NAME": "interactive"},  # salloc -n 8, then python by hand
        {**SLURM_SHELL, "SLURM_JOB_NAME": "train"},  # a named job's shell is no task either
    ],
)
def test_an_allocation_shell_with_several_tasks_warns_it_runs_alone(env: dict[str, str]) -> None:
    with pytest.warns(UserWarning, match=r"SLURM_NTASKS=8 .*SLURM_STEP_ID is unset.*srun"):
        found = detect(env, this_host=HERE)
    assert (found.kind, found.world_size) == ("none", 1)
    assert any("SLURM_NTASKS=8" in note for note in found.notes)  # `rankwise env` shows it


@pytest.mark.filterwarnings("error")  # none of the table's environments warns
@pytest.mark.parametrize(("env", "kind", "rank", "world", "local", "addr", "port"), CASES)
def test_detects_each_environment(
    env: dict[str, str],
    kind: str,
    rank: int,
    world: int,
    local: int | None,
    addr: str | None,
    port: int | None,
) -> None:
    found = detect(env, this_host=HERE)
    assert (found.kind, found.rank, found.world_size) == (kind, rank, world)
    assert (found.local_rank, found.master_addr, found.master_port) == (local, addr, port)
    assert found.launched == (kind != "none")
    assert all(var in env for var in found.decided_by)
    assert bool(found.decided_by) == found.launched


@pytest.mark.parametrize(
    ("env", "fragments"),
    [
        # Never guess the device index from a global rank that may be on another machine.
        ({"RANK": "5", "WORLD_SIZE": "8", "MASTER_ADDR": "node0"}, ["LOCAL_RANK", "MASTER_ADDR=node0"]),
        ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "MASTER_ADDR": "n0"},
         ["OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK"]),
        ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1"}, ["MASTER_ADDR", "mpirun -x"]),
        ({"TORCHELASTIC_RUN_ID": "j", "RANK": "0", "WORLD_SIZE": "2"}, ["LOCAL_RANK"]),
        ({**SLURM, "SLURM_JOB_NODELIST": "node[3-1]"}, ["SLURM_JOB_NODELIST='node[3-1]'", "MASTER_ADDR"]),
        ({k: v for k, v in SLURM.items() if k != "SLURM_JOB_ID"}, ["MASTER_PORT", "SLURM_JOB_ID"]),
        ({k: v for k, v in SLURM.items() if k != "SLURM_LOCALID"}, ["SLURM_LOCALID"]),
        ({**SLURM, "SLURM_NTASKS": "eight"}, ["SLURM_NTASKS='eight'", "not an integer"]),
        ({"RANK": "1"}, ["WORLD_SIZE is not"]),
    ],
)  # fmt: skip
def test_ambiguous_environments_name_the_variables_to_set(
    env: dict[str, str], fragments: list[str]
) -> None:
    with pytest.raises(DistributedConfigError) as err:
        detect(env, this_host=HERE)
    for fragment in fragments:
        assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[5-9,12]", ["node5", "node6", "node7", "node8", "node9", "node12"]),
        ("gpu-[01-03]", ["gpu-01", "gpu-02", "gpu-03"]),
        ("a1,b[2-3]", ["a1", "b2", "b3"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("x[3],y", ["x3", "y"]),
        ("localhost", ["localhost"]),
        ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
    ],
)
def test_slurm_nodelists(nodelist: str, hosts: list[str]) -> None:
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("bad", ["node[1-", "node]1[", "n[a-b]", "n[1-2", "", "n[[1]]"])
def test_malformed_nodelists_are_refused(bad: str) -> None:
    with pytest.raises(DistributedConfigError, match="SLURM_JOB_NODELIST"):
        expand_nodelist(bad)


def test_slurm_port_is_deterministic_and_unprivileged() -> None:
    ports = [slurm_master_port(str(job)) for job in range(1_000_000, 1_030_000, 7)]
    assert all(1024 < p < 32768 for p in ports)  # below Linux's ephemeral range
    assert slurm_master_port("1000000") == slurm_master_port("1000000")
    assert slurm_master_port("1000001") == slurm_master_port("1000000") + 1
    assert 15000 <= slurm_master_port("12345_7") < 30000  # non-numeric ids hash


def test_this_host() -> None:
    assert is_this_host("127.0.0.1", HERE) and is_this_host("::1", HERE)
    assert is_this_host("localhost", HERE) and is_this_host("TrainBox", HERE)
    assert not is_this_host("10.9.9.9", HERE)


def test_config_takes_the_detected_environment() -> None:
    cfg = DistributedConfig.from_environment({**SLURM, "DISTRIBUTED_BACKEND": "cpu"})
    assert (cfg.environment, cfg.rank, cfg.world_size, cfg.local_rank) == ("slurm", 6, 8, 2)
    assert (cfg.master_addr, cfg.master_port) == ("gpu-07", slurm_master_port("31337"))
    assert cfg.launched and not cfg.use_agent_store
    assert not DistributedConfig.from_environment({}).launched


# -- a real SLURM-style run: no torchrun, hand-set SLURM variables ------------------------------


def _join_as_slurm_task(job_id: str) -> tuple[str, int, int, int, float]:
    rank = os.environ["RANK"]  # from the harness: turn it into SLURM's variables
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(var, None)
    os.environ.update(
        SLURM_PROCID=rank, SLURM_NTASKS="2", SLURM_LOCALID=rank, SLURM_NODEID="0",
        SLURM_JOB_NODELIST="localhost", SLURM_JOB_ID=job_id, SLURM_STEP_ID="0",
        SLURM_JOB_NAME="interactive",  # `srun` inside `salloc`: the job name is salloc's
    )  # fmt: skip
    cfg = rd.init()
    total = rd.all_reduce(torch.tensor([float(rd.get_rank() + 1)])).item()
    return cfg.environment, cfg.master_port, rd.get_rank(), rd.get_local_rank(), total


def test_two_ranks_started_as_slurm_tasks() -> None:
    job_id = next(str(j) for j in range(424242, 424342) if port_is_free(slurm_master_port(str(j))))
    results = run_distributed(_join_as_slurm_task, 2, args=(job_id,), init_group=False)
    port = slurm_master_port(job_id)
    assert results == [("slurm", port, 0, 0, 3.0), ("slurm", port, 1, 1, 3.0)]
