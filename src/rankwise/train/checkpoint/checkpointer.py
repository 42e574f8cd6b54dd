"""When ``fit`` saves: every N optimizer steps, every N epochs, and once at the end.

The trainer's loop tells a :class:`Checkpointer` where training is; it decides whether that is
a save, and saves through the background writer (``writer.py``)::

    checkpointer = Checkpointer(manager, cfg, on_saved=report)
    with checkpointer.draining():                 # an exception: the write lands
        for epoch in ...:
            for step in ...:
                ...
                checkpointer.after_step(state, ends_epoch)
            ...                                   # close the epoch: validation, history
            checkpointer.after_epoch(state, epoch)
        checkpointer.at_end(state)                # the last save, durable when it returns

With ``checkpoint_every_n_steps=2``, ``checkpoint_every_n_epochs=0`` and two epochs of 3
steps: step 2 and step 4 are saved at once; step 6 is epoch 1's last, so its save waits until
epoch 1 is closed (and holds epoch 2's start); the end then has nothing left to save.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import rankwise.distributed as rd
from rankwise.train.checkpoint.resume import Location, Manager
from rankwise.train.checkpoint.writer import Savable, SaveStats, writer_for
from rankwise.train.config import DistributedTrainingConfig
from rankwise.train.sigterm import Duty, SigtermGuard

__all__ = ["Checkpointer"]


class Checkpointer:
    """Owns when one ``fit`` saves its training state (a :class:`Savable`), and saves it.

    ``manager``: the checkpoint folder or bucket, or None (no ``checkpoint_dir``: every call does
    nothing). ``cfg``: the fit's config (``checkpoint_every_n_steps``,
    ``checkpoint_every_n_epochs``, ``async_checkpoints``, ``save_on_master_only``).
    ``on_saved(path)`` runs on every rank once a checkpoint is durable; ``on_written(path)``
    only on a rank that wrote it, once its write landed (a drain's too). ``progress`` names the
    save a late rank is stuck in. ``saved_at``: the step the run's newest checkpoint holds
    already (a resume's), which the end of ``fit`` then does not save again. ``sigterm``:
    fit's SIGTERM guard, which then lets the write in flight land first
    (:meth:`sigterm_duty`) and is told when one may be in flight. ``roles``: who writes under
    ``--on-failure continue`` (:class:`rankwise.distributed.Roles`; default: this process's).

    Every save is a collective: the loop calls these methods on every rank at the same
    points.
    """

    def __init__(
        self,
        manager: Manager | None,
        cfg: DistributedTrainingConfig,
        *,
        on_saved: Callable[[Location], None],
        on_written: Callable[[Location], None] = lambda path: None,
        progress: rd.Progress | None = None,
        saved_at: int | None = None,
        sigterm: SigtermGuard | None = None,
        roles: rd.Roles | None = None,
    ) -> None:
        self.writer = writer_for(manager, cfg, on_saved, on_written, roles)
        self.every_n_steps: int = cfg.checkpoint_every_n_steps
        self.every_n_epochs: int = cfg.checkpoint_every_n_epochs
        self.progress = progress
        self.saved_at = saved_at
        self._saved_path: Location | None = None  # the path of the save at saved_at (this fit)
        # fit's SIGTERM guard (rankwise.train.sigterm): told when a write may be in flight
        self.sigterm = sigterm
        if sigterm is not None:
            sigterm.add(self.sigterm_duty())

    @property
    def stats(self) -> SaveStats | None:
        """What the saves cost the loop so far (None without a checkpoint folder)."""
        return None if self.writer is None else self.writer.stats

    def after_step(self, state: Savable, ends_epoch: bool) -> None:
        """After each optimizer step: a save every ``checkpoint_every_n_steps`` steps."""
        every = self.every_n_steps
        if not every or state.step % every:
            return
        if not ends_epoch:
            # An epoch's last step is saved once the epoch is closed (history, epoch scheduler,
            # validation), as the start of the next epoch (after_epoch): saved here, the
            # sampler would have nothing left and a resume would re-enter an epoch that is over.
            self.save(state)

    def after_epoch(self, state: Savable, epoch: int, *, durable: bool = False) -> Location | None:
        """Once ``epoch`` is closed (``state`` is at the next one's start): a save every
        ``checkpoint_every_n_epochs`` epochs, or the step save deferred by :meth:`after_step`.
        Returns the save's path, or None when the epoch saved nothing.

        ``durable``: the save has landed when this returns, on every rank (a background write
        is waited for, as at the end of ``fit``), for a callback that hands the epoch's
        checkpoint on (``on_epoch_saved``: Ray's report). Then None also when the write
        failed past the store's retries (a warning, on the writing rank; training goes on).
        """
        every = self.every_n_epochs
        path = None
        if (every and (epoch + 1) % every == 0) or self._step_save_deferred(state):
            path = self.save(state)
        if durable and path is not None and self.writer is not None and self.writer.background:
            path = self.writer.settle(state)
        return path

    def _step_save_deferred(self, state: Savable) -> bool:
        """Whether the epoch's last step is due a step save (deferred by :meth:`after_step`)
        that has not been made: from the state, the same on every rank (under continue mode
        a survivor that took a peer's state after a regroup never ran that step's
        ``after_step``)."""
        every = self.every_n_steps
        return bool(every) and state.step % every == 0 and self.saved_at != state.step

    def at_end(self, state: Savable) -> Location | None:
        """After the last epoch: a save unless the last step is saved already, then return once
        the last checkpoint is durable (every rank waits for the writing rank). Returns the
        save's path (called again: the same; None: no save of this step in this fit). Safe to call again after a lost peer under
        ``--on-failure continue``: nothing is saved twice."""
        path = self.save(state) if self.saved_at != state.step else self._saved_path
        if self.writer is not None:
            self.writer.finish(state)
        return path

    def save(self, state: Savable) -> Location | None:
        """Save the training state where it is (mid-epoch: with the cursor and the sums);
        return the checkpoint's path (in the background: where it is being written)."""
        if self.writer is None:
            return None
        if self.progress is not None:
            self.progress.mark(f"the checkpoint save at step {state.step}")
        path = self.writer.save(state)
        self.saved_at, self._saved_path = state.step, path
        self.regrouped()  # a write in flight now: SIGTERM waits for it
        return path

    def snapshot(self) -> tuple[object, ...]:
        """What decides this checkpointer's next saves (which step is saved, which write is
        in flight), the same on every rank; for a closing section that a lost peer makes
        every survivor do again (rankwise.train.closings)."""
        kept = self.writer.snapshot() if self.writer is not None else ()
        return (self.saved_at, self._saved_path, *kept)

    def restore(self, snapshot: tuple[object, ...]) -> None:
        """Back to :meth:`snapshot`'s choices: the retried section saves what it first would
        have (a checkpoint that did land is written again, under the same name)."""
        self.saved_at, self._saved_path = snapshot[:2]  # type: ignore[assignment]
        if self.writer is not None:
            self.writer.restore(snapshot[2:])

    def check_folder(self) -> None:
        """Before the first step (a collective): the folder is writable, or every rank stops
        naming the path and the OS error (not at the first save's end, an interval later)."""
        if self.writer is not None:
            self.writer.check_folder()

    def regrouped(self) -> None:
        """This rank's role may have changed (``--on-failure continue``: rank 0 is another
        process now): SIGTERM waits for a write only where one can be in flight."""
        if self.sigterm is not None:
            self.sigterm.update()

    def sigterm_duty(self) -> Duty | None:
        """On SIGTERM, the background write in flight lands first (None: no background
        writes); for fit's guard, which :meth:`regrouped` keeps up to date."""
        return (
            None
            if self.writer is None or not self.writer.background
            else (self.writer.sigterm_duty())
        )

    @contextmanager
    def draining(self) -> Iterator[None]:
        """When the block ends, by an exception too, the write in flight still lands (its own
        error is a warning, not raised over the block's)."""
        try:
            yield
        finally:
            if self.writer is not None:
                self.writer.drain()
