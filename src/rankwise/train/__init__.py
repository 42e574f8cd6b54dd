"""The high-level training loop (``rankwise.train``): config, trainer, history, checkpoints.

Checkpoints (:mod:`rankwise.train.checkpoint`): atomic, verified files; a manager with a
``latest`` pointer and pruning; model / optimizer / RNG state independent of the wrapping.
"""

from rankwise.train.checkpoint import (
    FAULT_POINTS,
    FORMAT_VERSION,
    CheckpointError,
    CheckpointManager,
    CheckpointWarning,
    find_latest,
    load_file,
    load_model_state_dict,
    load_optimizer_state_dict,
    model_state_dict,
    optimizer_state_dict,
    rng_state,
    save_file,
    set_rng_state,
    verify_file,
)

__all__ = [
    "FAULT_POINTS",
    "FORMAT_VERSION",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointWarning",
    "find_latest",
    "load_file",
    "load_model_state_dict",
    "load_optimizer_state_dict",
    "model_state_dict",
    "optimizer_state_dict",
    "rng_state",
    "save_file",
    "set_rng_state",
    "verify_file",
]
