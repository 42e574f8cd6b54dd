"""The high-level training loop (``rankwise.train``).

``DistributedTrainer`` trains, ``DistributedTrainingConfig`` says what a run does,
``DistributedTrainingHistory`` records what it did, ``TrainingLogger`` prints and logs it on
rank 0 (CSV, TensorBoard, and the experiment trackers of :mod:`rankwise.train.tracking`:
W&B, MLflow; a failing one gives a ``TrackerWarning``); ``AuditLog`` (opt-in) records which samples each rank consumed per step;
``RayReport`` reports each epoch's metrics and checkpoint to Ray Train (``rankwise[ray]``);
``ConfigTree`` reads a script's own nested YAML settings. ``TrainState`` is where training is
(``trainer.state``: what a checkpoint holds, what ``broadcast_state`` sends to another rank);
``SaveStats`` what background checkpoint saves cost the loop. See ``docs/train.md``.

Checkpoints (:mod:`rankwise.train.checkpoint`, a package): atomic, verified files; a manager
with a ``latest`` pointer and pruning; model / optimizer / RNG state independent of the
wrapping; the ``Checkpointer`` that decides when ``fit`` saves.
"""

from rankwise.train.audit import AuditLog, AuditReport, read_audit
from rankwise.train.checkpoint import (
    FAULT_POINTS,
    FORMAT_VERSION,
    CheckpointError,
    CheckpointManager,
    CheckpointWarning,
    SaveStats,
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
from rankwise.train.config import DistributedTrainingConfig, parse_overrides
from rankwise.train.config.tree import ConfigKeyError, ConfigTree
from rankwise.train.state import TrainState, broadcast_state
from rankwise.train.tracking import (
    DistributedTrainingHistory,
    RayReport,
    TrackerWarning,
    TrainingLogger,
    rankwise_checkpoint,
)
from rankwise.train.trainer import DistributedTrainer

__all__ = [
    "FAULT_POINTS",
    "FORMAT_VERSION",
    "AuditLog",
    "AuditReport",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointWarning",
    "ConfigKeyError",
    "ConfigTree",
    "DistributedTrainer",
    "DistributedTrainingConfig",
    "DistributedTrainingHistory",
    "RayReport",
    "SaveStats",
    "TrackerWarning",
    "TrainState",
    "TrainingLogger",
    "broadcast_state",
    "find_latest",
    "load_file",
    "load_model_state_dict",
    "load_optimizer_state_dict",
    "model_state_dict",
    "optimizer_state_dict",
    "parse_overrides",
    "rankwise_checkpoint",
    "read_audit",
    "rng_state",
    "save_file",
    "set_rng_state",
    "verify_file",
]
