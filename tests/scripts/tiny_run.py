"""The deterministic data and model the fault and continue workers train (fault_worker.py,
continue_worker.py): 192 samples of 8 features in 3 classes, an 8-16-3 MLP, SGD with momentum.
The workers run as scripts, so this folder is first on their import path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rankwise.train import DistributedTrainer

NUM_SAMPLES = 192


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(NUM_SAMPLES, 8, generator=g)
    y = (x[:, :3].sum(1) > 0).long() + (x[:, 3] > 1).long()
    return x, y


def mlp_trainer(callbacks: Sequence[Any]) -> tuple[torch.nn.Module, DistributedTrainer]:
    """The seeded model and a trainer over it (the same initial weights in every process)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trainer = DistributedTrainer(model, torch.nn.CrossEntropyLoss(), optimizer, callbacks=callbacks)
    return model, trainer
