"""The CyxWiz guide on rankwise: ``import rankwise.compat.cyxwiz as cx`` replaces
``import pycyxwiz as cx``.

- ``cx.distributed`` (:mod:`rankwise.compat.cyxwiz.distributed`): ``init`` / ``finalize`` and
  the rank queries, ``DistributedConfig``, ``BackendType``, ``DDPConfig``,
  ``DistributedDataParallel``, ``DistributedSampler``, ``DistributedBatchIterator``,
  ``DistributedTrainer``, ``DistributedTrainingConfig``, ``DistributedTrainingHistory``.
- The Quick Start's model names (:mod:`rankwise.compat.cyxwiz.nn`): ``SequentialModel``,
  ``LinearModule``, ``ReLUModule``, ``CrossEntropyLoss``, ``AdamOptimizer`` (and
  ``SGDOptimizer``).
- ``cx.DistributedSampler`` and ``cx.DistributedBatchIterator`` are also here, at the top.

The guide's ``launch_distributed.sh N cmd...`` is ``scripts/launch_distributed.sh`` (a front
over ``rankwise launch``). See docs/seeds/cyxwiz.md for every call.

>>> import rankwise.compat.cyxwiz as cx
>>> model = cx.SequentialModel()
>>> model.add(cx.LinearModule(784, 256)).add(cx.ReLUModule()).add(cx.LinearModule(256, 10))
SequentialModel(...)
>>> config = cx.distributed.DistributedTrainingConfig()
>>> config.epochs, config.batch_size
(10, 32)
"""

from rankwise.compat.cyxwiz import distributed
from rankwise.compat.cyxwiz.nn import (
    AdamOptimizer,
    CrossEntropyLoss,
    LinearModule,
    ReLUModule,
    SequentialModel,
    SGDOptimizer,
)
from rankwise.compat.cyxwiz.sampler import DistributedSampler
from rankwise.data import DistributedBatchIterator

__all__ = [
    "AdamOptimizer",
    "CrossEntropyLoss",
    "DistributedBatchIterator",
    "DistributedSampler",
    "LinearModule",
    "ReLUModule",
    "SGDOptimizer",
    "SequentialModel",
    "distributed",
]
