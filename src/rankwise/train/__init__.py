"""The high-level training loop (``rankwise.train``).

``DistributedTrainer`` trains, ``DistributedTrainingConfig`` says what a run does,
``DistributedTrainingHistory`` records what it did, ``TrainingLogger`` prints and logs it on
rank 0. See ``docs/train.md``.
"""

from rankwise.train.config import DistributedTrainingConfig, parse_overrides
from rankwise.train.history import DistributedTrainingHistory
from rankwise.train.trainer import DistributedTrainer

__all__ = [
    "DistributedTrainer",
    "DistributedTrainingConfig",
    "DistributedTrainingHistory",
    "parse_overrides",
]
