"""DistributedConfig parsing and validation, and backend selection: pure, no processes."""

from __future__ import annotations

import pytest

import rankwise.distributed as rd
from rankwise.distributed import (
    BackendType,
    DistributedConfig,
    DistributedConfigError,
    select_backend,
)


def test_no_environment_is_a_world_of_one() -> None:
    cfg = DistributedConfig.from_environment({})
    assert (cfg.rank, cfg.world_size, cfg.resolved_local_rank) == (0, 1, 0)
    assert (cfg.master_addr, cfg.master_port, cfg.timeout_ms) == ("127.0.0.1", 29500, 30000)
    assert cfg.backend_name == "auto"


def test_reads_every_variable() -> None:
    cfg = DistributedConfig.from_environment(
        {
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "MASTER_ADDR": "10.0.0.7",
            "MASTER_PORT": "29611",
            "DISTRIBUTED_BACKEND": "cpu",
            "DISTRIBUTED_TIMEOUT_MS": "1500",
            "TORCHELASTIC_RUN_ID": "job",
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RESTART_COUNT": "2",
        }
    )
    assert (cfg.rank, cfg.world_size, cfg.local_rank) == (3, 4, 1)
    assert (cfg.master_addr, cfg.master_port, cfg.timeout_ms) == ("10.0.0.7", 29611, 1500)
    assert cfg.backend_name == "gloo"  # "cpu" is the CyxWiz name for gloo
    assert cfg.use_agent_store and cfg.restart_count == 2
    assert cfg.environment == "torchelastic" and cfg.launched


def test_collective_timeout_is_separate_and_defaults_to_torchs() -> None:
    assert DistributedConfig().collective_timeout_ms == 30 * 60 * 1000
    cfg = DistributedConfig.from_environment({"DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": "5000"})
    assert (cfg.timeout_ms, cfg.collective_timeout_ms) == (30000, 5000)


def test_local_rank_defaults_to_rank_on_one_machine() -> None:
    cfg = DistributedConfig.from_environment({"RANK": "2", "WORLD_SIZE": "3"})
    assert cfg.local_rank == 2 and cfg.resolved_local_rank == 2
    assert DistributedConfig(rank=1, world_size=2).resolved_local_rank == 1


@pytest.mark.parametrize(
    ("env", "fragments"),
    [
        ({"RANK": "4", "WORLD_SIZE": "4"}, ["rank (4) must be < world_size (4)", "RANK"]),
        ({"RANK": "-1", "WORLD_SIZE": "4"}, ["rank (-1) must be >= 0"]),
        ({"WORLD_SIZE": "two"}, ["WORLD_SIZE='two'", "not an integer"]),
        ({"WORLD_SIZE": "0"}, ["world_size (0) must be >= 1"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-3"}, ["local_rank (-3)"]),
        ({"MASTER_PORT": "70000"}, ["master_port (70000)", "1..65535", "MASTER_PORT"]),
        ({"MASTER_PORT": "0"}, ["master_port (0)"]),
        ({"MASTER_PORT": "29500x"}, ["MASTER_PORT='29500x'"]),
        ({"DISTRIBUTED_BACKEND": "mpi"}, ["'mpi'", "'gloo'", "'nccl'"]),
        ({"DISTRIBUTED_TIMEOUT_MS": "0"}, ["timeout_ms (0) must be > 0"]),
        ({"RANK": "1"}, ["WORLD_SIZE is not"]),
        ({"WORLD_SIZE": "2"}, ["WORLD_SIZE is set (2) but RANK is not"]),
        ({"DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": "-5"}, ["collective_timeout_ms (-5) must be > 0"]),
    ],
)
def test_bad_environment_names_variable_value_and_fix(
    env: dict[str, str], fragments: list[str]
) -> None:
    with pytest.raises(DistributedConfigError) as err:
        DistributedConfig.from_environment(env)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_config_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match=r"rank \(2\) must be < world_size \(2\)"):
        DistributedConfig(rank=2, world_size=2)


@pytest.mark.parametrize("value", [True, 1.5, "1"])
def test_non_integer_fields_rejected(value: object) -> None:
    with pytest.raises(DistributedConfigError, match="must be an integer"):
        DistributedConfig(rank=value)  # type: ignore[arg-type]


def test_attribute_style_config_is_validated_by_init() -> None:
    # The CyxWiz guide sets attributes after construction; init() must still catch mistakes.
    cfg = DistributedConfig()
    cfg.rank = 4
    cfg.world_size = 4
    with pytest.raises(DistributedConfigError, match=r"rank \(4\) must be < world_size \(4\)"):
        rd.init(cfg)
    assert not rd.is_initialized()


def test_backend_enum_and_aliases() -> None:
    assert DistributedConfig(backend=BackendType.CPU).backend_name == "gloo"
    assert DistributedConfig(backend="NCCL").backend_name == "nccl"
    assert rd.normalize_backend(BackendType.AUTO) == "auto"


class TestSelectBackend:
    def test_auto_prefers_nccl_with_gpus(self) -> None:
        both = "cpu:gloo,cuda:nccl"  # CPU tensors (metrics) still reduce, over gloo
        assert select_backend("auto", 0, cuda_devices=2, nccl_available=True) == both
        assert select_backend("auto", 0, cuda_devices=0, nccl_available=True) == "gloo"
        assert select_backend("auto", 0, cuda_devices=2, nccl_available=False) == "gloo"
        assert select_backend("gloo", 5, cuda_devices=2, nccl_available=True) == "gloo"

    def test_nccl_without_gpus_names_the_fix(self) -> None:
        with pytest.raises(DistributedConfigError, match="DISTRIBUTED_BACKEND=gloo") as err:
            select_backend("nccl", 0, cuda_devices=0, nccl_available=False)
        assert "no CUDA devices" in str(err.value)

    def test_local_rank_beyond_devices(self) -> None:
        with pytest.raises(DistributedConfigError) as err:
            select_backend("nccl", 2, cuda_devices=2, nccl_available=True)
        message = str(err.value)
        assert "local_rank (2)" in message and "LOCAL_RANK must be < 2" in message
        assert "CUDA_VISIBLE_DEVICES" in message

    def test_missing_gloo(self) -> None:
        with pytest.raises(DistributedConfigError, match="no gloo"):
            select_backend("gloo", 0, cuda_devices=0, nccl_available=False, gloo_available=False)


def test_init_refuses_nccl_on_this_machine_when_it_has_no_gpu() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA devices")
    with pytest.raises(DistributedConfigError, match="backend 'nccl' needs CUDA"):
        rd.init(DistributedConfig(backend="nccl"))
