"""A small model's :class:`TrainState` after one optimizer step, for the checkpoint tests."""

from __future__ import annotations

import torch
from torch import nn

from rankwise.train.state import TrainState


def state_after(net: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> TrainState:
    """``net`` (taking 3 features) trained one step on random data; its state at ``step``."""
    net(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    state = TrainState(net, optimizer)
    state.step = step
    return state
