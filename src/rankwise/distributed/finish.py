"""When a ``--on-failure continue`` job has finished training: a mark its ranks set, which the
launcher checks.

A process that exits 0 has not necessarily trained to the end: a script may return early on
one rank. So the launcher counts training as finished only once a rank recorded that its
``fit`` completed: :func:`mark_finished` writes ``fit/finished`` in the job's store, before
the process can exit, and :func:`is_finished` is the launcher's check. The value is signed
with the job's secret like every value the protocol acts on
(:mod:`rankwise.distributed.signing`): whoever reaches the store but not the secret cannot say
that training finished, and a mark from another job does not count here.
``DistributedTrainer.fit`` calls :func:`mark_finished` itself; a loop of one's own under
continue mode calls ``rd.mark_training_finished()`` once its training is done.
"""

from __future__ import annotations

from rankwise.distributed.contract import Keys
from rankwise.distributed.signing import SignedStore

__all__ = ["FINISHED_KEY", "is_finished", "mark_finished"]

FINISHED_KEY = Keys.FINISHED  # the contract's name (rankwise.distributed.contract)


def mark_finished(store: SignedStore) -> None:
    """Record in the job's store that this rank's training finished (its ``fit`` completed).

    >>> import torch.distributed as dist
    >>> signed = SignedStore(dist.HashStore(), "ab" * 16, job="j1")
    >>> is_finished(signed)
    False
    >>> mark_finished(signed); is_finished(signed)
    True
    """
    store.set(FINISHED_KEY, "1")


def is_finished(store: SignedStore) -> bool:
    """Whether a rank of the job recorded that its training finished, signed with the job's
    secret (a stranger's or garbage value is ignored, with one warning naming the key)."""
    return store.get(FINISHED_KEY) == "1"
