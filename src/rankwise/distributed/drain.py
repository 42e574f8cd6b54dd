"""Letting the process group's threads finish before the interpreter goes.

gloo's worker threads (``pt_gloo_runloop``) may still be destroying finished work objects when
the main thread reaches exit: that frees Python-owned tensors (and the Python callbacks of
comm hooks such as PowerSGD), which needs the GIL. If the interpreter is finalising by then,
the thread is torn down mid-destructor and the process dies on SIGABRT ("terminate called
without an active exception") although its work succeeded. The threads outlive
``destroy_process_group``, so the only cure is to give them the GIL before exit:
:func:`drain`, which :func:`rankwise.distributed.finalize` and the exit hooks call.
"""

from __future__ import annotations

import gc
import logging
import os
import time

import torch.distributed as dist

DRAIN_SECONDS = 0.05  # how long drain() releases the GIL
_GLOO_THREADS = {"pt_gloo_runloop", "gloo_tcp_loop"}  # their names in /proc/self/task/*/comm
_log = logging.getLogger(__name__)


def drain() -> None:
    """Release the GIL for ``DRAIN_SECONDS`` so gloo's threads finish, collect garbage, then
    release it again.

    The first wait matters: right after a collective returns, its run-loop thread may still be
    about to drop its work object, which it does holding the group's work lock and which
    needs the GIL (the work's tensors are Python's). A ``gc.collect()`` that destroys the
    group (a DDP reducer's last reference) holds the GIL and waits for that lock: a deadlock
    at exit (seen: a rank hung in ``~ProcessGroupGloo`` under ``gc_collect``, its run loop in
    ``~AsyncAllgatherWork`` waiting for the GIL)."""
    _log.debug("giving the process group's threads %.0f ms to finish", DRAIN_SECONDS * 1e3)
    time.sleep(DRAIN_SECONDS)
    gc.collect()
    time.sleep(DRAIN_SECONDS)


def gloo_threads_alive() -> bool:
    """Whether gloo's threads run in this process (they outlive ``destroy_process_group``).

    Linux names them ``pt_gloo_runloop`` / ``gloo_tcp_loop``; elsewhere: whether a group is live.
    """
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return dist.is_available() and dist.is_initialized()
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().strip() in _GLOO_THREADS:
                    return True
        except OSError:  # the thread ended meanwhile
            continue
    return False
