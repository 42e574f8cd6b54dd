"""Process group life cycle and collectives: a world of one in-process, 2 and 3 real gloo ranks."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import torch

import rankwise.distributed as rd
from rankwise.distributed import (
    DistributedConfig,
    DistributedConfigError,
    DistributedStateError,
    DistributedTimeoutError,
)
from rankwise.testing import RankFailedError, free_port, run_distributed

# -- world of one (no process group) ----------------------------------------------------------


def test_world_of_one_without_environment() -> None:
    cfg = rd.init()
    assert cfg.world_size == 1
    assert rd.is_initialized() and rd.is_master()
    assert (rd.get_rank(), rd.get_world_size(), rd.get_local_rank()) == (0, 1, 0)
    assert not torch.distributed.is_initialized()  # no group, no sockets
    assert rd.get_backend() in {"gloo", "nccl"}
    rd.barrier()
    rd.init()  # same world again: a no-op
    rd.finalize()
    assert not rd.is_initialized()
    rd.finalize()  # twice is fine


def test_collectives_are_identities_in_a_world_of_one() -> None:
    for op in ["sum", "mean", "max", "min", "product"]:
        t = torch.tensor([1.5, -2.0])
        assert rd.all_reduce(t, op=op) is t and t.tolist() == [1.5, -2.0]
    out = [torch.zeros(2)]
    rd.all_gather(out, torch.tensor([3.0, 4.0]))
    assert out[0].tolist() == [3.0, 4.0]
    assert rd.broadcast(torch.tensor([7.0])).item() == 7.0
    target = torch.zeros(1)
    rd.scatter(target, [torch.tensor([9.0])])
    assert target.item() == 9.0
    assert rd.reduce_metrics({"loss": 0.25, "acc": 0.5}, weight=10) == {"loss": 0.25, "acc": 0.5}


def test_collective_argument_errors() -> None:
    with pytest.raises(ValueError, match="op 'avg' is not supported"):
        rd.all_reduce(torch.ones(1), op="avg")
    with pytest.raises(ValueError, match="needs a floating-point tensor"):
        rd.all_reduce(torch.ones(1, dtype=torch.int64), op="mean")
    with pytest.raises(ValueError, match="one output tensor per rank: got 2 for a world of 1"):
        rd.all_gather([torch.zeros(1), torch.zeros(1)], torch.ones(1))
    with pytest.raises(ValueError, match=r"src \(1\) must be a rank in 0..0"):
        rd.broadcast(torch.ones(1), src=1)
    with pytest.raises(ValueError, match="needs scatter_list"):
        rd.scatter(torch.zeros(1), None)
    with pytest.raises(ValueError, match="weight"):
        rd.reduce_metrics({"a": 1.0}, weight=-1)


def test_reinit_with_another_world_is_an_error() -> None:
    rd.init()
    with pytest.raises(DistributedStateError, match="finalize"):
        rd.init(DistributedConfig(rank=0, world_size=2))


def test_port_in_use_fails_before_waiting() -> None:
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(DistributedConfigError) as err:
            rd.init(DistributedConfig(rank=0, world_size=2, master_port=port, timeout_ms=120000))
        took = time.monotonic() - started
    # Reported at once, not after the 120 s timeout (a loaded CI machine once took 10 s here).
    assert took < 60, f"{took:.1f} s: {err.value}"
    assert f"master_port ({port}) is already in use" in str(err.value)
    assert "MASTER_PORT" in str(err.value)


# -- real ranks -------------------------------------------------------------------------------


def _collectives_on_every_rank() -> dict[str, object]:
    rank, world = rd.get_rank(), rd.get_world_size()
    out: dict[str, object] = {"rank": rank, "world": world, "local": rd.get_local_rank()}
    value = float(rank + 1)
    for op in ["sum", "mean", "max", "min", "product"]:
        out[op] = rd.all_reduce(torch.tensor([value]), op=op).item()
    gathered = [torch.zeros(2) for _ in range(world)]
    rd.all_gather(gathered, torch.tensor([rank, rank * 10.0]))
    out["gather"] = [t.tolist() for t in gathered]
    src = world - 1
    out["broadcast"] = rd.broadcast(torch.tensor([float(rank)]), src=src).item()
    received = torch.zeros(1)
    pieces = [torch.tensor([100.0 + r]) for r in range(world)] if rank == 0 else None
    out["scatter"] = rd.scatter(received, pieces, src=0).item()
    out["plain"] = rd.broadcast_plain({"run": "a\x00\xff"} if rank == src else None, src=src)
    # rank r reports value r with weight r+1: the exact mean is sum(r*(r+1)) / sum(r+1)
    out["metrics"] = rd.reduce_metrics({"v": float(rank), "c": 1.0}, weight=rank + 1)
    rd.barrier()
    out["master"] = rd.is_master()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_collectives_on_real_ranks(world: int) -> None:
    results = run_distributed(_collectives_on_every_rank, world, timeout=60)
    values = [r + 1.0 for r in range(world)]
    weights = [r + 1 for r in range(world)]
    for rank, res in enumerate(results):
        assert (res["rank"], res["world"], res["local"]) == (rank, world, rank)
        assert res["sum"] == sum(values)
        assert res["mean"] == pytest.approx(sum(values) / world)
        assert (res["max"], res["min"]) == (max(values), min(values))
        assert res["product"] == pytest.approx(torch.tensor(values).prod().item())
        assert res["gather"] == [[r, r * 10.0] for r in range(world)]
        assert res["broadcast"] == world - 1
        assert res["scatter"] == 100.0 + rank
        assert res["plain"] == {"run": "a\x00\xff"}
        expected = sum(r * w for r, w in zip(range(world), weights, strict=True)) / sum(weights)
        assert res["metrics"] == pytest.approx({"v": expected, "c": 1.0})
        assert res["master"] == (rank == 0)


def _mismatched_metric_names() -> str:
    keys = {"loss": 1.0} if rd.get_rank() == 0 else {"loss": 1.0, "acc": 0.5}
    try:
        rd.reduce_metrics(keys)
    except ValueError as exc:
        return str(exc)
    return "no error"


def _renamed_metric() -> str:
    keys = {"loss": 1.0} if rd.get_rank() == 0 else {"lost": 1.0}
    try:
        rd.reduce_metrics(keys)
    except ValueError as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize("fn", [_mismatched_metric_names, _renamed_metric])
def test_reduce_metrics_key_mismatch_raises_on_every_rank(fn: object) -> None:
    messages = run_distributed(fn, 2, timeout=60)  # type: ignore[arg-type]
    assert all("different metric names" in m for m in messages), messages


def _lonely_rank(world: int, rank: int, port: int) -> tuple[str, str, float]:
    cfg = DistributedConfig(rank=rank, world_size=world, master_port=port, timeout_ms=1500)
    started = time.monotonic()
    try:
        rd.init(cfg)
    except DistributedTimeoutError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - started
    return "joined", "", time.monotonic() - started


def test_missing_peer_times_out_naming_arrivals() -> None:
    # Rank 0 of 3 starts alone: it must give up after ~timeout_ms, saying who is missing.
    [(kind, message, elapsed)] = run_distributed(
        _lonely_rank, 1, args=(3, 0, free_port()), init_group=False, timeout=60
    )
    assert kind == "DistributedTimeoutError"
    assert "1 of 3 ranks arrived" in message and "missing ranks: [1, 2]" in message
    assert "DISTRIBUTED_TIMEOUT_MS" in message
    assert elapsed < 15  # ~1.5 s timeout; generous bound for a loaded CI machine


def test_worker_without_master_times_out() -> None:
    [(kind, message, _)] = run_distributed(
        _lonely_rank, 1, args=(2, 1, free_port()), init_group=False, timeout=90
    )
    assert kind == "DistributedTimeoutError"
    assert "connecting to the master" in message and "Start rank 0" in message


def _raise_on_rank_one() -> None:
    if rd.get_rank() == 1:
        raise KeyError("rank one broke")
    # Rank 0 fails too, in the barrier, once rank 1 is gone: let the harness read rank 1's
    # report first, or it may take rank 0's for the first failure on a loaded machine.
    time.sleep(1.0)
    rd.barrier()


def test_harness_reports_the_failing_rank() -> None:
    with pytest.raises(RankFailedError, match="rank 1 of 2 failed") as err:
        run_distributed(_raise_on_rank_one, 2, timeout=60, timeout_ms=3000)
    assert "rank one broke" in str(err.value)


def _sleep_forever() -> None:
    time.sleep(600)


def test_harness_times_out_naming_ranks() -> None:
    with pytest.raises(TimeoutError, match=r"ranks \[0, 1\] of 2 did not finish"):
        run_distributed(_sleep_forever, 2, timeout=3)


def _empty_rank_reports_nan() -> dict[str, float]:
    # rank 1 saw no samples: its mean is NaN, its weight 0
    if rd.get_rank() == 0:
        return rd.reduce_metrics({"loss": 2.0}, weight=4)
    return rd.reduce_metrics({"loss": torch.tensor([]).mean()}, weight=0)


def _all_weights_zero() -> str:
    try:
        rd.reduce_metrics({"loss": 1.0}, weight=0)
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_reduce_metrics_with_an_empty_rank() -> None:
    assert run_distributed(_empty_rank_reports_nan, 2) == [{"loss": 2.0}, {"loss": 2.0}]
    assert all("weights sum to 0" in m for m in run_distributed(_all_weights_zero, 2))
    with pytest.raises(ValueError, match="finite"):
        rd.reduce_metrics({"a": 1.0}, weight=float("nan"))


def _slow_rank_zero() -> float:
    # The rendezvous timeout (timeout_ms) must not bound collectives: rank 0 works for longer
    # than it before the all_reduce, as it would while saving a checkpoint.
    if rd.get_rank() == 0:
        time.sleep(2.5)
    return rd.all_reduce(torch.ones(1)).item()


def test_collectives_may_outlast_the_rendezvous_timeout() -> None:
    assert run_distributed(_slow_rank_zero, 2, timeout_ms=1000, timeout=60) == [2.0, 2.0]


def _reinit_after_torch_destroyed_the_group() -> float:
    import torch.distributed as dist

    dist.destroy_process_group()  # behind rankwise's back
    cfg = rd.init()  # must build a new group, not return the stale session
    assert cfg.world_size == 2 and dist.is_initialized()
    return rd.all_reduce(torch.tensor([rd.get_rank() + 1.0])).item()


def test_init_after_an_outside_destroy_rebuilds_the_group() -> None:
    assert run_distributed(_reinit_after_torch_destroyed_the_group, 2) == [3.0, 3.0]


def _reinit_while_rank_zero_still_holds_the_old_store() -> list[float]:
    # Rank 1 re-initialises at once and dials rank 0's port while rank 0's previous store is
    # still up: it must not take that store's finished rendezvous for the new one.
    sums = []
    for _ in range(3):
        if rd.get_rank() == 0:
            time.sleep(0.5)
        rd.finalize()
        rd.init()
        sums.append(rd.all_reduce(torch.tensor([rd.get_rank() + 1.0])).item())
    return sums


def test_reinit_on_the_same_port_never_reuses_the_old_store() -> None:
    assert (
        run_distributed(_reinit_while_rank_zero_still_holds_the_old_store, 2, timeout=60)
        == [[3.0] * 3] * 2
    )


def _init_returns_after_the_slowest_group(delay: float) -> tuple[float, float]:
    # The last rank takes ``delay`` longer to come out of building its group (a real group,
    # built by torch; only its return is delayed). init() must return on no rank before that:
    # a rank that left early (an exit, finalize()) would close the store or a gloo pair under
    # a peer still building ("Connection reset by peer").
    import os

    import torch.distributed as dist

    built = time.monotonic()
    if os.environ["RANK"] == "2":  # before init(), get_rank() knows no better than 0
        build = dist.init_process_group

        def slow_to_return(*args: object, **kwargs: object) -> None:
            nonlocal built
            build(*args, **kwargs)  # type: ignore[arg-type]
            time.sleep(delay)
            built = time.monotonic()

        dist.init_process_group = slow_to_return  # type: ignore[assignment]
    rd.init()
    return built, time.monotonic()  # CLOCK_MONOTONIC: one clock for every process here


def test_init_returns_only_when_every_rank_has_built_its_group() -> None:
    results = run_distributed(
        _init_returns_after_the_slowest_group, 3, args=(1.0,), init_group=False, timeout=60
    )
    slowest_built = results[2][0]
    assert all(returned >= slowest_built for _, returned in results), results


def test_a_launchers_world_of_one_gets_a_real_group(monkeypatch: pytest.MonkeyPatch) -> None:
    # WORLD_SIZE=1 set by a launcher (torchrun --nproc-per-node 1): the script's own
    # torch.distributed calls must work. Only a bare `python train.py` runs without a group.
    import torch.distributed as dist

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_PORT", "1")  # never used: a world of one opens no port
    cfg = rd.init()
    assert cfg.launched and cfg.world_size == 1 and dist.is_initialized()
    t = torch.tensor([2.0])
    dist.all_reduce(t)
    assert t.item() == 2.0 and dist.get_world_size() == 1
    rd.finalize()
    assert not dist.is_initialized()


def _rank_zero_dies_while_the_group_is_built(report: str) -> None:
    import os

    import torch.distributed as dist

    if os.environ["RANK"] == "0":
        build = dist.init_process_group

        def build_then_die(*args: object, **kwargs: object) -> None:
            build(*args, **kwargs)  # type: ignore[arg-type]
            os._exit(3)  # the store's host crashes with its group built, before init() returns

        dist.init_process_group = build_then_die  # type: ignore[assignment]
    try:
        rd.init()
        outcome = "joined"
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    with open(report, "w") as f:
        f.write(outcome)


def test_a_store_host_crash_mid_init_is_a_rankwise_error(tmp_path: Path) -> None:
    # Rank 1 must get a rankwise error naming rank 0, not torch's raw DistNetworkError.
    report = tmp_path / "rank1.txt"
    with pytest.raises(RankFailedError, match="rank 0 of 2 failed"):
        run_distributed(
            _rank_zero_dies_while_the_group_is_built, 2, args=(str(report),), init_group=False
        )
    outcome = report.read_text()
    assert outcome.startswith("DistributedConnectionError"), outcome
    assert "rank 0, which hosts it" in outcome and "rank 0's log" in outcome
