"""The CyxWiz guide on rankwise: ``import rankwise.compat.cyxwiz as cx`` gives the guide's
names, and every example of the guide runs from examples/seeds/cyxwiz/ as the guide launches
it: ``launch_distributed.sh 2 python ...`` (scripts/, over ``rankwise launch``) or by hand with
``RANK=.. WORLD_SIZE=.. python ...``, in a fresh folder (the examples write files there).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import helpers.seed_ports as seed_ports
import rankwise.compat.cyxwiz as cx
import rankwise.distributed as rd
import rankwise.parallel as rp
import rankwise.train as rt
from helpers.paths import REPO
from helpers.seed_ports import NUM
from rankwise.data import DistributedBatchIterator
from rankwise.testing import child_env, free_port, run_by_hand, run_distributed, run_isolated

ROOT = REPO
CX = ROOT / "examples" / "seeds" / "cyxwiz"
LAUNCHER = ROOT / "scripts" / "launch_distributed.sh"
GUIDE = "cyxwiz-distributed-guide.md"
IMPORT_GUIDE, IMPORT = "import pycyxwiz as cx", "import rankwise.compat.cyxwiz as cx"
QUERIES = ("is_initialized", "get_rank", "get_world_size", "get_local_rank", "is_master")


def launch_sh(nproc: int, *cmd: str, cwd: Path) -> str:
    """``scripts/launch_distributed.sh N cmd...`` in ``cwd``; its stdout (it must succeed)."""
    proc = run_isolated(
        [str(LAUNCHER), str(nproc), *cmd],
        cwd=cwd,
        env=child_env({"PYTHON": sys.executable}),
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def manual_launch(script: str, world: int, cwd: Path) -> list[str]:
    """The guide's manual launch: ``RANK=r WORLD_SIZE=N ... python script &`` per rank."""
    procs = run_by_hand([sys.executable, str(CX / script)], world, cwd=cwd, timeout=200)
    for proc in procs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return [proc.stdout for proc in procs]


# ------------------------------------------------------------------------------- the names


def test_names_are_the_core_objects() -> None:
    d = cx.distributed
    assert (d.init, d.finalize, d.is_initialized) == (rd.init, rd.finalize, rd.is_initialized)
    assert (d.get_rank, d.get_world_size, d.get_local_rank, d.is_master) == (
        rd.get_rank,
        rd.get_world_size,
        rd.get_local_rank,
        rd.is_master,
    )
    assert d.DistributedConfig is rd.DistributedConfig and d.BackendType is rd.BackendType
    assert d.DDPConfig is rp.DDPConfig and issubclass(d.DistributedDataParallel, rp.ExplicitDDP)
    assert d.DistributedTrainingConfig is rt.DistributedTrainingConfig
    assert d.DistributedTrainingHistory is rt.DistributedTrainingHistory
    assert issubclass(d.DistributedTrainer, rt.DistributedTrainer)
    assert d.DistributedSampler is cx.DistributedSampler
    assert d.DistributedBatchIterator is cx.DistributedBatchIterator is DistributedBatchIterator
    assert cx.LinearModule is nn.Linear and cx.ReLUModule is nn.ReLU
    assert rd.DistributedConfig(backend=d.BackendType.CPU).backend_name == "gloo"


def test_sequential_model_add_save_load(tmp_path: Path) -> None:
    model = cx.SequentialModel()
    assert model.add(cx.LinearModule(4, 3)).add(cx.ReLUModule()) is model
    model.save(tmp_path / "m.cyxmodel")
    other = cx.SequentialModel().add(cx.LinearModule(4, 3)).add(cx.ReLUModule())
    assert not torch.equal(other[0].weight, model[0].weight)
    other.load(tmp_path / "m.cyxmodel")
    assert torch.equal(other[0].weight, model[0].weight)
    with pytest.raises(TypeError, match=r"takes a module such as cx.LinearModule"):
        model.add("relu")  # type: ignore[arg-type]


def test_cross_entropy_backward_is_the_gradient_of_the_loss_it_is_given() -> None:
    loss_fn = cx.CrossEntropyLoss()
    out = torch.randn(4, 3, requires_grad=True)
    target = torch.tensor([0, 2, 1, 0])
    loss = loss_fn.forward(out, target) / 4
    expected = torch.autograd.grad(nn.functional.cross_entropy(out, target) / 4, out)[0]
    assert torch.allclose(loss_fn.backward(loss), expected)
    with pytest.raises(TypeError, match=r"literal `\.\.\.`.*loss_fn.backward\(loss\)"):
        loss_fn.backward(...)  # type: ignore[arg-type]


def test_optimizer_recipes_bind_once() -> None:
    model = cx.SequentialModel().add(cx.LinearModule(2, 2))
    adam = cx.AdamOptimizer(0.01)
    bound = adam.bind(model.parameters())
    assert isinstance(bound, torch.optim.Adam) and bound.param_groups[0]["lr"] == 0.01
    assert adam(model.parameters()) is bound
    with pytest.raises(ValueError, match=r"already bound to another model.*one AdamOptimizer"):
        adam.bind(nn.Linear(2, 2).parameters())
    with pytest.raises(ValueError, match=r"AdamOptimizer learning_rate \(0\) must be .* > 0"):
        cx.AdamOptimizer(0)


def test_trainer_binds_the_adam_recipe_when_built_and_fits_numpy() -> None:
    model = cx.SequentialModel().add(cx.LinearModule(5, 3))
    adam = cx.AdamOptimizer(0.05)
    trainer = cx.distributed.DistributedTrainer(model, cx.CrossEntropyLoss(), adam)
    assert trainer.optimizer is adam.optimizer is not None
    config = cx.distributed.DistributedTrainingConfig()
    config.epochs, config.batch_size, config.checkpoint_dir, config.verbose = 3, 8, None, False
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 5))  # float64, as numpy makes it
    history = trainer.fit(x, rng.integers(0, 3, 40), config)
    assert len(history.train_losses) == 3 and history.world_size == 1


def _lonely_rank_zero(port: int) -> str:
    config = cx.distributed.DistributedConfig()
    config.rank, config.world_size, config.master_port = 0, 2, port
    config.timeout_ms = 1500  # the guide's fix for "Timeout waiting for peers"
    try:
        cx.distributed.init(config)
    except rd.DistributedTimeoutError as exc:
        return str(exc)
    return "joined"


@pytest.mark.timeout(90)
def test_timeout_waiting_for_peers_is_a_clear_error() -> None:
    started = time.monotonic()
    [message] = run_distributed(_lonely_rank_zero, 1, args=(free_port(),), init_group=False)
    assert "1 of 2 ranks arrived" in message and "missing ranks: [1]" in message
    assert time.monotonic() - started < 60


# --------------------------------------------------------------------------- the launcher


def test_launcher_runs_any_command_on_n_ranks(tmp_path: Path) -> None:
    out = launch_sh(
        2, "sh", "-c", 'echo "rank $RANK of $WORLD_SIZE local $LOCAL_RANK"', cwd=tmp_path
    )
    assert sorted(re.findall(r"rank \d of \d local \d", out)) == [
        "rank 0 of 2 local 0",
        "rank 1 of 2 local 1",
    ]


# Each rank records its rank, its arguments and python's -O flag in a file of its own (the
# ranks share one stdout, where unbuffered prints interleave).
_RECORD = (
    "import os, sys; open('rank' + os.environ['RANK'], 'w').write("
    "repr((os.environ['RANK'], sys.argv[1:], sys.flags.optimize)))"
)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("cmd", "argv", "optimize"),
    [
        (["python", "-u", "-O", "rank.py", "x"], ["x"], 1),
        (["python", "-c", _RECORD, "y"], ["y"], 0),
        (["python", "rank.py", "z"], ["z"], 0),
    ],
)
def test_launcher_passes_python_options_to_python(
    cmd: list[str], argv: list[str], optimize: int, tmp_path: Path
) -> None:
    (tmp_path / "rank.py").write_text(_RECORD + "\n")
    # `python` is looked up on PATH, as when a user types the command.
    path = os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", "")))
    proc = run_isolated(
        [str(LAUNCHER), "2", *cmd],
        cwd=tmp_path,
        env=child_env({"PYTHON": sys.executable, "PATH": path}),
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in ("0", "1"):
        assert (tmp_path / f"rank{rank}").read_text() == repr((rank, argv, optimize))


@pytest.mark.parametrize(
    "args", [["x", "python", "t.py"], ["0", "python", "t.py"], ["00", "python", "t.py"], ["2"]]
)
def test_launcher_usage_errors(args: list[str]) -> None:
    proc = run_isolated([str(LAUNCHER), *args], env=child_env(), timeout=30)
    assert proc.returncode == 2 and "usage:" in proc.stderr


# -------------------------------------------------------------------------------- examples


def _quick_start_rows(out: str) -> list[tuple[str, ...]]:
    rows = re.findall(
        r"rank (\d)/2: losses \[([^\]]*)\] accuracies \[[^\]]*\] effective_batch_size (\d+) "
        rf"checksum ({NUM})",
        out,
    )
    assert sorted(r[0] for r in rows) == ["0", "1"], out[-2000:]
    return rows


def _check_quick_start(rows: list[tuple[str, ...]], folder: Path) -> None:
    (_, losses0, batch0, sum0), (_, losses1, _, sum1) = sorted(rows)
    losses = [float(v) for v in losses0.split(",")]
    assert losses0 == losses1 and sum0 == sum1  # one history, one model, on every rank
    assert len(losses) == 10 and losses[-1] < 0.5 * losses[0] and batch0 == "128"
    saved = cx.SequentialModel()
    saved.add(cx.LinearModule(784, 256)).add(cx.ReLUModule()).add(cx.LinearModule(256, 10))
    saved.load(folder / "model.cyxmodel")
    assert repr(sum(p.double().sum().item() for p in saved.parameters())) == sum0
    assert list((folder / "checkpoints").glob("*.pt"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_start_launched_by_hand(tmp_path: Path) -> None:
    # The guide's two launch forms (3. Launch Training), one launch: by hand, the one only this
    # test and api_reference's run; launch_distributed.sh trains trainer.py on the same fit
    # and, with ddp.py, accumulation.py and sampler.py, runs every other port.
    outputs = manual_launch("quick_start.py", 2, tmp_path)
    _check_quick_start(_quick_start_rows("".join(outputs)), tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_api_reference_launched_by_hand(tmp_path: Path) -> None:
    out0, out1 = manual_launch("api_reference.py", 2, tmp_path)
    for rank, out in enumerate((out0, out1)):
        lines = out.splitlines()
        assert lines[0] == f"rank {rank}: True {rank} 2 {rank} {rank == 0}"
        assert lines[1] == f"rank {rank}: after finalize False"
        assert "world_size=4, local_rank=0, master_addr='127.0.0.1', master_port=29500" in lines[2]
        assert f"from_environment DistributedConfig(rank={rank}, world_size=2" in lines[3]
        assert lines[4] == f"rank {rank}: backends cpu nccl"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_example(tmp_path: Path) -> None:
    out = launch_sh(2, "python", str(CX / "ddp.py"), cwd=tmp_path)
    rows = dict(
        (rank, rest)
        for rank, *rest in re.findall(
            rf"rank (\d): info (\w+) (\d) 2 True start ({NUM}) grad_output \(5, 6\) "
            rf"synced ({NUM}) params ({NUM})",
            out,
        )
    )
    assert sorted(rows) == ["0", "1"], out[-2000:]
    assert rows["0"][:2] == ["True", "0"] and rows["1"][:2] == ["False", "1"]
    # Rank 1 started from its own random model: after the wrap it holds rank 0's, and the
    # synced gradients and the updated parameters agree on both ranks.
    assert rows["0"][2:] == rows["1"][2:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_accumulation_example_equals_one_big_batch(tmp_path: Path) -> None:
    out = launch_sh(2, "python", str(CX / "accumulation.py"), cwd=tmp_path)
    rows = re.findall(
        rf"rank (\d)/2: max abs diff vs one big batch ({NUM}), parameters moved ({NUM})", out
    )
    assert sorted(r[0] for r in rows) == ["0", "1"], out[-2000:]
    for _, diff, moved in rows:
        assert float(diff) < 1e-6 and float(moved) > 0.01


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sampler_example(tmp_path: Path) -> None:
    out = launch_sh(2, "python", str(CX / "sampler.py"), cwd=tmp_path)
    first = [json.loads((tmp_path / f"indices_rank{r}.json").read_text()) for r in (0, 1)]
    assert len(first[0]) == len(first[1]) == 5000
    assert sorted(first[0] + first[1]) == list(range(10000))  # each sample once per epoch
    for rank in (0, 1):
        assert f"rank {rank}: sizes 5000 10000 10000" in out
        # 5000 indices in batches of 64: 78 full batches and one of 8.
        assert f"rank {rank}: batches 79 last 8 num_batches 79" in out
        epochs = dict(re.findall(rf"rank {rank}: epoch (\d) first (\[[\d, ]*\])", out))
        assert json.loads(epochs["0"]) == first[rank][:5] != json.loads(epochs["1"])
    drop = dict(re.findall(r"rank (\d): drop_last (\[[\d, ]*\]) padded 10", out))
    assert sorted(json.loads(drop["0"]) + json.loads(drop["1"])) == list(range(10))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_trainer_example(tmp_path: Path) -> None:
    out = launch_sh(2, "python", str(CX / "trainer.py"), cwd=tmp_path)
    for pattern in (
        rf"split val_losses 10 ({NUM})",
        rf"evaluate ({NUM}) ({NUM})",
        rf"reloaded evaluate \(({NUM}), ({NUM})\)",
        rf"history 10 ({NUM}) ({NUM}) ({NUM}) True True 128 2 info (?:True|False) 2",
        rf"scaled_lr ({NUM})",
    ):
        found = {rank: v for rank, *v in re.findall(rf"rank (\d): {pattern}", out)}
        assert sorted(found) == ["0", "1"] and found["0"] == found["1"], (pattern, out[-2000:])
    evaluated = re.search(rf"rank 0: evaluate ({NUM}) ({NUM})", out)
    reloaded = re.search(rf"rank 0: reloaded evaluate \(({NUM}), ({NUM})\)", out)
    assert evaluated and reloaded and evaluated.groups() == reloaded.groups()
    history = re.search(rf"rank 0: history 10 ({NUM}) ({NUM})", out)
    assert history and float(history[2]) < float(history[1])
    assert "rank 0: scaled_lr 0.002" in out and re.search(r"Epoch 9: Loss = ", out)
    assert (tmp_path / "model.ckpt").exists() and (tmp_path / "checkpoint.ckpt").exists()


# Each port: the guide's sections it ports, and the guide's statements it replaces with marked
# lines of its own (the reasons are in the port's docstring and docs/seeds/cyxwiz.md).
PORTS: dict[str, tuple[list[str], list[str]]] = {
    "quick_start.py": (["### 2. Write Training Script"], []),
    "api_reference.py": (
        ["### Initialization Functions", "### DistributedConfig", "### Backend Selection"],
        ["config.rank = 0", "config.world_size = 4"]  # the launch's rank and size instead
        + [f"cx.distributed.{q}()" for q in QUERIES],  # printed
    ),
    "ddp.py": (
        ["### DistributedDataParallel (DDP)"],
        ["ddp.is_master()", "ddp.get_rank()", "ddp.get_world_size()", "ddp.get_model()"],
    ),
    "sampler.py": (
        [
            "### DistributedSampler",
            "### DistributedBatchIterator",
            "### 1. Always Set Epoch in Sampler",
            "### 5. Handle Uneven Data Sizes",
        ],
        [],
    ),
    "trainer.py": (
        [
            "### DistributedTrainer (High-Level API)",
            "### DistributedTrainingHistory",
            "### 2. Only Save/Log on Master",
            "### 3. Scale Learning Rate with Batch Size",
        ],
        ["history = trainer.fit(...)"],  # the history of the fit above
    ),
    "accumulation.py": (
        ["### 4. Use Gradient Accumulation for Large Models"],
        ["ddp.backward(loss_fn.backward(...))"],  # the scaled loss for the elided argument
    ),
}


def test_every_port_is_listed() -> None:
    assert sorted(PORTS) == sorted(p.name for p in CX.glob("*.py"))


@pytest.mark.skipif(not seed_ports.SEEDS.exists(), reason="the seed guides are not here")
@pytest.mark.parametrize("port", sorted(PORTS))
def test_examples_change_only_the_import(port: str) -> None:
    # The port's unmarked code, statement by statement, is the guide's with the import swapped.
    headings, replaced = PORTS[port]
    guide = "\n".join(seed_ports.guide_code(GUIDE, h) for h in headings)
    text = (CX / port).read_text()
    assert "pycyxwiz" not in text
    expected = seed_ports.expected_units(guide, {IMPORT_GUIDE: IMPORT}, replaced, IMPORT)
    assert seed_ports.units(text) == expected
    assert os.access(LAUNCHER, os.X_OK)
