"""What a rank finishes on SIGTERM before it ends (a launcher's stop, a scheduler's preemption).

``fit`` holds two kinds of work that must not die with the process: the checkpoint write in
flight (it lands, and stays the checkpoint a resume takes: ``checkpoint/writer.py``) and, on
rank 0, the experiment trackers' runs (closed as failed, not left "running" for good:
``tracking/``). Each is a :class:`Duty`, with a test of whether this rank holds it now.

A :class:`SigtermGuard` installs a SIGTERM handler only while some duty is wanted (re-decided
with :meth:`~SigtermGuard.update` at each save and regroup); elsewhere the default action ends
the process at once, as before. On SIGTERM it runs the wanted duties, in order, then does what
SIGTERM did before (by default: ends the process, exit status 143).

A Python handler runs only once the main thread is back in Python, so a rank blocked in a
collective (its peer is gone, the launcher is stopping everyone) would ignore the signal: a
helper thread is woken by it too (``signal.set_wakeup_fd``) and, where the main thread has not
taken the signal within :data:`MAIN_THREAD_GRACE_S`, runs the duties itself and ends the
process. Duties run once, whichever thread gets there first.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["Duty", "SigtermGuard", "end_by_sigterm", "guarded"]

MAIN_THREAD_GRACE_S = 0.5  # a main thread in Python takes its handler in microseconds


@dataclass(frozen=True)
class Duty:
    """Work to finish on SIGTERM: ``run()`` where ``wanted()`` says this rank holds it now.
    ``if_ending``: only where SIGTERM ends the process (its default action); a program that
    ignores SIGTERM or handles it itself goes on, and so must this (the trackers' runs)."""

    what: str
    wanted: Callable[[], bool]
    run: Callable[[], None]
    if_ending: bool = False


class SigtermGuard:
    """SIGTERM while this rank holds a :class:`Duty`: finish it, then end as before. Main
    thread only (a call from another thread does nothing)."""

    def __init__(self, duties: Sequence[Duty]) -> None:
        self.duties = list(duties)
        self.previous: Any = None
        self.installed = False
        self._wakeup: tuple[int, int] | None = None  # (read, write) ends of the wakeup pipe
        self._old_wakeup = -1
        self._taken = threading.Event()  # the main thread's handler has started
        self._lock = threading.RLock()  # re-entrant: a handler may run inside a duty
        self._done = False
        self._running: int | None = None  # the thread running the duties now
        self._deferring = 0  # main thread inside deferred(): a SIGTERM waits for its end
        self._pending = False

    def add(self, duty: Duty | None) -> None:
        """Hold ``duty`` too, after the ones given (None: nothing); what the guard installs is
        re-decided at once. The owners of duties take the guard at their construction and add
        theirs (a checkpointer's write in flight, a logger's tracker runs)."""
        if duty is not None:
            self.duties.append(duty)
            self.update()

    def update(self) -> None:
        """Install or remove the handler as this rank does or does not hold a duty now."""
        if threading.current_thread() is not threading.main_thread():
            return
        ending = (self.previous if self.installed else signal.getsignal(signal.SIGTERM)) == (
            signal.SIG_DFL
        )
        wanted = any(duty.wanted() and (ending or not duty.if_ending) for duty in self.duties)
        if wanted and not self.installed:
            self._install()
        elif not wanted and self.installed:
            self.remove()

    def remove(self) -> None:
        if not self.installed:
            return
        signal.signal(signal.SIGTERM, self.previous or signal.SIG_DFL)  # None: set outside Python
        self.installed = False
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._old_wakeup)
            os.close(self._wakeup[1])  # the helper thread reads end-of-file and ends
            self._wakeup = None

    def _install(self) -> None:
        self.previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self.installed = True
        read, write = os.pipe()
        os.set_blocking(write, False)
        old = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        if old != -1:  # someone else's (an event loop): leave it theirs, main thread only
            signal.set_wakeup_fd(old)
            os.close(read)
            os.close(write)
            return
        self._wakeup, self._old_wakeup = (read, write), old
        threading.Thread(
            target=self._watch, args=(read,), name="rankwise-sigterm", daemon=True
        ).start()

    def _watch(self, read: int) -> None:
        try:
            while chunk := os.read(read, 64):
                if signal.SIGTERM not in chunk or self.previous != signal.SIG_DFL:
                    continue
                if self._taken.wait(MAIN_THREAD_GRACE_S):
                    continue  # the main thread serves it (and ends the process)
                self._run_duties()
                end_by_sigterm()
        finally:
            os.close(read)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """While the block runs (a call into a tracker's library, which a handler must not
        re-enter: its locks are not re-entrant), SIGTERM on the main thread is served once
        the block ends."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
            if not self._deferring and self._pending and self._running is None:
                self._pending = False
                self._on_sigterm(signal.SIGTERM, None)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._taken.set()
        if self._running == threading.get_ident():
            return  # a second SIGTERM while this thread runs the duties: they end it
        if self._deferring:
            self._pending = True
            return
        previous = self.previous
        ending = previous == signal.SIG_DFL
        self._run_duties(ending)
        if ending:  # the default action: end the process, as before
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)
        self._done = False  # the program goes on (ignored, or its own handler): served again
        if callable(previous):
            previous(signum, frame)

    def _run_duties(self, ending: bool = True) -> None:
        with self._lock:
            if self._done:
                return
            self._done, self._running = True, threading.get_ident()
            try:
                self._each_duty(ending)
            finally:
                self._running = None

    def _each_duty(self, ending: bool) -> None:
        for duty in self.duties:
            if duty.if_ending and not ending:
                continue
            try:
                if duty.wanted():
                    duty.run()
            except Exception as exc:  # the process is ending anyway: say it, go on
                print(
                    f"rankwise: on SIGTERM, {duty.what} failed: {type(exc).__name__}: {exc}",
                    file=sys.stderr,
                    flush=True,
                )


@contextmanager
def guarded(duties: Sequence[Duty] = ()) -> Iterator[SigtermGuard]:
    """While the block runs, SIGTERM first finishes the wanted ``duties`` (see
    :class:`SigtermGuard`); yields the guard, for the caller to
    :meth:`~SigtermGuard.update` where a duty may come or go (a save, a regroup), and to
    give to the owners of duties, which :meth:`~SigtermGuard.add` theirs."""
    guard = SigtermGuard(duties)
    guard.update()
    try:
        yield guard
    finally:
        guard.remove()


def end_by_sigterm() -> None:
    """End the process by SIGTERM's default action from any thread (``signal.signal`` works in
    the main thread only, which may be blocked in a collective): set the C-level disposition
    back to the default and signal again; without libc, exit as a shell reports it (143)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal(int(signal.SIGTERM), None)  # SIG_DFL is the null handler
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)  # delivered at once; this only bounds an unexpected delay
    except (OSError, AttributeError):
        pass
    os._exit(128 + int(signal.SIGTERM))
