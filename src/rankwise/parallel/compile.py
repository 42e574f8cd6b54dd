"""Compiling a wrapped model with ``torch.compile``, where torch says to apply it.

torch's guide "Where to apply torch.compile?"
(https://docs.pytorch.org/docs/stable/compile/programming_model.where_to_apply_compile.html)
says ``torch.compile`` "doesn't handle distributed wrapper modules like DDP or FSDP very well,
so consider applying torch.compile to the inner module passed to the wrapper", and advises
``module.compile()`` over ``torch.compile(module)``. :func:`compile_model` does exactly that,
after the wrapping:

- DDP: the inner module's forward is compiled. DDP calls it inside its own forward, where
  ``DistributedDataParallel._active_ddp_module`` is set, so Dynamo's DDPOptimizer splits the
  graph at DDP's bucket boundaries and each bucket's all-reduce still overlaps the rest of the
  backward (torch.compiler FAQ, "Do you support Distributed code?"). ``no_sync`` works as in
  eager: DDP decides outside the compiled region whether a backward syncs.
- FSDP2: ``fully_shard`` first, then the sharded root compiles in place (its hooks gather and
  free the parameters around the compiled forward).
- a plain module (a world of one, ``strategy="none"``): its own forward.

In place, never a wrapper: ``state_dict`` keys keep their names (no ``_orig_mod.`` prefix,
which ``torch.compile(module)``'s ``OptimizedModule`` would add), so checkpoints load into
compiled and eager models alike, and the optimizer's parameters stay the same objects.

>>> from torch import nn
>>> net = compile_model(nn.Linear(2, 1), {"backend": "eager"})
>>> list(net.state_dict())
['weight', 'bias']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from rankwise.parallel.common import unwrap_model


def compile_model(model: nn.Module, options: Mapping[str, Any] | None = None) -> nn.Module:
    """Compile ``model``'s forward in place, inside any DDP / DataParallel wrapper; return
    ``model`` (the same object). ``options`` are ``torch.compile``'s keyword arguments
    (``mode``, ``fullgraph``, ``dynamic``, ``backend``, ``options``, ``disable``).

    Compiling is lazy: the first forward traces and compiles (seconds to minutes), and a new
    input shape, dtype, autocast state or ``train()`` / ``eval()`` mode compiles once more.
    """
    target = unwrap_model(model)
    target.compile(**dict(options or {}))
    return model


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` (or the module inside its DDP wrapper) has a compiled forward."""
    return getattr(unwrap_model(model), "_compiled_call_impl", None) is not None
