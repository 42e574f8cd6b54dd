"""OptimizerRecipe (an optimizer named before its model exists) and OutputGradientMixin (a loss
whose backward gives d loss / d predictions), the core of the CyxWiz guide's cx.AdamOptimizer
and cx.CrossEntropyLoss."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rankwise.parallel import ExplicitDDP, OptimizerRecipe, OutputGradientMixin, as_optimizer


class _CrossEntropy(OutputGradientMixin, nn.CrossEntropyLoss):
    pass


def test_recipe_builds_once_and_stays_bound() -> None:
    net = nn.Linear(3, 2)
    recipe = OptimizerRecipe(torch.optim.Adam, 0.01, betas=(0.8, 0.9))
    assert recipe.optimizer is None
    built = recipe.bind(net.parameters())
    assert isinstance(built, torch.optim.Adam) and built.param_groups[0]["betas"] == (0.8, 0.9)
    assert built.param_groups[0]["lr"] == 0.01
    assert recipe(net.parameters()) is built and as_optimizer(recipe, net.parameters()) is built
    with pytest.raises(ValueError, match=r"already bound to another model.*per model"):
        recipe.bind(nn.Linear(3, 2).parameters())
    plain = torch.optim.SGD(net.parameters(), lr=0.1)
    assert as_optimizer(plain, net.parameters()) is plain


@pytest.mark.parametrize("lr", [0, -1.0, float("nan"), float("inf"), True, "0.1"])
def test_recipe_refuses_a_bad_learning_rate(lr: object) -> None:
    with pytest.raises(ValueError, match=r"OptimizerRecipe lr \(.*\) must be a finite number > 0"):
        OptimizerRecipe(torch.optim.SGD, lr)  # type: ignore[arg-type]


def test_recipe_refuses_what_is_not_an_optimizer_class() -> None:
    with pytest.raises(TypeError, match=r"torch.optim.Optimizer subclass such as"):
        OptimizerRecipe(torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=1), 0.1)  # type: ignore[arg-type]


def test_explicit_ddp_step_binds_a_recipe_to_its_model() -> None:
    net = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        net.weight.fill_(1.0)
    ddp, recipe = ExplicitDDP(net), OptimizerRecipe(torch.optim.SGD, 0.5)
    ddp.forward(torch.ones(1, 2))
    ddp.backward(torch.ones(1, 1))  # d out / d weight = [1, 1]
    ddp.step(recipe)
    assert recipe.optimizer is not None and torch.equal(net.weight, torch.full((1, 2), 0.5))


def test_output_gradient_is_the_gradient_of_the_loss_given() -> None:
    loss_fn = _CrossEntropy()
    out = torch.randn(4, 3, requires_grad=True)
    target = torch.tensor([0, 2, 1, 0])
    expected = torch.autograd.grad(nn.functional.cross_entropy(out, target) / 4, out)[0]
    loss = loss_fn(out, target)
    assert torch.equal(loss, nn.functional.cross_entropy(out, target))
    assert torch.allclose(loss_fn.backward(loss / 4), expected)  # the scale reaches it
    loss_fn(out, target)
    assert torch.allclose(loss_fn.backward(), expected * 4)  # default: the last loss


def test_output_gradient_errors_name_the_fix() -> None:
    loss_fn = _CrossEntropy()
    with pytest.raises(RuntimeError, match=r"needs a forward\(output, target\)"):
        loss_fn.backward()
    loss_fn(torch.randn(2, 3), torch.tensor([0, 1]))  # no grad: an evaluation forward
    with pytest.raises(RuntimeError, match=r"requires grad"):
        loss_fn.backward()
    loss_fn(torch.randn(2, 3, requires_grad=True), torch.tensor([0, 1]))
    with pytest.raises(TypeError, match=r"literal `\.\.\.`.*loss_fn.backward\(loss\)"):
        loss_fn.backward(...)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got a float"):
        loss_fn.backward(0.5)  # type: ignore[arg-type]
