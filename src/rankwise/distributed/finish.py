"""When a ``--on-failure continue`` job has finished training: a mark its ranks set, which the
launcher checks.

A process that exits 0 has not necessarily trained to the end: a script may return early on
one rank. So the launcher counts training as finished only once a rank recorded that its
``fit`` completed: :func:`mark_finished` writes ``fit/finished`` in the job's store, before
the process can exit, and :func:`is_finished` is the launcher's check. The value is an
HMAC-SHA256 of the store's nonce under the job's secret (as a joiner's proof is, see
:mod:`rankwise.distributed.membership`): whoever reaches the store but not the secret cannot
say that training finished. ``DistributedTrainer.fit`` calls :func:`mark_finished` itself; a
loop of one's own under continue mode calls it once its training is done.
"""

from __future__ import annotations

import hashlib
import hmac

import torch.distributed as dist

__all__ = ["FINISHED_KEY", "finished_proof", "is_finished", "mark_finished"]

FINISHED_KEY = "fit/finished"
NONCE_KEY = "auth/nonce"  # the launchers put one in the store before any rank starts


def finished_proof(token: str, nonce: str) -> str:
    """The value of :data:`FINISHED_KEY` for the job's secret ``token`` (hex) and ``nonce``.

    >>> len(finished_proof("ab" * 16, "00"))
    64
    """
    message = f"rankwise fit finished {nonce}".encode()
    return hmac.new(bytes.fromhex(token), message, hashlib.sha256).hexdigest()


def _read(store: dist.Store, key: str) -> str:
    return store.get(key).decode() if store.check([key]) else ""


def mark_finished(store: dist.Store, token: str) -> None:
    """Record in the job's ``store`` that this rank's training finished (its ``fit`` completed);
    ``token``: the job's secret (``MemberConfig.job_token``)."""
    store.set(FINISHED_KEY, finished_proof(token, _read(store, NONCE_KEY)))


def is_finished(store: dist.Store, token: str) -> bool:
    """Whether a rank of the job recorded that its training finished, with a valid proof."""
    given = _read(store, FINISHED_KEY)
    return bool(given) and hmac.compare_digest(
        given, finished_proof(token, _read(store, NONCE_KEY))
    )
