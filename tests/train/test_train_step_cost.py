"""The trainer's step does the hand-written loop's torch work plus four documented calls.

Counted, never timed: a ``TorchFunctionMode`` (torch's own hook for every call into the torch
API) tallies the torch functions and tensor methods called between two optimizer steps, in
the trainer and in the loop a user writes over the same data, sampler, model and optimizer.
The difference must be exactly what ``step.py`` documents per micro-batch: the loss kept
detached for the epoch's metrics, ``argmax`` / ``==`` for its accuracy, and the batch's
``shape`` (its length moves the sampler's resume cursor). A per-step ``.item()`` (a host
sync on a GPU), a stray copy or a metric reduced every step shows up here by name.

With the default config (``verbose=True``) rank 0's progress line adds, once per
``log_every_n_batches`` steps, the three calls of :class:`~rankwise.train.sums.LossReadout`
(a ``stack`` of the recent losses, their non-blocking copy ``to`` the host, and the
``numpy`` view it reads them through once landed), and still no host read of a tensor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from helpers.training import classification, mlp
from rankwise.data import DistributedSampler
from rankwise.testing import TorchCalls
from rankwise.train import DistributedTrainer, DistributedTrainingConfig

# What the trainer adds to each step of the plain loop (see sums.py's EpochSums).
EXTRA_PER_STEP = Counter(
    {"Tensor.detach": 1, "Tensor.argmax": 1, "Tensor.__eq__": 1, "Tensor.shape": 1}
)
# What a progress-line log point adds (every log_every_n_batches steps, verbose or log_dir).
PER_LOG_POINT = Counter(
    {"torch._VariableFunctionsClass.stack": 1, "Tensor.to": 1, "Tensor.numpy": 1}
)
FIRST, LAST = 5, 25  # optimizer steps counted: inside the first epoch of 40
LOG_EVERY = 10  # the default log_every_n_batches: log points after steps 10 and 20
BATCH = 16
# Reading a tensor on the host: on a GPU each one waits for the device.
HOST_READS = {
    "Tensor.item",
    "Tensor.tolist",
    "Tensor.__float__",
    "Tensor.__int__",
    "Tensor.__bool__",
}


def _count(
    train: Callable[[nn.Module, torch.optim.Optimizer], None],
) -> tuple[dict[int, Counter], Any]:
    """Torch calls between optimizer steps s and s + 1 for s in FIRST..LAST - 1, and the final
    weights."""
    model = mlp(8, 16, 4, activation=nn.ReLU)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ops, steps, per_step = TorchCalls(), [0], {}

    def on_step(*_: Any) -> None:
        if ops.on:
            per_step[steps[0]] = ops.calls
        steps[0] += 1
        ops.on, ops.calls = FIRST <= steps[0] < LAST, Counter()

    optimizer.register_step_post_hook(on_step)
    with ops:
        train(model, optimizer)
    assert sorted(per_step) == list(range(FIRST, LAST))
    return per_step, model.state_dict()


def _uniform(per_step: dict[int, Counter]) -> Counter:
    """The calls every step makes (each step must make the same ones)."""
    first = per_step[FIRST]
    assert all(calls == first for calls in per_step.values()), per_step
    return first


def _fit_by_trainer(
    model: nn.Module, optimizer: torch.optim.Optimizer, verbose: bool = False
) -> None:
    x, y = classification(40 * BATCH, 8, 4, seed=0)
    cfg = DistributedTrainingConfig(epochs=1, batch_size=BATCH, checkpoint_dir=None, seed=3)
    cfg.verbose = verbose  # True: the default config, progress lines on
    DistributedTrainer(model, nn.CrossEntropyLoss(), optimizer).fit(x, y, cfg)


def _loop(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    x, y = classification(40 * BATCH, 8, 4, seed=0)
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
@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "default-config"])
def test_a_trainer_step_is_the_loops_torch_work_plus_the_documented_metrics(
    verbose: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    per_step, trainer_weights = _count(lambda m, o: _fit_by_trainer(m, o, verbose))
    loop_ops, loop_weights = _count(_loop)
    loop_ops = _uniform(loop_ops)
    # The same arithmetic: otherwise the counts would compare different work.
    assert all(torch.equal(trainer_weights[k], v) for k, v in loop_weights.items())
    assert loop_ops["Tensor.backward"] == 1  # the counter sees the step's calls
    logged = {s for s in per_step if verbose and s % LOG_EVERY == 0}
    trainer_ops = _uniform({s: c for s, c in per_step.items() if s not in logged})
    for step, calls in per_step.items():
        assert not (HOST_READS & set(calls)), f"host reads after step {step}: {calls}"
    added = trainer_ops - loop_ops
    missing = loop_ops - trainer_ops
    assert (added, missing) == (EXTRA_PER_STEP, Counter()), (
        f"per optimizer step the trainer calls {dict(added)} more than the hand-written loop "
        f"and {dict(missing)} less; expected exactly {dict(EXTRA_PER_STEP)} more"
    )
    assert len(logged) == (2 if verbose else 0)
    for step in logged:  # a log point: the progress line's readout, nothing more
        assert per_step[step] - trainer_ops == PER_LOG_POINT, per_step[step]
        assert not trainer_ops - per_step[step]
    if verbose:
        assert "epoch 1/1 batch 20/40 loss " in capsys.readouterr().out


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
