"""Explicit gradient sync: :class:`ExplicitDDP`, where gradients are all-reduced when you say so.

torch's DDP all-reduces inside every backward pass (unless it runs under ``no_sync()``), so the
caller must know *before* the backward whether it is the last micro-batch of a window. The
CyxWiz guide's API decides *after*: ``forward`` / ``backward(grad_output)`` any number of times,
then ``sync_gradients()`` and an optimizer step. :class:`ExplicitDDP` gives that contract on
torch's own pieces: the model is wrapped by :func:`rankwise.parallel.wrap_model` (so rank 0's
parameters are broadcast at the start, its shapes checked), every forward re-broadcasts rank 0's
buffers as DDP's own forward does (``DDPConfig.broadcast_buffers``), every forward and backward
runs under DDP's ``no_sync()`` (gradients accumulate locally), and
:meth:`ExplicitDDP.sync_gradients` averages them with ``torch.distributed.all_reduce``, one call
per bucket of ``DDPConfig.bucket_size_mb``. One all-reduce per window, whatever its length::

    ddp = ExplicitDDP(net)
    for i, (x, y) in enumerate(micro_batches):            # N micro-batches
        out = ddp.forward(x)
        ddp.backward(torch.autograd.grad(loss_fn(out, y) / N, out)[0])
        if (i + 1) % N == 0:
            ddp.step(optimizer)                           # sync, optimizer.step(), zero_grad

gives the update of one batch of all N micro-batches of all ranks (averaging is linear).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import rankwise.distributed as rd
from rankwise.parallel.ddp import DDPConfig, wrap_model
from rankwise.parallel.recipes import OptimizerRecipe, as_optimizer

__all__ = ["ExplicitDDP", "gradient_buckets"]


class ExplicitDDP:
    """``model`` over all ranks, its gradients averaged by :meth:`sync_gradients` only.

    ``config`` is a :class:`DDPConfig`: ``broadcast_parameters``, ``broadcast_buffers`` (rank
    0's buffers, e.g. BatchNorm statistics, before every forward), ``bucket_size_mb`` (the size
    of each all-reduce) and ``find_unused_parameters`` apply. With the latter, a parameter some
    rank used and another did not joins the average as zeros on the ranks that did not, and one
    no rank used keeps ``grad = None`` (the optimizer skips it, as in one process); without
    it, a parameter that lacks a gradient on any rank is a ``ValueError`` on every rank.
    ``compression`` and ``count_bytes`` configure DDP's per-backward hook, which never runs
    here, so they are refused rather than ignored. In a world of one nothing is wrapped and
    :meth:`sync_gradients` only collects the gradients.

    >>> ddp = ExplicitDDP(nn.Linear(3, 1))
    >>> out = ddp.forward(torch.ones(2, 3))
    >>> grad_input = ddp.backward(torch.ones(2, 1))   # d(sum of outputs) / d(input)
    >>> tuple(grad_input.shape), [tuple(g.shape) for g in ddp.sync_gradients()]
    ((2, 3), [(1, 3), (1,)])
    """

    def __init__(self, model: nn.Module, config: DDPConfig | None = None) -> None:
        cfg = (config if config is not None else DDPConfig()).validate()
        if cfg.compression is not None or cfg.count_bytes:
            raise ValueError(
                f"DDPConfig(compression={cfg.compression!r}, count_bytes={cfg.count_bytes}) "
                "configures DDP's all-reduce inside backward, which ExplicitDDP does not use "
                "(it all-reduces in sync_gradients()); leave both unset, or use "
                "rankwise.parallel.wrap_model for a compressed DDP."
            )
        self.config = cfg
        self.module = model
        self.model = wrap_model(model, cfg)  # DDP with a group; the module itself without
        self._output: Any = None
        self._input_grad: list[torch.Tensor] = []
        self._input_hook: Any = None
        self._synced = False

    @contextlib.contextmanager
    def _local(self) -> Iterator[None]:
        # no_sync() in the forward keeps DDP's reducer from expecting this backward, so the
        # gradients accumulate locally until sync_gradients().
        if isinstance(self.model, DistributedDataParallel):
            with self.model.no_sync():
                yield
        else:
            yield

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """The model's output for ``inputs``; kept for the next :meth:`backward`."""
        inputs = self._watch_input(inputs)
        if isinstance(self.model, DistributedDataParallel):
            # DDP's forward broadcasts rank 0's buffers only while require_forward_param_sync is
            # set, and a forward under no_sync() clears it; without this the BatchNorm
            # statistics of the ranks drift apart. DDP itself still honours broadcast_buffers.
            self.model.require_forward_param_sync = True
        with self._local():
            self._output = self.model(*inputs, **kwargs)
        return self._output

    def _watch_input(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        # backward() returns d(output)/d(first input), as the guide's backward does: a hook
        # records the gradient that reaches the input in that backward pass.
        if self._input_hook is not None:
            self._input_hook.remove()
        self._input_hook = None
        self._input_grad = []
        first = inputs[0] if inputs else None
        if not (
            isinstance(first, torch.Tensor)
            and first.is_floating_point()
            and torch.is_grad_enabled()
        ):
            return inputs
        if not first.requires_grad:
            # A leaf of its own (one extra matmul in the first layer); nothing upstream.
            first = first.detach().requires_grad_(True)
            inputs = (first, *inputs[1:])
        # An input that already requires grad stays in the graph, so the modules that produced
        # it still get their gradients.
        self._input_hook = first.register_hook(self._input_grad.append)
        return inputs

    __call__ = forward

    def backward(self, grad_output: Any = None) -> torch.Tensor | None:
        """Back-propagate ``grad_output`` (d loss / d output; None for a scalar output) from
        the last :meth:`forward`'s output, adding to the local gradients; no communication.

        Returns the gradient with respect to the forward's first input when it is a floating
        point tensor, else None.
        """
        if self._output is None:
            raise RuntimeError(
                "ExplicitDDP.backward() needs the output of a forward() first: call "
                "ddp.forward(x), compute d loss / d output, then ddp.backward(grad)."
            )
        output, self._output = self._output, None
        with self._local():
            torch.autograd.backward(output, grad_output)
        self._synced = False
        if self._input_hook is not None:
            self._input_hook.remove()
            self._input_hook = None
        grad_input = self._input_grad[0] if self._input_grad else None
        self._input_grad = []
        return grad_input

    def sync_gradients(self) -> list[torch.Tensor]:
        """Average the accumulated gradients over all ranks (in place); return them in
        ``parameters()`` order. A second call without a backward in between does nothing."""
        params = [p for p in self.module.parameters() if p.requires_grad]
        if not self._synced:
            self._fill_missing()
            world = rd.get_world_size()
            if rd.has_group() and world > 1:
                for bucket in gradient_buckets(
                    [p.grad for p in params if p.grad is not None], self.config.bucket_size_mb
                ):
                    flat = rd.all_reduce(torch.cat([g.reshape(-1) for g in bucket]))
                    flat.div_(world)
                    offset = 0
                    for g in bucket:
                        g.copy_(flat[offset : offset + g.numel()].view_as(g))
                        offset += g.numel()
            self._synced = True
        return [p.grad for p in params if p.grad is not None]

    def _fill_missing(self) -> None:
        # One small all-reduce tells every rank which parameters any rank has a gradient for,
        # so all ranks take the same decision (raise, fill, or skip) and build the same buckets.
        named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        if not named:
            return
        counts = torch.tensor([p.grad is not None for _, p in named], dtype=torch.int32)
        world = rd.get_world_size()
        if rd.has_group() and world > 1:
            rd.all_reduce(counts)
        else:
            world = 1
        lacking = [
            (n, world - int(c)) for (n, _), c in zip(named, counts, strict=True) if c < world
        ]
        if not lacking:
            return
        if not self.config.find_unused_parameters:
            listed = ", ".join(f"{n} (no gradient on {k} of {world} ranks)" for n, k in lacking[:5])
            raise ValueError(
                f"parameters {listed} have no gradient to synchronise (unused in the forward, "
                "or no backward since the last step); set DDPConfig.find_unused_parameters = "
                "True to average them as zeros."
            )
        for (_, p), c in zip(named, counts, strict=True):
            if p.grad is None and c > 0:  # used elsewhere: this rank contributes zeros
                p.grad = torch.zeros_like(p)

    def step(self, optimizer: torch.optim.Optimizer | OptimizerRecipe) -> None:
        """Sync (unless :meth:`sync_gradients` already did), ``optimizer.step()``, then clear
        the gradients for the next accumulation window. An :class:`OptimizerRecipe` is bound to
        this model's parameters on the first step."""
        optimizer = as_optimizer(optimizer, self.module.parameters())
        self.sync_gradients()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self._synced = False

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.module.parameters()


def gradient_buckets(grads: list[torch.Tensor], bucket_size_mb: float) -> list[list[torch.Tensor]]:
    """Consecutive gradients grouped into all-reduce buckets of about ``bucket_size_mb``.

    A bucket holds one dtype and device (it is flattened into one tensor); a gradient larger
    than the cap gets a bucket of its own.

    >>> g = [torch.zeros(1000), torch.zeros(1000), torch.zeros(10, dtype=torch.float64)]
    >>> [len(b) for b in gradient_buckets(g, bucket_size_mb=0.005)]   # 5,000 bytes
    [1, 1, 1]
    >>> [len(b) for b in gradient_buckets(g, bucket_size_mb=25)]
    [2, 1]
    """
    cap = bucket_size_mb * 1024 * 1024
    buckets: list[list[torch.Tensor]] = []
    size = 0.0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        last = buckets[-1][-1] if buckets else None
        if last is None or (last.dtype, last.device) != (g.dtype, g.device) or size + nbytes > cap:
            buckets.append([])
            size = 0.0
        buckets[-1].append(g)
        size += nbytes
    return buckets
