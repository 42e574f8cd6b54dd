"""A SIGTERM that comes while the loop waits for the previous background write must not lose
that write (issue 23, finding 2): the drain the signal handler runs has to find it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from rankwise.train.checkpoint import CheckpointManager, set_fault_hook
from rankwise.train.checkpoint.writer import CheckpointWriter

pytestmark = pytest.mark.timeout(60)


def test_a_drain_during_the_loops_wait_still_waits_for_the_write(tmp_path: Path) -> None:
    release, held = threading.Event(), threading.Event()

    def hold(point: str) -> None:  # the write stays in flight until released
        if point == "before-pointer":
            held.set()
            release.wait(30)

    manager = CheckpointManager(tmp_path)
    writer = CheckpointWriter(
        manager, writes=True, background=True, shared=True, saved=lambda path: None
    )
    previous = set_fault_hook(hold)
    try:
        future = manager.save_async({"w": torch.ones(3)}, epoch=0, step=1)
        assert held.wait(30)
        # The loop's wait for the previous write (the next save's first act), in progress...
        waiting = threading.Thread(target=manager.wait)
        waiting.start()
        waiting.join(0.2)
        assert waiting.is_alive()
        # ... when SIGTERM's handler drains: it must block until the write is on disk.
        threading.Timer(0.5, release.set).start()
        writer.drain()
        assert future.done()
        assert manager.latest() is not None and manager.latest().name.startswith("ckpt")
        waiting.join(10)
    finally:
        release.set()
        set_fault_hook(previous)
