"""The TensorBrain guide on rankwise: ``rankwise.compat.tensorbrain`` is torch under another
name (with rankwise's sampler and ResNet-50), and every example of the guide runs from
examples/seeds/tensorbrain/ as the guide launches it: plain python, ``torchrun``, or
``python -m torch.distributed.launch``.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import runpy
import sys

import pytest
import torch

import rankwise.compat.tensorbrain as tb
from helpers.paths import EXAMPLES
from helpers.seed_ports import NUM
from rankwise.data import DistributedSampler
from rankwise.models import ResNet, resnet50
from rankwise.testing import child_env, free_port, run_isolated

TB = EXAMPLES / "seeds" / "tensorbrain"


def launch(launcher: str, nproc: int, script: str, *args: str) -> str:
    """``python -m <launcher> --nproc_per_node=N script args`` on a free port; its stdout."""
    cmd = [sys.executable, "-m", launcher, f"--nproc_per_node={nproc}"]
    cmd += [f"--master_port={free_port()}", str(TB / script), *args]
    proc = run_isolated(cmd, env=child_env(), timeout=270)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# ------------------------------------------------------------------------------ the names


def test_tb_is_torch_with_rankwise_sampler_and_resnet() -> None:
    assert tb.tensor is torch.tensor and tb.empty_like is torch.empty_like
    assert tb.nn.CrossEntropyLoss is torch.nn.CrossEntropyLoss
    assert tb.optim.Adam is torch.optim.Adam
    assert tb.cuda.is_available is torch.cuda.is_available
    assert tb.multiprocessing.spawn is torch.multiprocessing.spawn
    assert tb.distributed.all_reduce is torch.distributed.all_reduce
    assert tb.utils.data.DataLoader is torch.utils.data.DataLoader
    assert tb.utils.data.DistributedSampler is DistributedSampler
    assert tb.nn.ResNet50().__class__ is ResNet


@pytest.mark.parametrize(
    ("module", "name", "torch_object"),
    [
        ("rankwise.compat.tensorbrain.nn.parallel", "DataParallel", torch.nn.DataParallel),
        (
            "rankwise.compat.tensorbrain.nn.parallel",
            "DistributedDataParallel",
            torch.nn.parallel.DistributedDataParallel,
        ),
        ("rankwise.compat.tensorbrain.distributed", "ReduceOp", torch.distributed.ReduceOp),
        ("rankwise.compat.tensorbrain.utils.data", "TensorDataset", torch.utils.data.TensorDataset),
    ],
)
def test_submodules_are_real_module_paths(module: str, name: str, torch_object: object) -> None:
    # The guide's `from tb.nn.parallel import ...` form needs a module to import from.
    assert getattr(importlib.import_module(module), name) is torch_object
    assert name in dir(importlib.import_module(module))


def test_unknown_name_names_both_modules() -> None:
    with pytest.raises(
        AttributeError, match=r"'rankwise.compat.tensorbrain.nn' has no .*'torch.nn'"
    ):
        _ = tb.nn.ResNet51


# -------------------------------------------------------------------------------- ResNet-50


def test_resnet50_has_resnet50s_parameters_and_shapes() -> None:
    model = resnet50()
    # torchvision's resnet50() has 25,557,032 parameters: the same architecture.
    assert sum(p.numel() for p in model.parameters()) == 25_557_032
    assert [len(stage) for stage in (model.layer1, model.layer2, model.layer3, model.layer4)] == [
        3,
        4,
        6,
        3,
    ]
    model.eval()
    with torch.no_grad():
        assert model(torch.rand(2, 3, 64, 64)).shape == (2, 1000)
        assert model.layer4(
            model.layer3(model.layer2(model.layer1(torch.rand(1, 64, 16, 16))))
        ).shape == (1, 2048, 2, 2)
    assert resnet50(num_classes=10, in_channels=1)(torch.rand(2, 1, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"layers": (3, 4, 6)}, r"layers \(\(3, 4, 6\)\) must be four block counts"),
        ({"layers": (3, 0, 6, 3)}, r"layers .* must be four block counts >= 1"),
        ({"layers": (3, 4, 6, 3), "num_classes": 0}, r"num_classes \(0\) must be an integer >= 1"),
    ],
)
def test_resnet_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ResNet(**kwargs)


# -------------------------------------------------------------------------------- examples


@pytest.mark.timeout(200)
def test_data_parallel_example_trains_resnet50() -> None:
    out = io.StringIO()
    # Plain python, as the guide runs it; fork_rng: the script seeds torch's global generator.
    with contextlib.redirect_stdout(out), torch.random.fork_rng():
        runpy.run_path(str(TB / "data_parallel.py"), run_name="__main__")
    lines = out.getvalue().splitlines()
    losses = [
        float(m)
        for m in re.findall(r"^epoch 0 outputs \(2, 1000\) loss ([\d.]+)$", out.getvalue(), re.M)
    ]
    assert len(losses) == 2 and all(0 < loss < 20 for loss in losses)
    assert lines[-1] == "trained ResNet (25,557,032 parameters) on cpu"


@pytest.mark.timeout(300)
def test_ddp_example_under_torchrun_shards_and_stays_in_sync() -> None:
    out = launch("torch.distributed.run", 2, "ddp.py")
    samples = {
        (int(rank), int(epoch)): [int(i) for i in re.findall(r"\d+", ids)]
        for rank, epoch, ids in re.findall(r"rank (\d) epoch (\d) samples \[([\d, ]*)\]", out)
    }
    assert sorted(samples) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for epoch in (0, 1):  # each epoch the two ranks split the 8 samples between them
        assert sorted(samples[0, epoch] + samples[1, epoch]) == list(range(8))
    assert samples[0, 0] != samples[0, 1]  # set_epoch reshuffles
    checksums = re.findall(rf"rank \d parameter checksum ({NUM})", out)
    assert len(checksums) == 2 and checksums[0] == checksums[1]  # DDP kept the ranks in sync


@pytest.mark.timeout(300)
def test_accumulation_example_under_torch_distributed_launch() -> None:
    # The guide's second launch form, with its literal `--args`.
    out = launch("torch.distributed.launch", 2, "accumulation.py", "--args")
    rows = re.findall(
        r"rank (\d): all-reduces (\d+) \(guide loop\) vs (\d+) \(no_sync\), "
        rf"same parameters (True|False), checksum ({NUM})",
        out,
    )
    assert sorted(r[0] for r in rows) == ["0", "1"]
    # 64 samples, 2 ranks, batches of 4, 2 epochs: 16 micro-batches, 4 optimizer steps.
    assert all(r[1:4] == ("16", "4", "True") for r in rows)
    assert rows[0][4] == rows[1][4]


@pytest.mark.timeout(300)
def test_collectives_example_on_three_ranks() -> None:
    out = launch("torch.distributed.run", 3, "collectives.py")
    for rank in range(3):
        assert f"Rank {rank}: tensor([1., 2., 3.])" in out
        assert f"Rank {rank}: all_gather {[[1.0, 2.0, 3.0]] * 3}" in out
        assert f"Rank {rank}: broadcast [1.0, 2.0, 3.0]" in out
        assert f"Rank {rank}: scatter [{rank + 1.0}]" in out
