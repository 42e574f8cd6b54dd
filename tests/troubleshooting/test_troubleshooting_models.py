"""docs/troubleshooting.md's rows for the reference models (rankwise.models), each provoked in
this process. tests/troubleshooting/test_troubleshooting.py checks that these rows and triggers pair up."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from helpers.troubleshooting_table import check_row, raised
from rankwise.models import GPT, VAE, CifarResNet, GPTConfig, ResNet


def _tiny_gpt() -> GPT:
    return GPT(GPTConfig(vocab=50, context=8, n_layer=1, d_model=12, n_head=2))


TRIGGERS: dict[str, Callable[[], BaseException]] = {
    "resnet-layers": lambda: raised(ResNet, (3, 4, 6)),
    "resnet-classes": lambda: raised(ResNet, (1, 1, 1, 1), num_classes=0),
    "model-dimension": lambda: raised(VAE, 4, 0),
    "vae-beta": lambda: raised(VAE, 4, 2, beta=-1),
    "model-input-features": lambda: raised(VAE(4, 2), torch.zeros(3, 5)),
    "cifar-resnet-layers": lambda: raised(CifarResNet, (2, 2, 2)),
    "gpt-heads": lambda: raised(GPTConfig, d_model=100, n_head=6),
    "gpt-dropout": lambda: raised(GPTConfig, dropout=1.0),
    "gpt-context": lambda: raised(_tiny_gpt(), torch.zeros(1, 9, dtype=torch.long)),
}


@pytest.mark.parametrize("row_id", sorted(TRIGGERS))
def test_documented_message_is_the_one_raised(row_id: str) -> None:
    check_row(row_id, TRIGGERS[row_id])
