"""Wrapping a model for N ranks (``rankwise.parallel``).

Gradient synchronisation is torch's (DDP, comm hooks, FSDP2, autocast, GradScaler); rankwise
adds validated configuration, a gloo-capable bf16 hook, byte counting, one accumulation
context for every strategy, a divergence check, and start-up consistency checks. A training
step::

    import rankwise.parallel as rp

    model = rp.wrap_model(net, rp.DDPConfig(compression="powersgd"))
    optimizer = torch.optim.AdamW(model.parameters())      # after wrapping (FSDP2 needs it)
    precision = rp.Precision("bf16")
    for i, (x, y) in enumerate(batches):
        last = rp.is_sync_step(i, accumulation_steps=4, total=len(batches))
        with rp.accumulate(model, is_last=last):
            with precision.autocast():
                loss = loss_fn(model(x), y) / 4
            precision.backward(loss)
        if last:
            precision.clip_grad_norm_(model, 1.0, optimizer)
            precision.step(optimizer)
            optimizer.zero_grad()
    assert rp.check_parameters_in_sync(model), "ranks diverged"

Where gradients must be synchronised after the backward passes rather than inside them (the
CyxWiz guide's ``backward`` / ``sync_gradients`` / ``update_parameters``), :class:`ExplicitDDP`
accumulates locally and all-reduces once per ``sync_gradients()``; :class:`OptimizerRecipe` (an
optimizer named before its model exists) and :class:`OutputGradientMixin` (a loss whose
``backward(loss)`` gives d loss / d output) go with it.

See ``docs/parallel.md`` for each piece.
"""

from rankwise.parallel.activation import enable_gradient_checkpointing, find_blocks
from rankwise.parallel.common import unwrap_model
from rankwise.parallel.compile import compile_model, is_compiled
from rankwise.parallel.consistency import (
    InconsistentRanksError,
    check_consistent,
    model_signature,
)
from rankwise.parallel.ddp import (
    COMPRESSIONS,
    STRATEGIES,
    DDPConfig,
    accumulate,
    comm_state_dict,
    comm_stats,
    is_sync_step,
    load_comm_state_dict,
    wrap_model,
)
from rankwise.parallel.explicit import ExplicitDDP, gradient_buckets
from rankwise.parallel.fsdp import FSDPConfig, shard_model
from rankwise.parallel.hooks import CommStats, allreduce_hook, bf16_hook, fp16_hook, powersgd_hook
from rankwise.parallel.precision import Precision, clip_grad_norm
from rankwise.parallel.recipes import OptimizerRecipe, OutputGradientMixin, as_optimizer
from rankwise.parallel.sync_check import (
    Mismatch,
    OutOfSyncError,
    SyncReport,
    check_parameters_in_sync,
)

__all__ = [
    "COMPRESSIONS",
    "STRATEGIES",
    "CommStats",
    "DDPConfig",
    "ExplicitDDP",
    "FSDPConfig",
    "InconsistentRanksError",
    "Mismatch",
    "OptimizerRecipe",
    "OutOfSyncError",
    "OutputGradientMixin",
    "Precision",
    "SyncReport",
    "accumulate",
    "allreduce_hook",
    "as_optimizer",
    "bf16_hook",
    "check_consistent",
    "check_parameters_in_sync",
    "clip_grad_norm",
    "comm_state_dict",
    "comm_stats",
    "compile_model",
    "enable_gradient_checkpointing",
    "find_blocks",
    "fp16_hook",
    "gradient_buckets",
    "is_compiled",
    "is_sync_step",
    "load_comm_state_dict",
    "model_signature",
    "powersgd_hook",
    "shard_model",
    "unwrap_model",
    "wrap_model",
]
