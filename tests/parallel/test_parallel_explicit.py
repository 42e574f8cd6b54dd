"""ExplicitDDP: gradients accumulate locally through any number of backward passes and are
averaged once by sync_gradients(); the update equals one big batch's (2 real gloo ranks)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.training import classification
from rankwise.parallel import DDPConfig, ExplicitDDP, gradient_buckets
from rankwise.testing import run_distributed

MICRO, ROWS, FEATURES, CLASSES = 4, 8, 6, 3


def _net() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(FEATURES, 5), nn.Tanh(), nn.Linear(5, CLASSES))


def _accumulate_then_sync() -> dict[str, object]:
    import rankwise.distributed as rd

    rank, world = rd.get_rank(), rd.get_world_size()
    x, y = classification((world, MICRO, ROWS), FEATURES, CLASSES, seed=7)
    net = _net()
    ddp = ExplicitDDP(net, DDPConfig(bucket_size_mb=0.0001))  # several buckets
    loss_fn = nn.CrossEntropyLoss()
    for i in range(MICRO):
        out = ddp.forward(x[rank, i])
        loss = loss_fn(out, y[rank, i]) / MICRO
        ddp.backward(torch.autograd.grad(loss, out)[0])
    local = [p.grad.clone() for p in net.parameters()]
    synced = [g.clone() for g in ddp.sync_gradients()]
    again = ddp.sync_gradients()  # no backward since: nothing more to average
    # The reference: one batch of every rank's every micro-batch, in one process.
    ref = _net()
    loss_fn(ref(x.reshape(-1, FEATURES)), y.reshape(-1)).backward()
    expected = [p.grad for p in ref.parameters()]
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    ddp.step(optimizer)
    torch.optim.SGD(ref.parameters(), lr=0.5).step()
    return {
        "local": local,
        "grad_diff": max((a - b).abs().max().item() for a, b in zip(synced, expected, strict=True)),
        "again_diff": max((a - b).abs().max().item() for a, b in zip(synced, again, strict=True)),
        "param_diff": max(
            (a - b).abs().max().item()
            for a, b in zip(net.parameters(), ref.parameters(), strict=True)
        ),
        "cleared": all(p.grad is None for p in net.parameters()),
    }


@pytest.mark.timeout(120)
def test_accumulated_sync_equals_one_big_batch_on_two_ranks() -> None:
    results = run_distributed(_accumulate_then_sync, 2, timeout=90)
    for r in results:
        assert r["grad_diff"] < 1e-6 and r["param_diff"] < 1e-6
        assert r["again_diff"] == 0.0 and r["cleared"]
    # Nothing was exchanged in the backward passes: the local gradients differ by rank.
    assert any(
        not torch.allclose(a, b)
        for a, b in zip(results[0]["local"], results[1]["local"], strict=True)
    )


def _start_from_rank0(broadcast: bool) -> list[torch.Tensor]:
    import rankwise.distributed as rd

    torch.manual_seed(rd.get_rank())  # a different initial model on every rank
    net = nn.Linear(4, 2)
    ExplicitDDP(net, DDPConfig(broadcast_parameters=broadcast))
    return [p.detach().clone() for p in net.parameters()]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("broadcast", [True, False])
def test_broadcast_parameters(broadcast: bool) -> None:
    first, second = run_distributed(_start_from_rank0, 2, args=(broadcast,), timeout=90)
    same = all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert same is broadcast


def test_world_of_one_backward_returns_the_input_gradient() -> None:
    net = nn.Linear(3, 1, bias=False)
    ddp = ExplicitDDP(net)
    assert ddp.model is net  # nothing to wrap without a group
    ddp.forward(torch.ones(2, 3))
    grad_input = ddp.backward(torch.ones(2, 1))
    assert grad_input is not None and torch.equal(grad_input, net.weight.detach().expand(2, 3))
    (grad,) = ddp.sync_gradients()
    assert torch.equal(grad, torch.full((1, 3), 2.0))  # summed over the 2 rows, world of one


def test_errors_name_the_fix() -> None:
    ddp = ExplicitDDP(nn.Linear(3, 1))
    with pytest.raises(RuntimeError, match=r"needs the output of a forward\(\) first"):
        ddp.backward(torch.ones(1, 1))
    with pytest.raises(ValueError, match=r"no gradient .*find_unused_parameters = True"):
        ddp.sync_gradients()
    with pytest.raises(ValueError, match=r"compression='fp16'.* does not use"):
        ExplicitDDP(nn.Linear(3, 1), DDPConfig(compression="fp16"))


class _OneBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = nn.Linear(2, 1), nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)  # self.unused gets no gradient


def test_unused_parameters_keep_no_gradient_in_a_world_of_one() -> None:
    net = _OneBranch()
    ddp = ExplicitDDP(net, DDPConfig(find_unused_parameters=True))
    ddp.forward(torch.ones(1, 2))
    ddp.backward(torch.ones(1, 1))
    grads = ddp.sync_gradients()
    # No rank used it: no gradient, so weight decay and momentum skip it as in plain torch.
    assert len(grads) == 2 and net.unused.weight.grad is None
    assert torch.equal(net.used.weight.grad, torch.ones(1, 2))


class _ThreeBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.never = nn.Linear(3, 1), nn.Linear(3, 1), nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
        return self.a(x) + self.b(x) if use_b else self.a(x)


def _some_rank_unused(find_unused: bool) -> dict[str, object]:
    import rankwise.distributed as rd

    rank = rd.get_rank()
    torch.manual_seed(0)
    net = _ThreeBranch()
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    ddp = ExplicitDDP(net, DDPConfig(find_unused_parameters=find_unused))
    ddp.forward(torch.ones(2, 3), rank == 0)  # b on rank 0 only; never on no rank
    ddp.backward(torch.ones(2, 1))
    try:
        ddp.sync_gradients()
    except ValueError as error:
        return {"error": str(error)}
    grads = {n: None if p.grad is None else p.grad.clone() for n, p in net.named_parameters()}
    ddp.step(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=0.5))
    moved = {n: not torch.equal(p.detach(), before[n]) for n, p in net.named_parameters()}
    return {"grads": grads, "moved": moved}


@pytest.mark.timeout(120)
def test_unused_on_some_ranks_average_as_zeros_and_on_none_stay_none() -> None:
    first, second = run_distributed(_some_rank_unused, 2, args=(True,), timeout=90)
    for r in (first, second):
        assert r["grads"]["never.weight"] is None and r["grads"]["never.bias"] is None
        assert r["moved"] == {
            "a.weight": True, "a.bias": True, "b.weight": True, "b.bias": True,
            "never.weight": False, "never.bias": False,
        }  # fmt: skip
    # Rank 0's gradient of b (ones over 2 rows) averaged with rank 1's zeros.
    assert torch.equal(first["grads"]["b.weight"], torch.ones(1, 3))
    assert torch.equal(second["grads"]["b.weight"], torch.ones(1, 3))


@pytest.mark.timeout(120)
def test_missing_gradient_on_one_rank_is_the_same_error_on_every_rank() -> None:
    results = run_distributed(_some_rank_unused, 2, args=(False,), timeout=60)
    assert results[0] == results[1]
    message = results[0]["error"]
    assert "b.weight (no gradient on 1 of 2 ranks)" in message
    assert "never.weight (no gradient on 2 of 2 ranks)" in message
    assert "find_unused_parameters = True" in message


def _batchnorm_stats(explicit: bool) -> list[float]:
    import rankwise.distributed as rd
    from rankwise.parallel import wrap_model

    rank = rd.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2, momentum=0.5))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.0)
    ddp = ExplicitDDP(net) if explicit else wrap_model(net, DDPConfig())
    for _ in range(4):
        x = torch.full((4, 2), 10.0 * rank) + torch.arange(4.0)[:, None]  # rank-specific data
        if isinstance(ddp, ExplicitDDP):
            out = ddp.forward(x)
            ddp.backward(torch.ones_like(out))
            ddp.step(optimizer)
        else:
            ddp(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    return net[1].running_mean.tolist() + net[1].running_var.tolist()


@pytest.mark.timeout(120)
def test_buffers_are_broadcast_before_every_forward_as_in_ddp() -> None:
    explicit = run_distributed(_batchnorm_stats, 2, args=(True,), timeout=90)
    reference = run_distributed(_batchnorm_stats, 2, args=(False,), timeout=90)  # torch DDP
    for got, want in zip(explicit, reference, strict=True):
        assert got == pytest.approx(want, abs=1e-5)


def test_an_input_that_requires_grad_keeps_its_upstream_gradient() -> None:
    torch.manual_seed(0)
    upstream, net = nn.Linear(3, 3), nn.Linear(3, 2)
    x = torch.randn(4, 3)
    ddp = ExplicitDDP(net)
    hidden = upstream(x)
    ddp.forward(hidden)
    grad_input = ddp.backward(torch.ones(4, 2))
    ref_up, ref_net = nn.Linear(3, 3), nn.Linear(3, 2)
    ref_up.load_state_dict(upstream.state_dict())
    ref_net.load_state_dict(net.state_dict())
    ref_hidden = ref_up(x)
    ref_hidden.retain_grad()
    ref_net(ref_hidden).sum().backward()
    assert upstream.weight.grad is not None
    assert torch.allclose(upstream.weight.grad, ref_up.weight.grad)
    assert grad_input is not None and torch.allclose(grad_input, ref_hidden.grad)
    # A second window: the returned input gradient is this backward's, not a running sum.
    leaf = torch.ones(1, 3, requires_grad=True)
    for _ in range(2):
        ddp.forward(leaf)
        again = ddp.backward(torch.ones(1, 2))
        assert again is not None and torch.allclose(again, net.weight.sum(0, keepdim=True))


def test_buckets_split_by_size_and_dtype() -> None:
    grads = [torch.zeros(100), torch.zeros(100), torch.zeros(3, dtype=torch.float64)]
    assert [len(b) for b in gradient_buckets(grads, bucket_size_mb=1)] == [2, 1]
    assert [len(b) for b in gradient_buckets(grads, bucket_size_mb=0.0005)] == [1, 1, 1]
