"""The high-level training loop (``rankwise.train``).

``DistributedTrainingConfig`` says what a run does, ``DistributedTrainingHistory`` records what
it did, ``TrainingLogger`` prints and logs it on rank 0. See ``docs/train.md``.
"""

from rankwise.train.config import DistributedTrainingConfig, parse_overrides

__all__ = [
    "DistributedTrainingConfig",
    "parse_overrides",
]
