"""Writing the training state's checkpoints during ``fit``: in the background by default.

A save at a step boundary takes the training state's ``state_dict()`` (a collective), copies it
into reused CPU buffers (``staging.py``; pinned on CUDA) and hands the copy to
:meth:`CheckpointManager.save_async`'s one background thread, which writes it exactly as a
synchronous save does: temporary file, fsync, checksum manifest, rename, pointer, pruning. The
loop is held only for the state dict and the copy. At most one write is in flight: a save that
comes before the last one is on disk waits for it, and the wait is counted (:class:`SaveStats`);
to an object store (plain checkpoints, under continue mode too) it queues its snapshot behind
the running write instead, the newest state winning, so a store that does not answer never holds the
loop (one warning names it, after :data:`SILENT_S`); the end of ``fit`` waits
``checkpoint_final_wait_s`` at most. Any failure of a write, whatever the writing library
raised, is one :class:`CheckpointWriteError` naming the file and the cause. The end of ``fit``,
an exception and SIGTERM drain the writer, so the last checkpoint is never silently lost; after
a crash (a SIGKILL) the newest *complete* checkpoint is the one a resume takes, so the work lost
is at most one checkpoint interval plus one write.

``on_checkpoint_saved`` runs once a checkpoint is durable, on every rank: for a background
save that is known at the next save (whose state dict is a collective the writing rank enters
only after its previous write finished) or when ``fit`` drains the writer.
``written(path)`` (the trainer's ``on_checkpoint_written``, what the audit records) runs only
on a rank that wrote the checkpoint, once the write landed: also a write that a drain on an
exception or on SIGTERM waited for, and never a write the store refused past its retries.

``async_checkpoints=False`` keeps the synchronous save: the writing rank writes, every rank
learns the path and waits at a barrier.

Under ``rankwise launch --on-failure continue`` the writing rank is whoever is rank 0 at the
save (after slot 0 is lost, another process is), and a background write whose writer a later
generation left out is never reported as saved: it may never have landed (the pointer then
still names the previous checkpoint). Whoever *started* a write waits for it and reports it,
whatever its role now: a rank 0 that still writes queues behind its own write (to a store) as
outside continue mode; when slot 0 rejoins while the old rank 0 still writes, the old rank 0
finishes that write before the next save's collective (so the pointer never goes back), within
``checkpoint_final_wait_s`` (then every rank stops, naming the store), and raises its error. A write that fails stops every rank at the next save (or the end of
``fit``) with the same :class:`CheckpointWriteError`, naming the file and the OS error: under
continue mode, never a lost peer that the next writer would repeat.

On SIGTERM the write in flight lands first (:meth:`CheckpointWriter.sigterm_duty`, a duty of
``rankwise.train.sigterm``'s guard): wanted only where a write can be in flight (this rank
writes now, or its last write has not been waited for; re-decided at each save and regroup).
"""

from __future__ import annotations

import concurrent.futures
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist

import rankwise.distributed as rd
from rankwise.distributed.interrupt import owned_by
from rankwise.storage import StorageError
from rankwise.train.checkpoint.errors import CheckpointError, CheckpointWarning
from rankwise.train.checkpoint.resume import Location, Manager, broadcast_path
from rankwise.train.sigterm import Duty

__all__ = [
    "CheckpointWriteError",
    "CheckpointWriter",
    "Savable",
    "SaveStats",
    "writer_for",
]


_STOP_FIX = (
    " The run stops here (every rank); the previous checkpoint is intact: free space or fix "
    "the folder's permissions, then relaunch with resume='auto'."
)
# A store silent this long (seconds; no answer, no upload progress) while a save queues behind
# its write is announced (once per outage); a shorter wait is a busy store, not an outage.
SILENT_S = 5.0
_STORE_FIX = (
    " The run stops here (every rank); the previous checkpoint is intact: fix the store (see "
    "above), then relaunch with resume='auto'."
)


class CheckpointWriteError(CheckpointError, OSError):
    """A checkpoint could not be written (a full disk, a read-only folder, a store that failed
    or did not answer in time): the run stops, on every rank, naming the file and the cause,
    whatever the writing library raised (an ``OSError``, torch's ``RuntimeError``, a store's
    error). An ``OSError`` too, as most such failures are."""


def describe(exc: BaseException) -> str:
    """What made a write fail, for a message: the OS error at its root where there is one
    (torch reports a full disk as ``RuntimeError: ... unexpected pos`` raised while handling
    the ``OSError``), then what followed it; else the exception's type and message.

    >>> try:
    ...     try:
    ...         raise OSError(28, "No space left on device")
    ...     except OSError:
    ...         raise RuntimeError("unexpected pos 704 vs 598")
    ... except RuntimeError as e:
    ...     describe(e)
    '[Errno 28] No space left on device (then RuntimeError: unexpected pos 704 vs 598)'
    """
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and not isinstance(cause, StorageError):
            return str(cause) if cause is exc else f"{cause} (then {type(exc).__name__}: {exc})"
        # a cause kept out on purpose (``raise ... from None``: unscrubbed) stays out
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    return str(exc) if isinstance(exc, StorageError) else f"{type(exc).__name__}: {exc}"


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
    # of which: waiting for a write in flight (at the next save, a settle or the end of fit)
    waited_seconds: float = 0.0
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
    on every rank once a checkpoint is durable; ``written(path)`` only on a rank that wrote it,
    once its write landed (a drain's too; maybe on the SIGTERM guard's helper thread).
    ``roles``: who writes and who is still in under ``--on-failure continue`` (default: this
    process's, :meth:`rankwise.distributed.Roles.for_this_process`).
    """

    def __init__(
        self,
        manager: Manager,
        *,
        writes: bool | Callable[[], bool],
        background: bool,
        shared: bool,
        saved: Callable[[Location], None],
        final_wait_s: float = 600.0,
        written: Callable[[Location], None] = lambda path: None,
        roles: rd.Roles | None = None,
    ) -> None:
        self.manager, self.background, self.shared = manager, background, shared
        self.roles = rd.Roles.for_this_process() if roles is None else roles
        self._writes = writes
        self.stats = SaveStats()
        self._saved = saved
        self._reported: set[str] = set()  # the checkpoints ``saved`` was told of (once each)
        self.final_wait_s = final_wait_s
        self._written = written
        self._recorded: set[str] = set()  # the writes ``written`` was told of (once each)
        self._in_flight: Location | None = None  # a background save not yet known to be durable
        self._written_in: tuple[int, int] | None = None  # its (generation, writer's slot)
        # queued saves (see _queues): this rank's writes not yet reported, oldest first
        self._flights: list[tuple[Location, concurrent.futures.Future[Any]]] = []
        self._stalled = False  # the store's silence was announced (once per outage)
        self._gave_up = False  # the end of fit waited final_wait_s in vain (said in its error)

    def _queues(self) -> bool:
        """Whether a save that finds the last write still running queues behind it instead of
        waiting (the newest state wins): background writes of plain checkpoints to an object
        store, whose silence must not hold the loop; under ``--on-failure continue`` too, while
        the rank that started the write is still the one that writes (see :meth:`_role_moved`).
        A local folder waits (its writes end); sharded saves are collectives of DCP's."""
        return self.background and self.manager.may_stall and not self.manager.sharded

    def _role_moved(self) -> bool:
        """Under ``--on-failure continue``: this rank started a write that is not waited for
        yet, but no longer writes (a regroup made another rank rank 0). It finishes that write
        before the next save's collective, so the new writer's checkpoint is never followed by
        an older one (the pointer never goes back); that wait is bounded by
        ``checkpoint_final_wait_s``."""
        return self.manager.pending() is not None and not self.writes

    @property
    def writes(self) -> bool:
        """Whether this rank writes the checkpoint files now."""
        return self._writes() if callable(self._writes) else self._writes

    @property
    def may_have_write_in_flight(self) -> bool:
        """Whether a background write of this rank can be in flight now: it writes now, or the
        write it started (maybe under another role) has not been waited for."""
        return self.background and (self.writes or self.manager.pending() is not None)

    def snapshot(self) -> tuple[object, ...]:
        """The save in flight as every rank knows it (:meth:`Checkpointer.snapshot`)."""
        return (self._in_flight, self._written_in)

    def restore(self, snapshot: tuple[object, ...]) -> None:
        self._in_flight, self._written_in = snapshot  # type: ignore[assignment]

    def check_folder(self) -> None:
        """Before the first step (a collective): every rank that may write probes the folder
        (under ``--on-failure continue`` any rank may become rank 0); one that cannot write
        stops every rank with :class:`CheckpointWriteError`, naming the path and the error."""
        may_write = self.writes or self.roles.continuing
        failed = self.manager.probe() if may_write else None
        self._agree(None if failed is None else f"{failed}.{_STOP_FIX}")

    def save(self, state: Savable) -> Location | None:
        """Checkpoint ``state`` where it is; a collective. Returns the checkpoint's path (in
        the background: where it is being written)."""
        started = time.perf_counter()
        if self.background:
            self._agree(self._wait_for_write(started))
        # The writing rank enters it only once its last write ended.
        saved = state.state_dict(sharded=self.manager.sharded)
        self._report_in_flight()
        path: Location | None = None
        if self.background:
            path = self.manager.path_for(state.epoch, state.step)
            if self.writes:
                queued = self._queues()
                future = self.manager.save_async(
                    saved, epoch=state.epoch, step=state.step, behind=queued
                )
                if queued:
                    self._flights.append((path, future))
                self._time_write(started, future)
            self._in_flight, self._written_in = path, self.roles.writer_now()
        else:
            error = None
            if self.writes:
                try:
                    path = self.manager.save(saved, epoch=state.epoch, step=state.step)
                except Exception as exc:  # whatever the writing library raised: every rank stops
                    where = self.manager.path_for(state.epoch, state.step)
                    error = _failed(where, exc)
                else:
                    self._record_written(path)
            self._agree(error)
            path = broadcast_path(path) if self.shared else path
            rd.barrier()  # no rank runs ahead of a checkpoint that may not exist yet
        self.stats.saves += 1
        self.stats.blocked_seconds += time.perf_counter() - started
        if self.writes and not self.background:
            self.stats.durable_after.append(time.perf_counter() - started)
        if path is not None and not self.background:
            self._report(path)
        return path

    def finish(self, state: Savable | None = None) -> None:
        """The end of ``fit``: return once the last checkpoint is durable on disk; a
        collective (every rank waits for the writing rank). Under ``--on-failure continue``,
        a last save whose writer was lost is made again from ``state`` by the new rank 0."""
        self._redo_lost_write(state)
        if self._in_flight is None:
            return
        started = time.perf_counter()
        self._agree(self._wait_for_write(started, final=True))  # all learn it
        self.stats.blocked_seconds += time.perf_counter() - started  # fit held: as settle's
        self._report_in_flight()
        self._in_flight, self._stalled = None, False

    def settle(self, state: Savable) -> Location | None:
        """Mid-fit: return once the background save in flight is durable, on every rank (the
        writing rank waits for its write, the others at a barrier; ``saved`` runs as at the
        next save); a collective. Returns its path: None when nothing was in flight, or on
        the writing rank when the store failed past its retries (a warning, as at the next
        save: training goes on). Under ``--on-failure continue`` a save whose writer was lost
        is made again from ``state`` by the new rank 0, as :meth:`finish` does."""
        started = time.perf_counter()
        self._redo_lost_write(state)
        if self._in_flight is None:
            return None
        path = self._in_flight
        # The writing rank waits (a store down past its retries is a warning here, a failed
        # local write stops every rank); the others learn that it is done.
        self._agree(self._wait_for_write(started, block=True))
        self.stats.blocked_seconds += time.perf_counter() - started
        lost = self._in_flight is None  # the write failed (its warning is given)
        if lost and not self._queues():
            return None
        self._report_in_flight()  # queued saves: a collective (the landed ones are broadcast)
        self._in_flight = None  # every write ended: on every rank
        return None if lost else path

    def _redo_lost_write(self, state: Savable | None) -> None:
        """Under ``--on-failure continue``: the save in flight, whose writer was lost, made
        again from ``state`` by the new rank 0 (every rank calls it: the save is a collective)."""
        if self._in_flight is not None and state is not None and self._writer_lost():
            self._in_flight = None
            self.save(state)

    def drain(self) -> None:
        """After an exception or on SIGTERM: wait for the write in flight (it stays a valid
        checkpoint); its own error, if any, is reported as a warning, not raised over the
        error that stopped ``fit``. Local: no collective."""
        if not self.background or self.manager.pending() is None:  # whoever started a write
            return
        if self._gave_up:  # the end of fit waited for it already: its error says so
            return
        pending = self.manager.pending()
        try:
            landed = self.manager.wait(self.final_wait_s)
        except Exception as e:  # the fit is already failing: say so, do not mask its error
            late = isinstance(e, TimeoutError) and pending is not None and not pending.done()
            said = (
                f"did not end within checkpoint_final_wait_s={self.final_wait_s:g} s "
                f"({self.manager.directory} did not answer)"
                if late
                else f"failed as well: {type(e).__name__}: {e}"
            )
            warnings.warn(
                f"the background checkpoint write {said}", CheckpointWarning, stacklevel=2
            )
        else:
            if landed is not None:
                self._record_written(landed)

    def sigterm_duty(self) -> Duty:
        """On SIGTERM (:mod:`rankwise.train.sigterm`): the write in flight (and the snapshot
        queued behind it) lands first, within ``checkpoint_final_wait_s`` in all, wanted
        only where one can be in flight. It may run on the guard's helper thread while the
        main thread is blocked in a collective, so it waits for the write without taking it
        from the manager, and says if the write failed: the process is ending anyway."""

        def await_write() -> None:
            # A local manager's future holds a Path, a remote one's a URL: either way one write.
            pending: concurrent.futures.Future[Any] | None = self.manager.pending()
            if pending is None:
                return
            queued = [future for _, future in list(self._flights) if future is not pending]
            concurrent.futures.wait([pending, *queued], timeout=self.final_wait_s)
            if not all(future.done() for future in (pending, *queued)):
                print(
                    "rankwise: the background checkpoint write did not end within "
                    f"checkpoint_final_wait_s={self.final_wait_s:g} s; ending without it",
                    file=sys.stderr,
                    flush=True,
                )
                return
            for future in (pending, *queued):  # oldest first; a replaced one never ran
                if future.cancelled():
                    continue
                if future.exception() is not None:
                    print(
                        "rankwise: the background checkpoint write failed as well: "
                        f"{future.exception()}",
                        file=sys.stderr,
                        flush=True,
                    )
                else:
                    self._record_written(future.result())

        return Duty(
            "the checkpoint write in flight", lambda: self.may_have_write_in_flight, await_write
        )

    def _wait_for_write(
        self, started: float, final: bool = False, block: bool = False
    ) -> str | None:
        """Wait for the writes this rank started, whatever its role now; return an error as
        the message every rank raises (None: no write, or they landed, or a store's failure
        that is a warning). Queued saves (:meth:`_queues`) are not waited for while one still
        runs (unless ``block``; one warning names the store's silence); the end of ``fit``
        (``final``) waits at most ``final_wait_s`` seconds in all."""
        pending = self.manager.pending()
        if pending is None:
            return None
        moved = self._role_moved()
        if moved:  # its queued snapshots are older than the new writer's next one: dropped
            for _, future in self._flights[1:]:
                future.cancel()
        patient = final or block or moved or not self._queues()
        if not pending.done() and patient:
            self.stats.waits += 1
        deadline = time.monotonic() + self.final_wait_s if final or moved else None
        try:
            while (pending := self.manager.pending()) is not None:
                if not patient and not pending.done():
                    self._warn_unanswered()
                    return None
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                where = self._location_of(pending)
                try:
                    landed = self.manager.wait(left, first=True)  # re-raises the write's error
                except StorageError as e:
                    if final:
                        return (
                            f"fit's last checkpoint ({self._in_flight or where}) could not be made durable: {e} "
                            "Training finished, but the checkpoint store holds only the "
                            "previous checkpoint: fix the store and train again with "
                            "resume='auto' (it goes on from there)."
                        )
                    # The object store is down past the retries: this checkpoint is lost,
                    # training goes on, and the next save tries again (the end of fit insists).
                    warnings.warn(
                        f"the checkpoint {where} was not saved: {e} Training goes on; "
                        "the next checkpoint save tries again.",
                        CheckpointWarning,
                        stacklevel=4,
                    )
                    if where == self._in_flight:
                        self._in_flight = None
                except Exception as exc:  # any library's error: every rank stops, naming it
                    if isinstance(exc, TimeoutError) and not pending.done() and not final:
                        self._gave_up = True  # the role moved while it ran: bounded as well
                        return (
                            f"the checkpoint write of {where}, started by this process while it "
                            "was rank 0, did not end within checkpoint_final_wait_s="
                            f"{self.final_wait_s:g} s after a regroup made another rank rank 0: "
                            f"{self.manager.directory} did not answer. The run stops here "
                            "(every rank) rather than let the new rank 0's checkpoint be "
                            "followed by an older one: fix the store (or raise "
                            "checkpoint_final_wait_s for a slow one), then relaunch with "
                            "resume='auto'."
                        )
                    if isinstance(exc, TimeoutError) and not pending.done():
                        self._gave_up = True
                        return (
                            f"fit's last checkpoint ({self._in_flight}) was not durable within "
                            f"checkpoint_final_wait_s={self.final_wait_s:g} s: "
                            f"{self.manager.directory} did not answer. Training finished, but "
                            "only the checkpoints written before are there: raise "
                            "checkpoint_final_wait_s for a slow store, or fix the store, and "
                            "train again with resume='auto'."
                        )
                    return _failed(where, exc)
                else:
                    if landed is not None:
                        self._record_written(landed)
            self._stalled = False  # every write ended: a later silence is a new outage
        finally:
            self.stats.waited_seconds += time.perf_counter() - started
        return None

    def _location_of(self, pending: concurrent.futures.Future[Any]) -> Location:
        """The checkpoint ``pending`` writes (for messages)."""
        for path, future in self._flights:
            if future is pending:
                return path
        return self._in_flight or self.manager.directory

    def _warn_unanswered(self) -> None:
        """A save point found the last write still running (queued saves): once per outage
        (a store silent for :data:`SILENT_S` or more), say which store has not answered for
        how long; the loop goes on."""
        silent = getattr(self.manager, "unanswered_for", lambda: 0.0)()
        if self._stalled or silent < SILENT_S:
            return
        self._stalled = True
        running = self.manager.pending()
        where = self._in_flight if running is None else self._location_of(running)
        warnings.warn(
            f"the checkpoint store {self.manager.directory} has not answered for {silent:.0f} s "
            f"(the write of {where} still runs). Training "
            "goes on: each save now snapshots the state and queues it behind that write, a "
            "newer save replacing an older queued one (the newest state wins); the end of fit "
            "waits at most checkpoint_final_wait_s for it.",
            CheckpointWarning,
            stacklevel=5,
        )

    def _agree(self, error: str | None) -> None:
        """Every rank learns whether a write failed (a collective in a world of more than
        one): all raise the same :class:`CheckpointWriteError`, so under continue mode no
        survivor takes it for a lost peer and makes the next writer fail the same way."""
        failed, src = error is not None, rd.get_rank()
        if rd.get_world_size() > 1 and rd.has_group():
            flag = torch.tensor([rd.get_rank() + 1 if failed else 0], device=rd.collective_device())
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            failed, src = bool(flag.item()), int(flag.item()) - 1
            if failed:
                error = rd.broadcast_plain(error, src=src)
        if not failed:
            return
        self.roles.stop_joiners(str(error))  # a rank asking to join gives up at once
        # the writer's traceback says it once; the others end with one line (issue 33)
        mine = CheckpointWriteError(str(error))
        raise owned_by(mine, src, rd.get_rank(), f"rank {src}'s checkpoint write failed")

    def _report(self, path: Location) -> None:
        """``saved(path)`` once per checkpoint (a closing section done again after a lost
        peer writes the same checkpoint again: rankwise.train.closings)."""
        _once(self._reported, path, self._saved)

    def _record_written(self, path: Location) -> None:
        """``written(path)`` on this rank, which wrote ``path`` and saw it land; once per
        checkpoint, whichever wait saw it first (a drain, the SIGTERM duty, the next save)."""
        _once(self._recorded, path, self._written)

    def _time_write(self, started: float, future: concurrent.futures.Future[Any]) -> None:
        done = self.stats.durable_after.append

        def landed(ended: concurrent.futures.Future[Any]) -> None:
            if not ended.cancelled() and ended.exception() is None:
                done(time.perf_counter() - started)

        future.add_done_callback(landed)

    def _report_in_flight(self) -> None:
        if self._queues():
            self._report_landed()
            return
        path, self._in_flight = self._in_flight, None
        if path is not None and not self._writer_lost():
            self._report(path)

    def _report_landed(self) -> None:
        """Queued saves: ``saved`` for each of this rank's writes that landed since the last
        report, in order (a save replaced before it started never is); with one writer for
        all ranks, every rank learns the list from whichever rank started those writes (a
        collective: under ``--on-failure continue`` that is not always rank 0 now)."""
        landed: list[Location] = []
        for path, future in self._flights:
            if future.done() and not future.cancelled() and future.exception() is None:
                landed.append(path)
        self._flights = [(path, future) for path, future in self._flights if not future.done()]
        for path in landed:  # this rank's own writes (the others learn them just below)
            self._record_written(path)
        if self.shared and rd.get_world_size() > 1 and rd.has_group():
            gathered = rd.all_gather_plain([str(p) for p in landed])
            landed = sorted({path for paths in gathered for path in paths})  # names sort by step
        for path in landed:
            self._report(path)

    def _writer_lost(self) -> bool:
        """Whether a generation after the in-flight save's left its writer out (it was lost:
        its write may never have landed)."""
        return self.roles.writer_left_out(self._written_in)


def _once(told: set[str], path: Location, tell: Callable[[Location], None]) -> None:
    """``tell(path)`` unless ``told`` holds it already (then it does)."""
    if str(path) not in told:
        told.add(str(path))
        tell(path)


def _failed(where: Location, exc: BaseException) -> str:
    """The message every rank raises when writing ``where`` failed with ``exc``."""
    fix = _STORE_FIX if isinstance(exc, StorageError) else _STOP_FIX
    return f"writing the checkpoint {where} failed: {describe(exc).rstrip('.')}.{fix}"


def writer_for(
    manager: Manager | None,
    cfg: Any,
    saved: Callable[[Location], None],
    written: Callable[[Location], None] = lambda path: None,
    roles: rd.Roles | None = None,
) -> CheckpointWriter | None:
    """The writer ``fit`` saves through under ``cfg`` (None without a checkpoint folder);
    ``roles``: this process's (:class:`rankwise.distributed.Roles`; default: built here)."""
    if manager is None:
        return None
    roles = rd.Roles.for_this_process() if roles is None else roles
    return CheckpointWriter(
        manager,
        # sharded (FSDP2): every rank writes its shards into one folder
        # rank 0 writes, as it is at each save: --on-failure continue may make another rank 0
        writes=True
        if manager.sharded or not cfg.save_on_master_only
        else (roles.writes_shared if roles.continuing else rd.is_master()),
        background=cfg.async_checkpoints,
        shared=manager.sharded or cfg.save_on_master_only,
        saved=saved,
        final_wait_s=cfg.checkpoint_final_wait_s,
        written=written,
        roles=roles,
    )
