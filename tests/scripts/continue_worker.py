"""A tiny deterministic run for ``rankwise launch --on-failure continue`` (tests/train/test_train_continue.py).

Trains an MLP on fixed data through ``DistributedTrainer`` (checkpoints only with
``--checkpoint-every``, and never read back from disk) with an :class:`AuditLog` in ``OUT/audit``; whoever is rank 0 at the end writes
the parameters to ``OUT/final.pt`` and each process its PID history to ``OUT/pids-<slot>``.

- ``--kill-slot S --kill-step K``: slot S SIGKILLs itself in optimizer step K, after its
  micro-batch is recorded (its gradient reached the others), on its first start only.
- ``--kill-group``: with ``--kill-slot``, slot S SIGKILLs its whole process group instead: its
  launcher and that launcher's other processes (a lost node; tests/launch/test_launch_multihost.py), once
  they have recorded their micro-batch of step K too.
- ``--stop-slot S --stop-step K``: slot S SIGSTOPs itself there instead (frozen).
- ``--kill-in-figures S:E:SECONDS``: the same timer, started as epoch E's figures
  all-reduce begins on slot S (``EpochSums.result``): the kill lands inside it or just after.
- ``--kill-late S:K:SECONDS``: slot S is SIGKILLed by a timer SECONDS after its step K's
  gradient left, wherever its main thread is then (after an epoch's last step: the figures,
  the save or their barriers; benchmarks' lost-between-epochs class), on its first start only;
  it writes ``OUT/killed-late-<slot>`` (the time) just before.
- ``--await-joiner-step K[,K2...]``: in optimizer step K, a member of a smaller world than it started
  with waits (up to 120 s, or ``--await-joiner-s S``) until a restarted process asks to join,
  so the join lands at the end of step K however slowly the restarted process starts. A restarted process writes the
  optimizer step of each of its micro-batches to ``OUT/rejoined-<slot>``.
- ``--log-dir D``: the trainer's CSV log there, a row per optimizer step (written by rank 0).
- ``--batch-size B`` (per rank at the start), ``--grad-accum A``: run without the launcher
  (one plain process) with the whole global batch, it trains the same global batches as the
  launched run (the uninterrupted reference for uneven shares).
- ``--checkpoint-every N``: background step checkpoints in ``OUT/ckpt`` every N optimizer steps
  (and at each epoch's end), written by whoever is rank 0 at the save.
- ``--checkpoint-url URL``: those checkpoints under ``URL`` (``s3://bucket/run``; the store's
  ``AWS_*`` settings from the environment) instead of ``OUT/ckpt``. ``--silent-s S``: a store
  silent S seconds is announced (``rankwise.train.checkpoint.writer.SILENT_S``, 5 s).
- ``--strikes SPEC,...`` (benchmarks/faults.py), each once per launch, only while the world has
  at least two members (else at a later step): ``kill@S:K`` / ``stop@S:K``: slot S SIGKILLs /
  SIGSTOPs itself in the first optimizer step >= K it trains; ``POINT@K``: the writing rank is
  SIGKILLed at POINT (``rankwise.train.FAULT_POINTS``) of the first save at or after step K.
  Each strike writes ``OUT/struck-<i>`` (kind, slot, generation, time) just before its signal.
- ``--crash-before-init S``: slot S raises in its set-up, before ``rankwise.distributed``
  starts (generation 0 must form without it), on its first start only.
- ``--own-error S:K``: slot S's dataset raises its own error whose text says "timed out" (as a
  DataLoader's does) when asked for a sample of optimizer step K or later, on its first start
  only: that rank fails, the others go on without it. ``--own-error-kind timeout``: a plain
  ``TimeoutError`` from the user's code instead (``dataloader``, the default: the
  ``RuntimeError`` a DataLoader raises).
- ``--exit-zero S:K``: slot S exits 0 (``os._exit(0)``, no error) in optimizer step K, after
  its micro-batch is recorded, on its first start only: a rank that leaves before training
  finished.
- ``--joiner-dies-waiting``: a slot's first restart SIGKILLs itself ``--joiner-dies-after``
  seconds (0.5) after it is on the store's waiting list (a joiner lost while it waits to be let
  in, or on its way in), writing ``OUT/joiner-died-<slot>`` (its time) first.
- ``--joiner-dies-in-setup N``: a slot's N-th restart SIGKILLs itself as it enters the group
  set-up of the generation it was let into (its ready mark written, the members in gloo's
  rendezvous waiting for its address), writing ``OUT/joiner-died-<slot>`` (its time) first.
- ``--await-joiner-death K``: in optimizer step K, a member of a smaller world than it started
  with waits (up to 120 s) until a restarted process is on the waiting list and the launcher
  has marked it dead (a joiner killed while it waits: the members reach their next boundary
  only after its death, so it must not be let in).
- ``--master-after-fit SECONDS``: after ``fit`` the master works this long before it writes
  ``OUT/final.pt`` (a test set, an export), while the other ranks exit at once.
- ``--resume``: ``resume="auto"`` (with ``--checkpoint-every``: a relaunch goes on from the
  last checkpoint).
- A first start that raises (its set-up's crash, or ``fit``) writes ``OUT/error-<slot>``
  (``time type``) first.
- ``--disk-full-at K``: every checkpoint write of step K or later fails with ENOSPC.
- ``--hold-slot S --hold-step K --hold-seconds T``: slot S sleeps T seconds in step K, after
  its gradient went out (the others block in the next collective), once, writing
  ``OUT/holding-<S>`` first.
- Every process writes ``OUT/setup-<slot>-<incarnation>`` (``is_master is_joining``) once its
  trainer is built (the script's set-up, before ``fit``).
- Every process writes ``hook rank world`` (``rd.get_rank()``, ``rd.get_world_size()``) to
  ``OUT/hooks-<slot>-<incarnation>`` for each ``on_fit_start`` and ``on_regroup`` it hears.
- ``--step-delay SECONDS``: sleep in every micro-batch. ``--await-joiners``: while the world is
  smaller than 3, every member waits in each step (up to 120 s) until a restarted process asks
  to join, before any strike (so every strike hits a world of 3). Every process writes
  ``generation step time`` per micro-batch to ``OUT/steps-<slot>``.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from pathlib import Path

import torch
from setup_fault import on_group_setup
from tiny_run import data, mlp_trainer

import rankwise.distributed as rd
from rankwise.distributed.membership import Membership
from rankwise.distributed.signing import parse_slots, read_raw
from rankwise.train import AuditLog, DistributedTrainer, DistributedTrainingConfig
from rankwise.train.checkpoint import FAULT_POINTS, set_fault_hook, writer
from rankwise.train.sums import EpochSums

p = argparse.ArgumentParser()
p.add_argument("out", type=Path)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--batch-size", type=int, default=8, help="per rank, at the start")
p.add_argument("--grad-accum", type=int, default=1)
p.add_argument("--kill-slot", type=int, default=-1)
p.add_argument("--kill-step", type=int, default=-1)
p.add_argument("--kill-group", action="store_true")
p.add_argument(
    "--kill-in-figures", default="", metavar="SLOT:EPOCH:SECONDS",
    help="SIGKILL SLOT from a timer started as epoch EPOCH's figures all-reduce begins, after "
    "SECONDS (first start): inside the all-reduce, or in the barrier or save after it",
)  # fmt: skip
p.add_argument(
    "--kill-late", default="", metavar="SLOT:STEP:SECONDS",
    help="SIGKILL SLOT from a timer SECONDS after its step STEP's gradient left (first start): "
    "past an epoch's last step the kill lands in the figures, the save or their barriers",
)  # fmt: skip
p.add_argument("--stop-slot", type=int, default=-1)
p.add_argument("--stop-step", type=int, default=-1)
p.add_argument("--await-joiner-step", default="", help="K or K1,K2,...")
p.add_argument("--await-joiner-s", type=float, default=120.0, help="how long it waits")
p.add_argument("--log-dir", type=Path, default=None, help="a CSV row per step there")
p.add_argument("--checkpoint-every", type=int, default=0)
p.add_argument("--checkpoint-url", default=None, help="s3://bucket/run instead of OUT/ckpt")
p.add_argument("--silent-s", type=float, default=None, help="the store's silence announced then")
p.add_argument("--strikes", default="", help="kill@S:K, stop@S:K, POINT@K; comma-separated")
p.add_argument("--step-delay", type=float, default=0.0)
p.add_argument("--await-joiners", action="store_true")
p.add_argument("--crash-before-init", type=int, default=-1)
p.add_argument("--own-error", default="", help="S:K")
p.add_argument("--exit-zero", default="", help="S:K")
p.add_argument("--own-error-kind", choices=("dataloader", "timeout"), default="dataloader")
p.add_argument("--joiner-dies-waiting", action="store_true")
p.add_argument("--joiner-dies-after", type=float, default=0.5)
p.add_argument("--joiner-dies-in-setup", type=int, default=-1, help="N: the N-th restart")
p.add_argument("--await-joiner-death", type=int, default=-1)
p.add_argument("--master-after-fit", type=float, default=0.0)
p.add_argument("--resume", action="store_true")
p.add_argument("--disk-full-at", type=int, default=-1)
p.add_argument("--hold-slot", type=int, default=-1)
p.add_argument("--hold-step", type=int, default=-1)
p.add_argument("--hold-seconds", type=float, default=0.0)
args = p.parse_args()
args.out.mkdir(parents=True, exist_ok=True)
slot = int(os.environ.get("RANKWISE_SLOT", os.environ.get("RANK", "0")))
first_start = os.environ.get("RANKWISE_INCARNATION", "0") == "0"
with open(args.out / f"pids-{slot}", "a") as f:
    f.write(f"{os.getpid()}\n")


strikes = [tuple(spec.split("@")) for spec in args.strikes.split(",") if spec]
steps_log = open(args.out / f"steps-{slot}", "a", buffering=1)  # noqa: SIM115 (to the end)


def await_joiner(member: Membership, timeout: float = 120.0) -> None:
    """Wait until a restarted process asks to join (the members let it in after this step,
    if it is still alive then)."""
    deadline = time.monotonic() + timeout
    while not member.joiners() and time.monotonic() < deadline:
        time.sleep(0.05)


def await_joiner_death(member: Membership, timeout: float = 120.0) -> None:
    """Wait until a restarted process asked to join and the launcher marked it dead (the
    leader's own reading of the waiting list and the dead marks)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(member._joiner_dead(s) for s in member._listed()):
            return
        time.sleep(0.02)


def error_mark(exc: BaseException) -> None:
    """A first start's own failure: when, and what (the harness times the others by it)."""
    if first_start:
        (args.out / f"error-{slot}").write_text(f"{time.time()} {type(exc).__name__}\n")


def strike(i: int, kind: str, sig: signal.Signals) -> None:
    """Strike ``i`` of ``--strikes``: once per launch, whichever process gets there first."""
    member = rd.membership()
    if member is None or member.pending or member.world_size < 2:
        return  # the last member (or a joiner not in yet) waits for a later step
    try:
        fd = os.open(args.out / f"struck-{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, f"{kind} {slot} {member.generation} {time.time()}\n".encode())
    os.close(fd)
    os.kill(os.getpid(), sig)


def timed_kill(spec: str) -> tuple[int, float] | None:
    """``SLOT:AT:SECONDS`` (--kill-late, --kill-in-figures): (AT, SECONDS) when SLOT is this
    process's slot, else None."""
    if not spec or spec.split(":")[0] != str(slot):
        return None
    _, at, seconds = spec.split(":")
    return int(at), float(seconds)


def kill_late() -> None:
    """--kill-late's timer: wherever the main thread is now, this process dies."""
    (args.out / f"killed-late-{slot}").write_text(f"{time.time()}\n")
    os.kill(os.getpid(), signal.SIGKILL)


kill_late_at = timed_kill(args.kill_late)  # (step, seconds) on the slot it kills


def save_strike(point: str) -> None:
    """The fault hook of every process; it fires in the one writing the checkpoints."""
    if point == "mid-write" and 0 <= args.disk_full_at <= trainer.state.step:
        raise OSError(28, "No space left on device")
    for i, (kind, at) in enumerate(strikes):
        if kind == point and trainer.state.step >= int(at):
            strike(i, point, signal.SIGKILL)


class Hooks:
    """Who each fit-level callback runs as: ``hook rank world`` per call."""

    def __init__(self) -> None:
        incarnation = os.environ.get("RANKWISE_INCARNATION", "0")
        self.path = args.out / f"hooks-{slot}-{incarnation}"

    def record(self, hook: str) -> None:
        with open(self.path, "a") as f:
            f.write(f"{hook} {rd.get_rank()} {rd.get_world_size()}\n")

    def on_fit_start(self, trainer: DistributedTrainer) -> None:
        self.record("on_fit_start")

    def on_regroup(self, trainer: DistributedTrainer) -> None:
        self.record("on_regroup")


class Fault:
    """Strikes in on_batch, after the backward sent the gradient (AuditLog recorded before)."""

    def on_batch(self, trainer: DistributedTrainer, epoch: int, step: int, ids: object) -> None:
        member = rd.membership()
        steps_log.write(f"{member.generation if member else 0} {step + 1} {time.time()}\n")
        if args.step_delay:
            time.sleep(args.step_delay)
        if args.await_joiners and member is not None and member.world_size < 3:
            await_joiner(member)
        for i, (kind, at) in enumerate(strikes):
            target, _, from_step = at.partition(":")
            if kind in ("kill", "stop") and target == str(slot) and step + 1 >= int(from_step):
                strike(i, kind, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        if not first_start:
            with open(args.out / f"rejoined-{slot}", "a") as f:
                f.write(f"{step + 1}\n")
            return
        member = rd.membership()
        smaller = member is not None and member.world_size < member.cfg.world_size
        if str(step + 1) in args.await_joiner_step.split(",") and smaller:
            await_joiner(member, args.await_joiner_s)
        if step + 1 == args.await_joiner_death and smaller:
            await_joiner_death(member)
        if args.exit_zero == f"{slot}:{step + 1}":
            steps_log.flush()
            os._exit(0)  # leaves early without an error: not the end of training
        if kill_late_at is not None and step + 1 == kill_late_at[0]:
            threading.Timer(kill_late_at[1], kill_late).start()
        if slot == args.kill_slot and step + 1 == args.kill_step:
            if args.kill_group:
                node_records(step + 1)
                os.killpg(os.getpgid(0), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        if slot == args.hold_slot and step + 1 == args.hold_step:
            args.hold_step = -1  # once
            (args.out / f"holding-{slot}").write_text(f"{time.time()}\n")
            time.sleep(args.hold_seconds)
        if slot == args.stop_slot and step + 1 == args.stop_step:
            args.stop_step = -1  # once
            os.kill(os.getpid(), signal.SIGSTOP)


def node_records(step: int) -> None:
    """Wait until this node's other ranks recorded their micro-batch of ``step`` (its gradient
    reached everyone: the step completes on the survivors), so the node dies after it."""
    local, size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    first = int(os.environ["RANK"]) - local
    deadline = time.monotonic() + 60
    for rank in range(first, first + size):
        while time.monotonic() < deadline:
            logs = (args.out / "audit").glob(f"audit-*-rank{rank}.jsonl")
            if any(f'"step": {step},' in f.read_text() for f in logs):
                break
            time.sleep(0.02)


class OwnError(torch.utils.data.Dataset):
    """The data as a Dataset whose slot S raises its own "timed out" error from step K on."""

    def __init__(self, slot_step: str) -> None:
        self.slot, self.step = (int(v) for v in slot_step.split(":"))

    def __len__(self) -> int:
        return len(x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if first_start and slot == self.slot and trainer.state.step + 1 >= self.step:
            if args.own_error_kind == "timeout":
                raise TimeoutError("the feature store did not answer within 5 seconds")
            raise RuntimeError("DataLoader worker (pid 4242) timed out after 5 seconds")
        return x[i], y[i]


def die_once_waiting() -> None:
    """A first restart: SIGKILL itself ``--joiner-dies-after`` s after it is on the waiting
    list."""
    member = rd.membership()
    while member is not None:
        listed = read_raw(member.store, "waiting") or b""
        if slot in (parse_slots(listed.decode(errors="replace")) or []):
            time.sleep(args.joiner_dies_after)  # the members see it ask, and may let it in
            (args.out / f"joiner-died-{slot}").write_text(f"{time.time()}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.02)


def die_in_setup() -> None:
    """``--joiner-dies-in-setup``: SIGKILL this restart as it enters a real group's set-up."""
    (args.out / f"joiner-died-{slot}").write_text(f"{time.time()}\n")
    os.kill(os.getpid(), signal.SIGKILL)


if os.environ.get("RANKWISE_INCARNATION") == str(args.joiner_dies_in_setup):
    on_group_setup(die_in_setup)
if first_start and slot == args.crash_before_init:
    crash = RuntimeError(f"slot {slot} failed in its set-up (a test's crash before init)")
    error_mark(crash)
    raise crash
x, y = data()
# Fault first: its kills in on_batch come after the backward sent the gradient but before any
# later hook; AuditLog records before the backward, so the micro-batch is on record.
model, trainer = mlp_trainer([Fault(), AuditLog(args.out / "audit"), Hooks()])
(args.out / f"setup-{slot}-{os.environ.get('RANKWISE_INCARNATION', '0')}").write_text(
    f"{rd.is_master()} {rd.is_joining()}\n"
)
if args.joiner_dies_waiting and os.environ.get("RANKWISE_INCARNATION") == "1":
    threading.Thread(target=die_once_waiting, daemon=True).start()
if (kill_in_figures := timed_kill(args.kill_in_figures)) is not None and first_start:
    own_result = EpochSums.result

    def timed_result(sums: EpochSums) -> object:
        if trainer.state.epoch == kill_in_figures[0]:
            threading.Timer(kill_in_figures[1], kill_late).start()
        return own_result(sums)

    EpochSums.result = timed_result  # type: ignore[assignment,method-assign]
if any(kind in FAULT_POINTS for kind, _ in strikes) or args.disk_full_at >= 0:
    set_fault_hook(save_strike)
every = args.checkpoint_every
if args.silent_s is not None:
    writer.SILENT_S = args.silent_s
cfg = DistributedTrainingConfig(
    epochs=args.epochs,
    batch_size=args.batch_size,
    grad_accum_steps=args.grad_accum,
    verbose=False,
    checkpoint_dir=(args.checkpoint_url or str(args.out / "ckpt")) if every else None,
    checkpoint_every_n_steps=every,
    checkpoint_every_n_epochs=1 if every else 0,
    log_dir=args.log_dir,
    log_every_n_batches=1,
    resume="auto" if args.resume else None,
)
try:
    if args.own_error:
        trainer.fit(OwnError(args.own_error), config=cfg)
    else:
        trainer.fit(x, y, cfg)
except BaseException as exc:
    error_mark(exc)
    raise
if first_start:  # when this process's fit returned (a --kill-late after it hits no collective)
    (args.out / f"fit-done-{slot}").write_text(f"{time.time()}\n")
if rd.is_master():
    time.sleep(args.master_after_fit)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save(state, args.out / "final.pt")
    (args.out / "final-world").write_text(f"{rd.get_world_size()}\n")
rd.finalize()
