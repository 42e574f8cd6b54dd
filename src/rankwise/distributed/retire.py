"""Letting a broken process group go without waiting for it (``--on-failure continue``).

Teardown never waits for the broken group: gloo has no abort, and destroying a group whose
collectives are still queued behind a frozen peer joins its worker threads, which wait for
that peer until the collective timeout. (This is why torchft runs gloo in a subprocess: the
only sure way to cancel a blocked gloo call is to kill the process that makes it.) Here the
old group is taken out of torch's registry at once and let go in a thread of its own, where
gloo's destructor closes this rank's sockets (the one thing that wakes a peer blocked on it:
``shutdown()`` and ``abort()`` return at once but leave the sockets open); a new default
group is built beside it. Callers drop their own references first (DDP holds the group).
"""

from __future__ import annotations

import contextlib
import gc
import threading

import torch.distributed.distributed_c10d as c10d

__all__ = ["retire_groups"]


def retire_groups() -> None:
    """Forget every group and let it go in a thread of its own (see the module doc): torch's
    ``destroy_process_group()`` for the world, with the backends' teardown off this thread."""
    w = c10d._world
    groups = list(w.pg_names)
    c10d._update_default_pg(None)
    for table in (
        w.pg_map, w.pg_names, w.pg_group_ranks, w.pg_backend_config, w.pg_to_tag,
        w.tags_to_pg, w.pg_coalesce_state,
    ):  # fmt: skip
        table.clear()
    c10d._unregister_all_process_groups()
    w.group_count = 0
    # The last reference goes in the thread: gloo's destructor closes this rank's sockets,
    # which wakes the peers still blocked in one of the broken group's collectives.
    threading.Thread(target=_let_go, args=(groups,), daemon=True).start()


def _let_go(groups: list[object]) -> None:
    for group in groups:
        with contextlib.suppress(Exception):  # already broken: nothing more to stop
            group.shutdown()  # type: ignore[attr-defined]
    groups.clear()
    gc.collect()  # a reference cycle through a failed Work must not keep the sockets open
