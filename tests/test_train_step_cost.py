"""The trainer's step does the hand-written loop's torch work plus four documented calls.

Counted, never timed: a ``TorchFunctionMode`` (torch's own hook for every call into the torch
API) tallies the torch functions and tensor methods called between two optimizer steps, in
the trainer and in the loop a user writes over the same data, sampler, model and optimizer.
The difference must be exactly what ``loop.py`` documents per micro-batch: the loss kept
detached for the epoch's metrics, ``argmax`` / ``==`` for its accuracy, and the batch's
``shape`` (its length moves the sampler's resume cursor). A per-step ``.item()`` (a host
sync on a GPU), a stray copy or a metric reduced every step shows up here by name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from rankwise.data import DistributedSampler
from rankwise.testing import TorchCalls
from rankwise.train import DistributedTrainer, DistributedTrainingConfig

# What the trainer adds to each step of the plain loop (see sums.py's EpochSums).
EXTRA_PER_STEP = Counter(
    {"Tensor.detach": 1, "Tensor.argmax": 1, "Tensor.__eq__": 1, "Tensor.shape": 1}
)
FIRST, LAST = 5, 25  # optimizer steps counted: inside the first epoch of 40
BATCH = 16
# Reading a tensor on the host: on a GPU each one waits for the device.
HOST_READS = {
    "Tensor.item",
    "Tensor.tolist",
    "Tensor.__float__",
    "Tensor.__int__",
    "Tensor.__bool__",
}


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(40 * BATCH, 8, generator=g), torch.randint(0, 4, (40 * BATCH,), generator=g)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _count(train: Callable[[nn.Module, torch.optim.Optimizer], None]) -> tuple[Counter, Any]:
    """Torch calls per optimizer step over steps FIRST..LAST, and the final weights."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ops, steps = TorchCalls(), [0]

    def on_step(*_: Any) -> None:
        steps[0] += 1
        ops.on = FIRST <= steps[0] < LAST

    optimizer.register_step_post_hook(on_step)
    with ops:
        train(model, optimizer)
    per_step = Counter({k: v // (LAST - FIRST) for k, v in ops.calls.items()})
    assert sum(ops.calls.values()) == sum(per_step.values()) * (LAST - FIRST), ops.calls
    return per_step, model.state_dict()


def _trainer(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    x, y = _data()
    cfg = DistributedTrainingConfig(
        epochs=1, batch_size=BATCH, verbose=False, checkpoint_dir=None, seed=3
    )
    DistributedTrainer(model, nn.CrossEntropyLoss(), optimizer).fit(x, y, cfg)


def _loop(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    x, y = _data()
    loss_fn = nn.CrossEntropyLoss()
    sampler = DistributedSampler(len(x), shuffle=True, seed=3)
    sampler.set_epoch(0)
    index = torch.tensor(list(sampler))
    for start in range(0, len(index), BATCH):
        rows = index[start : start + BATCH]
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x[rows]), y[rows]).backward()
        optimizer.step()


@pytest.mark.timeout(120)
def test_a_trainer_step_is_the_loops_torch_work_plus_the_documented_metrics() -> None:
    trainer_ops, trainer_weights = _count(_trainer)
    loop_ops, loop_weights = _count(_loop)
    # The same arithmetic: otherwise the counts would compare different work.
    assert all(torch.equal(trainer_weights[k], v) for k, v in loop_weights.items())
    assert loop_ops["Tensor.backward"] == 1  # the counter sees the step's calls
    added = trainer_ops - loop_ops
    missing = loop_ops - trainer_ops
    assert not (HOST_READS & set(trainer_ops)), f"host reads per step: {trainer_ops}"
    assert (added, missing) == (EXTRA_PER_STEP, Counter()), (
        f"per optimizer step the trainer calls {dict(added)} more than the hand-written loop "
        f"and {dict(missing)} less; expected exactly {dict(EXTRA_PER_STEP)} more"
    )


@pytest.mark.timeout(60)
def test_the_epoch_metrics_cost_the_same_torch_calls_for_any_number_of_steps() -> None:
    from rankwise.train.sums import FOLD_EVERY, EpochSums

    def calls_for(steps: int) -> int:
        sums = EpochSums()
        for i in range(steps):
            sums.losses.append(torch.tensor(0.5 + i, dtype=torch.float32))
            sums.counts.append(BATCH)
            sums.add_hits(torch.arange(BATCH) % 2 == 0)
        ops = TorchCalls()
        ops.on = True
        with ops:
            totals = sums.local()
        assert totals[1] == steps * BATCH and totals[2] == steps * BATCH // 2
        return sum(ops.calls.values())

    # One stack / cat for the epoch, never one op per micro-batch (300 masks fold once).
    assert calls_for(3) == calls_for(200)
    assert calls_for(300) == calls_for(3) + 1  # the add to the count of the first 256
    sums = EpochSums()
    for _ in range(FOLD_EVERY * 2 + 5):
        sums.add_hits(torch.ones(BATCH, dtype=torch.bool))
    assert len(sums.hits) == 5 and int(sums.local()[2]) == (FOLD_EVERY * 2 + 5) * BATCH
