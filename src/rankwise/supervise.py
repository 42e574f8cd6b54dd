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

The job succeeds once a process exits 0 (training finished); processes still starting are then
given a moment and ended. One node only: ``--nnodes`` above 1 is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from rankwise.distributed.membership import mark_dead

__all__ = ["check_continue_args", "run_continue"]

_GRACE_S = 20.0  # after the first success: how long the others get to finish


@dataclass
class _Slot:
    index: int
    proc: subprocess.Popen[bytes]
    incarnation: int = 0
    member_seen: bool = True  # in a generation since this start (a first start: generation 0)
    exit_codes: list[int] = field(default_factory=list)


def check_continue_args(args: argparse.Namespace) -> str | None:
    """Why ``--on-failure continue`` cannot run with these options, or None."""
    if str(args.nnodes).strip() not in ("1", "1:1"):
        return (
            f"--on-failure continue runs on one node (got --nnodes {args.nnodes}); use "
            "--on-failure restart (torchrun's restarts) across nodes."
        )
    if not str(args.nproc_per_node).isdigit():
        return (
            f"--on-failure continue needs a number for --nproc-per-node (got "
            f"{args.nproc_per_node!r}), e.g. --nproc-per-node 3."
        )
    low = int(getattr(args, "min_nproc", 1) or 1)
    if not 1 <= low <= int(args.nproc_per_node):
        return (
            f"--min-nproc ({low}) must be between 1 and --nproc-per-node ({args.nproc_per_node})."
        )
    return None


def run_continue(args: argparse.Namespace) -> int:
    """Supervise ``--nproc-per-node`` processes of the script; return the job's exit code."""
    nproc, restarts = int(args.nproc_per_node), int(args.max_restarts)
    store = dist.TCPStore(
        args.master_addr or "127.0.0.1",
        0 if args.master_port is None else int(args.master_port),
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=60),
    )
    cmd = _command(args)
    base = {
        **os.environ,
        "WORLD_SIZE": str(nproc),
        "MASTER_ADDR": args.master_addr or "127.0.0.1",
        "MASTER_PORT": str(store.port),
        "RANKWISE_ON_FAILURE": "continue",
        "RANKWISE_MIN_NPROC": str(int(getattr(args, "min_nproc", 1) or 1)),
        # Nobody can come back without restarts: the members then never check for joiners.
        "RANKWISE_JOIN_CHECK_EVERY": os.environ.get("RANKWISE_JOIN_CHECK_EVERY")
        or ("1" if restarts else "0"),
    }

    def spawn(index: int, incarnation: int) -> subprocess.Popen[bytes]:
        env = {
            **base,
            "RANK": str(index),
            "LOCAL_RANK": str(index),
            "RANKWISE_SLOT": str(index),
            "RANKWISE_INCARNATION": str(incarnation),
        }
        return subprocess.Popen(cmd, env=env)

    slots = [_Slot(i, spawn(i, 0)) for i in range(nproc)]
    succeeded_at: float | None = None
    seen_gen = -1
    try:
        while True:
            seen_gen = _watch_members(store, slots, seen_gen)
            running = 0
            for slot in slots:
                code = slot.proc.poll()
                if code is None:
                    running += 1
                    continue
                if slot.proc.returncode is not None and not _recorded(slot):
                    slot.exit_codes.append(code)
                    mark_dead(store, slot.index, slot.incarnation)  # the survivors regroup now
                    if code == 0:
                        succeeded_at = succeeded_at or time.monotonic()
                    elif succeeded_at is None and slot.incarnation < restarts:
                        _say(f"slot {slot.index} exited with {_describe(code)}; restarting it "
                             f"({slot.incarnation + 1}/{restarts}), the others go on")  # fmt: skip
                        slot.incarnation += 1
                        slot.proc = spawn(slot.index, slot.incarnation)
                        slot.member_seen = False
                        running += 1
                    elif succeeded_at is None:
                        _say(f"slot {slot.index} exited with {_describe(code)} and has no "
                             f"restarts left (--max-restarts {restarts}); the others go on")  # fmt: skip
            if running == 0:
                break
            if succeeded_at is not None and time.monotonic() - succeeded_at > _GRACE_S:
                for slot in slots:
                    _kill(slot.proc)
            time.sleep(0.1)
    except KeyboardInterrupt:
        for slot in slots:
            _kill(slot.proc)
        return 130
    if any(0 in s.exit_codes for s in slots):
        return 0
    codes = [c for s in slots for c in s.exit_codes]
    _say(
        "every process was lost (exit codes "
        f"{', '.join(_describe(c) for c in codes)}): nobody is left to continue. The errors are "
        "above; raise --max-restarts, or fix the failure and relaunch."
    )
    return next((c for c in codes if c > 0), 1)


def _recorded(slot: _Slot) -> bool:
    # A process's exit is recorded once: exit_codes grows by one per incarnation.
    return len(slot.exit_codes) > slot.incarnation


def _watch_members(store: dist.TCPStore, slots: list[_Slot], seen: int) -> int:
    """End every running process a new generation left out (frozen or stalled)."""
    if not store.check(["current"]):
        return seen
    gen = int(store.get("current").decode())
    if gen == seen:
        return seen
    members = {int(s) for s in store.get(f"gen/{gen}/members").decode().split(",") if s}
    for slot in slots:
        if slot.index in members:
            slot.member_seen = True
        elif slot.member_seen and slot.proc.poll() is None:
            _say(f"slot {slot.index} was left out of generation {gen} (frozen or stalled); "
                 "ending it")  # fmt: skip
            _kill(slot.proc)
            slot.member_seen = False
    return gen


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


def _describe(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def _say(message: str) -> None:
    print(f"rankwise launch: {message}", file=sys.stderr, flush=True)
