"""The high-level training loop (``rankwise.train``).

``DistributedTrainingConfig`` says what a run does, ``DistributedTrainingHistory`` records what
it did, ``TrainingLogger`` prints and logs it on rank 0. See ``docs/train.md``.
"""

from rankwise.train.config import DistributedTrainingConfig, parse_overrides
from rankwise.train.history import DistributedTrainingHistory
from rankwise.train.loggers import TrainingLogger

__all__ = [
    "DistributedTrainingConfig",
    "DistributedTrainingHistory",
    "TrainingLogger",
    "parse_overrides",
]
