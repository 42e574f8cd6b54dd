"""Writing the training state's checkpoints during ``fit``: in the background by default.

A save at a step boundary takes the training state's ``state_dict()`` (a collective), copies it into
reused CPU buffers (``staging.py``; pinned on CUDA) and hands the
copy to :meth:`CheckpointManager.save_async`'s one background thread, which writes it exactly
as a synchronous save does: temporary file, fsync, checksum manifest, rename, pointer, pruning.
The loop is held only for the state dict and the copy. At most one write is in flight: a save
that comes before the last one is on disk waits for it, and the wait is counted
(:class:`SaveStats`). The end of ``fit``, an exception and SIGTERM drain the writer, so the
last checkpoint is never silently lost; after a crash (a SIGKILL) the newest *complete*
checkpoint is the one a resume takes, so the work lost is at most one checkpoint interval plus
one write.

``on_checkpoint_saved`` runs once a checkpoint is durable, on every rank: for a background
save that is known at the next save (whose state dict is a collective the writing rank enters
only after its previous write finished) or when ``fit`` drains the writer.

``async_checkpoints=False`` keeps the synchronous save: the writing rank writes, every rank
learns the path and waits at a barrier.

Under ``rankwise launch --on-failure continue`` the writing rank is whoever is rank 0 at the
save (after slot 0 is lost, another process is), and a background write whose writer a later
generation left out is never reported as saved: it may never have landed (the pointer then
still names the previous checkpoint).
"""

from __future__ import annotations

import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import rankwise.distributed as rd
from rankwise.train.checkpoint.files import CheckpointError, CheckpointWarning
from rankwise.train.checkpoint.resume import Location, Manager, broadcast_path
from rankwise.train.checkpoint.storage import StorageError

__all__ = ["CheckpointWriter", "Savable", "SaveStats", "drained_on_sigterm", "writer_for"]


class Savable(Protocol):
    """What a save reads of the training state (:class:`~rankwise.train.TrainState` is one):
    where it is, and its ``state_dict()``."""

    epoch: int
    step: int

    def state_dict(self, *, sharded: bool = False) -> dict[str, Any]: ...


@dataclass
class SaveStats:
    """What checkpoints cost the training loop in one ``fit`` (seconds, this rank)."""

    saves: int = 0
    blocked_seconds: float = 0.0  # the loop held: state dict, copy, and any wait below
    waited_seconds: float = 0.0  # of which: waiting for the previous write to finish
    waits: int = 0  # saves that found the previous write still in flight
    # per save, seconds from its start until file, manifest and pointer were on disk
    durable_after: list[float] = field(default_factory=list)

    @property
    def blocked_per_save(self) -> float:
        return self.blocked_seconds / self.saves if self.saves else 0.0


class CheckpointWriter:
    """Saves the training state (a :class:`Savable`) through ``manager`` for one ``fit``.

    ``writes``: this rank writes files (rank 0, or every rank with per-rank folders); a
    function is asked at each save (rank 0 may change under ``--on-failure continue``);
    ``background``: write on the manager's background thread; ``shared``: one writer for
    all ranks (``save_on_master_only``), whose path the others learn. ``saved(path)`` is called
    on every rank once a checkpoint is durable.
    """

    def __init__(
        self,
        manager: Manager,
        *,
        writes: bool | Callable[[], bool],
        background: bool,
        shared: bool,
        saved: Callable[[Location], None],
    ) -> None:
        self.manager, self.background, self.shared = manager, background, shared
        self._writes = writes
        self.stats = SaveStats()
        self._saved = saved
        self._in_flight: Location | None = None  # a background save not yet known to be durable
        self._written_in: tuple[int, int] | None = None  # its (generation, writer's slot)

    @property
    def writes(self) -> bool:
        """Whether this rank writes the checkpoint files now."""
        return self._writes() if callable(self._writes) else self._writes

    @property
    def never_writes(self) -> bool:
        """Whether this rank writes at no save of this ``fit`` (not rank 0, and rank 0 cannot
        move to it: no ``--on-failure continue``)."""
        return self._writes is False

    def save(self, state: Savable) -> Location | None:
        """Checkpoint ``state`` where it is; a collective. Returns the checkpoint's path (in
        the background: where it is being written)."""
        started = time.perf_counter()
        if self.background:
            self._wait_for_write(started)
        # The writing rank enters it only once its last write ended.
        saved = state.state_dict(sharded=self.manager.sharded)
        self._report_in_flight()
        path: Location | None = None
        if self.background:
            path = self.manager.path_for(state.epoch, state.step)
            if self.writes:
                self.manager.save_async(saved, epoch=state.epoch, step=state.step)
                self._time_write(started)
            self._in_flight, self._written_in = path, _writer_now()
        else:
            if self.writes:
                path = self.manager.save(saved, epoch=state.epoch, step=state.step)
            path = broadcast_path(path) if self.shared else path
            rd.barrier()  # no rank runs ahead of a checkpoint that may not exist yet
        self.stats.saves += 1
        self.stats.blocked_seconds += time.perf_counter() - started
        if self.writes and not self.background:
            self.stats.durable_after.append(time.perf_counter() - started)
        if path is not None and not self.background:
            self._saved(path)
        return path

    def finish(self, state: Savable | None = None) -> None:
        """The end of ``fit``: return once the last checkpoint is durable on disk; a
        collective (every rank waits for the writing rank). Under ``--on-failure continue``,
        a last save whose writer was lost is made again from ``state`` by the new rank 0."""
        if self._in_flight is not None and state is not None and self._writer_lost():
            self._in_flight = None
            self.save(state)
        if self._in_flight is None:
            return
        if self.writes:
            try:
                self.manager.wait()  # re-raises the background write's error
            except StorageError as e:
                raise CheckpointError(
                    f"fit's last checkpoint ({self._in_flight}) could not be made durable: "
                    f"{e} Training finished, but the checkpoint store holds only the previous "
                    "checkpoint: fix the store and train again with resume='auto' (it goes on "
                    "from there)."
                ) from None
        rd.barrier()  # the other ranks learn that the writer is done
        self._report_in_flight()

    def settle(self, state: Savable) -> Location | None:
        """Mid-fit: return once the background save in flight is durable, on every rank (the
        writing rank waits for its write, the others at a barrier; ``saved`` runs as at the
        next save); a collective. Returns its path: None when nothing was in flight, or on
        the writing rank when the store failed past its retries (a warning, as at the next
        save: training goes on). Under ``--on-failure continue`` a save whose writer was lost
        is made again from ``state`` by the new rank 0, as :meth:`finish` does."""
        started = time.perf_counter()
        if self._in_flight is not None and self._writer_lost():
            self._in_flight = None
            self.save(state)
        if self._in_flight is None:
            return None
        path = self._in_flight
        self._wait_for_write(started)  # the writing rank: a failed write is a warning here
        rd.barrier()  # the other ranks learn that the writer is done
        self.stats.blocked_seconds += time.perf_counter() - started
        if self._in_flight is None:  # the write failed (its warning is given)
            return None
        self._report_in_flight()
        return path

    def drain(self) -> None:
        """After an exception or on SIGTERM: wait for the write in flight (it stays a valid
        checkpoint); its own error, if any, is reported as a warning, not raised over the
        error that stopped ``fit``. Local: no collective."""
        if not self.writes or not self.background:
            return
        try:
            self.manager.wait()
        except Exception as e:  # the fit is already failing: say so, do not mask its error
            warnings.warn(
                f"the background checkpoint write failed as well: {type(e).__name__}: {e}",
                CheckpointWarning,
                stacklevel=2,
            )

    def _wait_for_write(self, started: float) -> None:
        if not self.writes:
            return
        pending = self.manager.pending()
        if pending is not None and not pending.done():
            self.stats.waits += 1
        try:
            self.manager.wait()  # re-raises the background write's error
        except StorageError as e:
            # The object store is down past the retries: this checkpoint is lost, training
            # goes on, and the next save tries again (the end of fit insists: finish()).
            warnings.warn(
                f"the checkpoint {self._in_flight} was not saved: {e} Training goes on; "
                "the next checkpoint save tries again.",
                CheckpointWarning,
                stacklevel=4,
            )
            self._in_flight = None
        if pending is not None:
            self.stats.waited_seconds += time.perf_counter() - started

    def _time_write(self, started: float) -> None:
        pending = self.manager.pending()
        if pending is not None:
            done = self.stats.durable_after.append
            pending.add_done_callback(lambda _: done(time.perf_counter() - started))

    def _report_in_flight(self) -> None:
        path, self._in_flight = self._in_flight, None
        if path is not None and not self._writer_lost():
            self._saved(path)

    def _writer_lost(self) -> bool:
        """Whether a generation after the in-flight save's left its writer out (it was lost:
        its write may never have landed)."""
        member = rd.membership()
        if member is None or self._written_in is None:
            return False
        gen, slot = self._written_in
        later = range(gen + 1, member.generation + 1)
        return any(slot not in member.history.get(g, [slot]) for g in later)


def _writer_now() -> tuple[int, int] | None:
    """``(generation, slot of rank 0)`` under ``--on-failure continue``, else None."""
    member = rd.membership()
    return None if member is None else (member.generation, member.members[0])


def writer_for(
    manager: Manager | None, cfg: Any, saved: Callable[[Location], None]
) -> CheckpointWriter | None:
    """The writer ``fit`` saves through under ``cfg`` (None without a checkpoint folder)."""
    if manager is None:
        return None
    return CheckpointWriter(
        manager,
        # sharded (FSDP2): every rank writes its shards into one folder
        # rank 0 writes, as it is at each save: --on-failure continue may make another rank 0
        writes=True
        if manager.sharded or not cfg.save_on_master_only
        else (rd.is_master if rd.membership() is not None else rd.is_master()),
        background=cfg.async_checkpoints,
        shared=manager.sharded or cfg.save_on_master_only,
        saved=saved,
    )


@contextmanager
def drained_on_sigterm(writer: CheckpointWriter | None) -> Iterator[None]:
    """While the block runs, SIGTERM (a launcher's stop, a scheduler's preemption) first waits
    for the checkpoint write in flight, then does what it did before (by default: ends the
    process). Only in the main thread, where Python delivers signals."""
    # A rank that never writes installs no handler: a Python handler runs only once the main
    # thread is back in Python, so one blocked in a collective would not stop at once.
    if writer is None or not writer.background or writer.never_writes:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        writer.drain()
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:  # the default action: end the process, as before
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
