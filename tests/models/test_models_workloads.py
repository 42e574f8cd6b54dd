"""The benchmark workloads' models: the GPT decoder is causal and ties its head to its token
embedding, its config refuses shapes that cannot work, ResNet-18 (CIFAR stem) keeps 32x32
inputs at full resolution in its first stage, and both train (the loss falls on a fixed batch)."""

from __future__ import annotations

import pytest
import torch

from rankwise.models import GPT, CifarResNet, GPTConfig, lm_loss, resnet18_cifar

SMALL = GPTConfig(vocab=50, context=16, n_layer=2, n_head=2, d_model=16)


def test_gpt_is_causal() -> None:
    torch.manual_seed(0)
    model = GPT(SMALL).eval()
    x = torch.randint(0, 50, (2, 16))
    changed = x.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 50  # only positions 10 and later differ
    a, b = model(x), model(changed)
    assert torch.equal(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_gpt_ties_head_to_embedding_and_counts_parameters() -> None:
    model = GPT(SMALL)
    assert model.head.weight is model.tok.weight
    assert sum(p.numel() for p in model.parameters()) == SMALL.parameters()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"d_model": 30, "n_head": 4}, "multiple of n_head"),
        ({"n_layer": 0}, "n_layer"),
        ({"dropout": 1.0}, "dropout"),
    ],
)
def test_gpt_config_refuses_bad_shapes(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GPTConfig(**kwargs)  # type: ignore[arg-type]


def test_gpt_refuses_sequences_longer_than_the_context() -> None:
    with pytest.raises(ValueError, match="exceeds the context"):
        GPT(SMALL)(torch.zeros(1, 17, dtype=torch.long))


def test_resnet18_cifar_keeps_full_resolution_in_stage_one() -> None:
    model = resnet18_cifar(width=8)
    seen = model.layer1(model.relu(model.bn1(model.conv1(torch.zeros(1, 3, 32, 32)))))
    assert seen.shape == (1, 8, 32, 32)
    with pytest.raises(ValueError, match="ResNet-18 is"):
        CifarResNet((2, 2, 2))


@pytest.mark.parametrize("which", ["gpt", "resnet"])
def test_workload_models_learn_a_fixed_batch(which: str) -> None:
    torch.manual_seed(0)
    if which == "gpt":
        model: torch.nn.Module = GPT(SMALL)
        x = torch.randint(0, 50, (4, 17))
        inputs, targets, loss_fn = x[:, :-1], x[:, 1:], lm_loss
    else:
        model = resnet18_cifar(width=8)
        inputs, targets = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
        loss_fn = torch.nn.functional.cross_entropy
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = None
    for _ in range(15):
        loss = loss_fn(model(inputs), targets)
        first = loss.item() if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.7 * first
