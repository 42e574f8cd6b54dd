"""``rankwise launch --on-failure continue``: keep the survivors training, restart only the lost.

torchrun's agent treats a job as one unit: any failed worker stops and restarts all of them.
Here the launcher supervises each process on its own (``subprocess``), hosts the job's
``TCPStore`` itself (so any rank may die and the store lives on; see
:mod:`rankwise.distributed.membership`) and, when a process dies:

- restarts that slot alone, up to ``--max-restarts`` times per slot; the new process asks to
  join and the survivors let it in at their next step boundary;
- ends a process the survivors left out of a generation (frozen: SIGSTOP, or stalled past
  the collective timeout) with SIGKILL, and then restarts it the same way;
- stops the job, saying why, when every process is lost.

Training has finished once a rank recorded that its ``fit`` completed
(:mod:`rankwise.distributed.finish`; an exit 0 before that is a rank that left early, restarted
like any lost one). The launcher then waits for every other process, as torchrun does: work a
rank does after ``fit`` (a test set, an export, a final ``torch.save``) is never cut short, a
process that fails there makes the job's exit code non-zero, and a process that never exits
is the collective timeout's business. Only a restarted process still waiting to join, which no
generation will let in any more, is ended. The decisions on each exit and the exit code are
:class:`Ledger`'s, a pure function of the exits seen (exit 0 only when training finished).

Across nodes (``--nnodes N --node-rank R``, static: no nodes come or go) every node runs one
launcher; slot ``R * nproc + i`` is the ``i``-th process of node ``R``. Node 0's launcher hosts
the store at ``--master-addr``:``--master-port`` (or every launcher connects to a ``rankwise
store`` at ``--store-endpoint``; see :mod:`rankwise.launch.jobstore`), each launcher supervises and
restarts only its own slots, and they share the job's end through the store: training
finished on one node is finished on all, and the store host waits for the others to be done.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankwise.distributed.contract import LEFT_OUT, Keys, member_environment
from rankwise.distributed.finish import is_finished
from rankwise.distributed.membership import mark_dead, parse_members
from rankwise.launch.jobstore import CONNECT_S, DuplicateNodeError, JobStore, parse_endpoint
from rankwise.launch.ledger import Ledger
from rankwise.launch.ledger import describe_exit as _describe

__all__ = ["check_continue_args", "run_continue"]

STOP_WAIT_S = 30.0  # after forwarding SIGTERM: how long the ranks get to drain and end


@dataclass
class _Slot:
    index: int
    proc: subprocess.Popen[bytes]
    incarnation: int = 0
    # The incarnation of this slot in the newest generation the launcher read (None: not a
    # member); a first start counts as generation 0's until its list says otherwise.
    member_inc: int | None = 0
    exit_codes: list[int] = field(default_factory=list)
    ended: bool = False  # the launcher ended this start (SIGKILL) itself
    left_out: bool = False  # ... because a generation left it out (it had stopped answering)

    def restarted(self, proc: subprocess.Popen[bytes], incarnation: int) -> None:
        """The slot's next start: which generation it is in is read from the lists to come."""
        self.proc, self.incarnation, self.ended, self.left_out = proc, incarnation, False, False

    @property
    def member_seen(self) -> bool:
        """Whether this start (not an earlier incarnation of the slot) is in a generation."""
        return self.member_inc == self.incarnation


def check_continue_args(args: argparse.Namespace) -> None:
    """Refuse options ``--on-failure continue`` cannot run with; ``ValueError`` names the fix.

    >>> check_continue_args(argparse.Namespace(nnodes="1:2", nproc_per_node="2"))
    Traceback (most recent call last):
    ...
    ValueError: --on-failure continue runs on a fixed number of nodes (got --nnodes 1:2); ...
    """
    nnodes = str(args.nnodes).strip()
    if nnodes == "1:1":
        nnodes = "1"
    if not (nnodes.isdigit() and int(nnodes) >= 1):
        raise ValueError(
            f"--on-failure continue runs on a fixed number of nodes (got --nnodes "
            f"{args.nnodes}); give one number, e.g. --nnodes 2, or use --on-failure restart "
            "(torchrun's elastic restarts) for a MIN:MAX range."
        )
    if not str(args.nproc_per_node).isdigit():
        raise ValueError(
            f"--on-failure continue needs a number for --nproc-per-node (got "
            f"{args.nproc_per_node!r}), e.g. --nproc-per-node 3."
        )
    _refuse_torchrun_only(args)
    low = _min_nproc(args)
    world = int(nnodes) * int(args.nproc_per_node)
    if not 1 <= low <= world:
        nodes = f" x --nnodes ({nnodes}) = {world}" if int(nnodes) > 1 else ""
        raise ValueError(
            f"--min-nproc ({low}) must be between 1 and --nproc-per-node "
            f"({args.nproc_per_node}){nodes}."
        )
    wait = _store_wait_s(args)
    if not (wait > 0 and math.isfinite(wait)):
        raise ValueError(
            f"--store-wait-s ({wait:g}) must be a number of seconds > 0: how long a launcher "
            f"waits to reach the membership store; e.g. --store-wait-s {CONNECT_S:g} (the "
            "default)."
        )
    endpoint = getattr(args, "store_endpoint", None)
    if endpoint is not None and parse_endpoint(endpoint) is None:
        raise ValueError(
            f"--store-endpoint ({endpoint!r}) must be HOST:PORT of a running `rankwise store`, "
            "e.g. --store-endpoint 10.0.0.5:29600."
        )
    node = getattr(args, "node_rank", None)
    if int(nnodes) == 1 and node in (None, 0):
        return
    if node is None or not 0 <= int(node) < int(nnodes):
        raise ValueError(
            f"--on-failure continue on {nnodes} node(s) needs --node-rank between 0 and "
            f"{int(nnodes) - 1} on each node (got {node}); node 0 hosts the membership store "
            "at --master-addr:--master-port unless --store-endpoint names one."
        )
    if endpoint is None and args.master_port is None:
        raise ValueError(
            f"--on-failure continue on {nnodes} node(s) needs --master-port: node 0's launcher "
            "hosts the membership store at --master-addr:--master-port and the other nodes "
            "connect to it, e.g. --master-addr 10.0.0.1 --master-port 29500 on every node "
            "(or --store-endpoint HOST:PORT of a `rankwise store`)."
        )
    if getattr(args, "job_token_file", None) is None:
        raise ValueError(
            f"--on-failure continue on {nnodes} node(s) needs --job-token-file PATH on every "
            "node: the job's secret, which a restarted rank proves before it is let in. Node "
            "0's launcher creates PATH (mode 0600) if it is missing; give the other nodes the "
            "same file (a shared file system, or a copy)."
        )


# torchrun's options that only its agent reads (dest, flag, torchrun's default): given under
# --on-failure continue, which runs no agent, they would be silently ignored.
_TORCHRUN_ONLY = (
    ("rdzv_backend", "--rdzv-backend", None),  # None: rankwise's "not given"
    ("rdzv_endpoint", "--rdzv-endpoint", ""),
    ("rdzv_id", "--rdzv-id", "none"),
    ("rdzv_conf", "--rdzv-conf", ""),
    ("standalone", "--standalone", False),
    ("log_dir", "--log-dir", None),
    ("tee", "--tee", "0"),
    ("redirects", "--redirects", "0"),
    ("local_ranks_filter", "--local-ranks-filter", ""),
)


def _refuse_torchrun_only(args: argparse.Namespace) -> None:
    for dest, flag, default in _TORCHRUN_ONLY:
        value = getattr(args, dest, default)
        if value != default:
            raise ValueError(
                f"{flag} ({value!r}) is an option of torchrun's agent, which --on-failure "
                "continue does not run (rankwise supervises the processes itself, and each "
                f"rank's output goes to the launcher's own stdout and stderr): drop {flag}, or "
                "use --on-failure restart."
            )


def _store_wait_s(args: argparse.Namespace) -> float:
    given = getattr(args, "store_wait_s", None)
    return CONNECT_S if given is None else float(given)


def _min_nproc(args: argparse.Namespace) -> int:
    given = getattr(args, "min_nproc", None)
    return 1 if given is None else int(given)


def run_continue(args: argparse.Namespace) -> int:
    """Supervise this node's ``--nproc-per-node`` processes; return the job's exit code."""
    nproc, restarts = int(args.nproc_per_node), int(args.max_restarts)
    nnodes = int(str(args.nnodes).split(":")[0])
    node = int(getattr(args, "node_rank", None) or 0)
    try:
        token = job_token(getattr(args, "job_token_file", None), node)
    except ValueError as exc:
        _say(f"error: {exc}")
        return 2
    jobs = _open_store(args, nnodes, node, token)
    if not isinstance(jobs, JobStore):
        return jobs
    cmd = _command(args)
    inherited = dict(os.environ)  # the launcher's own, handed on (the contract's set over it)

    def spawn(index: int, incarnation: int) -> subprocess.Popen[bytes]:
        env = member_environment(
            inherited, slot=index, incarnation=incarnation, node=node, nproc=nproc,
            nnodes=nnodes, host=jobs.host, port=jobs.port, min_nproc=_min_nproc(args),
            restarts=restarts, job_token=token, job_id=jobs.job_id,
        )  # fmt: skip
        return subprocess.Popen(cmd, env=env)

    stop = _Stop()
    with stop.handling():
        slots = [_Slot(i, spawn(i, 0)) for i in range(node * nproc, (node + 1) * nproc)]
        ledger = Ledger([slot.index for slot in slots], restarts)
        try:
            _supervise(jobs, slots, spawn, ledger, stop)
            code = _outcome(jobs, ledger)
            jobs.set(Keys.launcher_done(node), str(code))
            if jobs.hosting and nnodes > 1:
                with stop.raising():
                    jobs.await_others()  # the others still need the store (bounded: heartbeats)
        except _Stopped as stopped:
            code = _stop_all(jobs, slots, stopped.signum, stop)
            jobs.set(Keys.launcher_done(node), str(code))
        finally:
            jobs.close()  # the heartbeat thread out of the store before the process ends
    return code


def _supervise(
    jobs: JobStore, slots: list[_Slot], spawn: Callable[[int, int], subprocess.Popen[bytes]],
    ledger: Ledger, stop: _Stop,
) -> None:  # fmt: skip
    """Watch this node's processes until none runs, acting on each exit as ``ledger`` decides.
    Raises :class:`_Stopped` once the launcher is asked to stop (SIGTERM, SIGHUP, SIGINT)."""
    seen_first = False  # training had finished before this pass's look at the generations
    seen_gen = -1
    while True:
        if stop.signum is not None:
            raise _Stopped(stop.signum)
        seen_gen = _watch_members(jobs, slots, seen_gen)
        if not ledger.finished and jobs.nnodes > 1 and jobs.finished():
            ledger.finish()  # another node's rank finished training
        if not ledger.finished and jobs.call(is_finished, jobs.signed):
            ledger.finish()  # a rank here finished training (seen while it runs: the mark's
            jobs.set(Keys.LAUNCH_FINISHED, "1")  # rank keeps it, a client may delete it later)
        running = 0
        for slot in slots:
            code = slot.proc.poll()
            if code is None:
                running += 1
                continue
            if _recorded(slot):
                continue
            slot.exit_codes.append(code)
            # How it ended, for the survivors' "a peer was lost" line (before the mark they
            # regroup on, so it is there when they read it). One this launcher ended itself
            # had stopped answering: its SIGKILL is the launcher's, not its cause.
            how = LEFT_OUT if slot.left_out else f"ended with {_describe(code)}"
            jobs.set(Keys.exit(slot.index, slot.incarnation), how)
            # The survivors regroup now (a lost store: nothing to tell, said once).
            jobs.call(mark_dead, jobs.signed, slot.index, slot.incarnation)
            # A rank that completed fit recorded it in the store before it could exit.
            finished = not ledger.finished and bool(jobs.call(is_finished, jobs.signed))
            verdict = ledger.exited(
                slot.index, code, finished=finished, store_lost=jobs.lost, ended=slot.ended
            )
            if finished:
                jobs.set(Keys.LAUNCH_FINISHED, "1")
            if verdict.message:
                _say(verdict.message + _others(slots, slot))
            if verdict.action == "restart":
                incarnation = ledger.incarnations[slot.index]
                slot.restarted(spawn(slot.index, incarnation), incarnation)
                running += 1
        if running == 0:
            break
        if ledger.finished:
            _end_joiners(slots, seen_first=seen_first)
        seen_first = ledger.finished
        time.sleep(0.1)
    if not ledger.finished:
        with stop.raising():
            jobs.await_outcome()  # nobody left here: the others may still finish


class _Stopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Stop:
    """The launcher's SIGTERM, SIGHUP and SIGINT (a scheduler's stop, a lost terminal,
    Ctrl-C): recorded, and acted on by the supervising loop (:func:`_stop_all`)."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
        self.again = False  # a second signal: end every process now
        self._raise = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            self.again = True
            return
        self.signum = signum
        if self._raise:
            raise _Stopped(signum)

    @contextlib.contextmanager
    def handling(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # Python delivers signals to the main thread only
            return
        previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @contextlib.contextmanager
    def raising(self) -> Iterator[None]:
        """While the block waits on other nodes (nothing of its own to stop), a signal ends
        the wait at once."""
        if self.signum is not None:
            raise _Stopped(self.signum)
        self._raise = True
        try:
            yield
        finally:
            self._raise = False


def _stop_all(jobs: JobStore, slots: list[_Slot], signum: int, stop: _Stop) -> int:
    """Forward SIGTERM to every process of this node, give them ``STOP_WAIT_S`` to drain their
    checkpoint write and end, SIGKILL the rest (said); the exit code is 128 + the signal's."""
    name = signal.Signals(signum).name
    running = [s for s in slots if s.proc.poll() is None]
    _say(f"{name} received: forwarding SIGTERM to this node's {len(running)} running "
         "process(es); a rank writing a checkpoint finishes that write first, and whatever is "
         f"still running {STOP_WAIT_S:.0f} s from now is ended with SIGKILL")  # fmt: skip
    for slot in running:
        with contextlib.suppress(ProcessLookupError):
            slot.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline and not stop.again:
        if all(s.proc.poll() is not None for s in running):
            break
        time.sleep(0.05)
    for slot in running:
        if slot.proc.poll() is None:
            why = "a second signal" if stop.again else f"{STOP_WAIT_S:.0f} s after SIGTERM"
            _say(f"slot {slot.index} still running {why}; ending it with SIGKILL")
            _kill(slot.proc)
        # Other nodes' ranks (if any) regroup without this node's at once.
        jobs.call(mark_dead, jobs.signed, slot.index, slot.incarnation)
    return 128 + signum


def job_token(path: str | None, node: int) -> str:
    """The job's secret as hex: ``path``'s (``--job-token-file``; node 0 creates it, mode 0600,
    where it is missing) or, without one, a fresh one for this launch (one node)."""
    if path is None:
        return secrets.token_hex(32)
    file = Path(path)
    if not file.exists() and node == 0:
        with contextlib.suppress(FileExistsError):  # another launcher made it just now
            fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
    if not file.exists():
        raise ValueError(
            f"--job-token-file {path} does not exist on node {node}: node 0's launcher creates "
            "it at its first start (mode 0600); copy that file here (or put the same path on a "
            "shared file system), so that every node holds the same secret."
        )
    if file.stat().st_mode & 0o077:
        raise ValueError(
            f"--job-token-file {path} can be read by other users (mode "
            f"{file.stat().st_mode & 0o777:o}): the secret guards who may join the job; make "
            f"it private with `chmod 600 {path}`."
        )
    text = file.read_text().strip()
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if len(secret) < 16:
        raise ValueError(
            f"--job-token-file {path} does not hold a secret of at least 16 bytes as hex "
            "digits; delete it on node 0 (which then makes a new one) and copy the new one to "
            'every node, or write one: python -c "import secrets; print(secrets.token_hex(32))" '
            f"> {path}"
        )
    return text


def _open_store(args: argparse.Namespace, nnodes: int, node: int, token: str) -> JobStore | int:
    """Host the job's store (node 0) or connect to it (other nodes, or --store-endpoint); the
    exit code where it cannot."""
    endpoint = getattr(args, "store_endpoint", None)
    if endpoint is not None:
        host, port = parse_endpoint(endpoint) or ("", 0)
        hosting = False
    else:
        host = args.master_addr or "127.0.0.1"
        port = 0 if args.master_port is None else int(args.master_port)
        hosting = node == 0
    try:
        return JobStore(
            host, port, hosting, node, nnodes, secret=token, connect_s=_store_wait_s(args)
        )
    except DuplicateNodeError as exc:
        _say(f"error: {exc}")
        return 2
    except Exception as exc:
        what = (
            f"host the membership store at {host}:{port} ({exc}); choose a free --master-port, "
            "and give --master-addr as an address of this machine (node 0's: the store listens "
            "there only)"
            if hosting
            else f"reach the membership store at {host}:{port} within {_store_wait_s(args):g} s "
            f"({exc}); "
            + (
                "start `rankwise store` there first"
                if endpoint is not None
                else "start node 0's launcher (which hosts it) and check --master-addr and "
                "--master-port"
            )
        )
        _say(f"error: cannot {what}.")
        return 1


def _outcome(jobs: JobStore, ledger: Ledger) -> int:
    """This node's exit code (:meth:`Ledger.code`), its reason said where it is not 0."""
    if not ledger.finished and jobs.finished():
        ledger.finish()  # on another node
    code = ledger.code()
    if code == 0:
        return 0
    if ledger.finished:
        failed = ", ".join(f"slot {s} ({_describe(c)})" for s, c in ledger.failed_after)
        _say(
            f"training finished, but {failed} failed after it; the errors are above. Exit "
            f"code {code}."
        )
        return code
    elsewhere = " on this node, and no other node finished training" if jobs.nnodes > 1 else ""
    _say(
        f"every process has ended ({', '.join(_describe(c) for c in ledger.codes)}){elsewhere} "
        "before any rank completed fit: nobody is left to continue. The errors are above; "
        "raise --max-restarts, or fix the failure and relaunch."
    )
    return code


def _others(slots: list[_Slot], slot: _Slot) -> str:
    """``"; the others go on"`` while another process of this node still runs."""
    running = any(s is not slot and s.proc.poll() is None for s in slots)
    return "; the others go on" if running else ""


def _recorded(slot: _Slot) -> bool:
    # A process's exit is recorded once: exit_codes grows by one per incarnation.
    return len(slot.exit_codes) > slot.incarnation


def _watch_members(jobs: JobStore, slots: list[_Slot], seen: int) -> int:
    """End every running process of this node a new generation left out (frozen or stalled).

    Every generation after ``seen`` is read in order, so that membership is known by
    incarnation: a restart let into generation g and lost before the launcher read g, then
    restarted again, is not mistaken for the new process (which the next generation, built
    without the lost one, would then have had killed). Only lists the job's own leader
    signed count: a stranger's or a replayed value is ignored (warned once per key), never a
    cause to kill. The newest generation, the one seen last."""
    gen = jobs.get_int(Keys.CURRENT)
    if gen is None or gen <= seen:
        return seen
    for g in range(seen + 1, gen + 1):
        value = jobs.get(Keys.members(g))
        listed = None if value is None else parse_members(value)
        if listed is None:  # not written yet, or not a list: never from the job's own leader
            if g == gen:
                return g - 1  # the newest: read again at the next look
            continue  # an older one a store client deleted: the newer lists say who is in
        _note_generation(g, *listed, slots)
    return gen


def _note_generation(
    gen: int, members: list[int], joined: list[int], incs: dict[int, int], slots: list[_Slot]
) -> None:
    for slot in slots:
        if slot.index in joined:
            slot.member_inc = incs.get(slot.index, slot.incarnation)
        elif slot.index in members:
            if slot.member_inc is None:  # the list that let it in was deleted: this start
                slot.member_inc = slot.incarnation
        else:
            if slot.member_seen and slot.proc.poll() is None:
                _say(f"slot {slot.index} was left out of generation {gen} (frozen or stalled); "
                     "ending it")  # fmt: skip
                _kill(slot.proc)
                slot.ended = slot.left_out = True
            slot.member_inc = None


def _end_joiners(slots: list[_Slot], seen_first: bool) -> None:
    """Training has finished: end the restarted processes still waiting to join (no member
    checks for joiners after the last step). Only once the generations were read after the
    finish (``seen_first``), so a joiner let in at the last boundary counts as a member."""
    if not seen_first:
        return
    for slot in slots:
        if not slot.member_seen and slot.proc.poll() is None:
            _say(f"slot {slot.index} was still waiting to join when training finished; "
                 "ending it")  # fmt: skip
            _kill(slot.proc)
            slot.ended = True


def _command(args: argparse.Namespace) -> list[str]:
    script = [args.training_script, *args.training_script_args]
    if getattr(args, "no_python", False):
        return script
    return [sys.executable, "-u", *(["-m"] if getattr(args, "module", False) else []), *script]


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        proc.wait()


def _say(message: str) -> None:
    print(f"rankwise launch: {message}", file=sys.stderr, flush=True)
