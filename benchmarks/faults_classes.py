"""The fault-class sweep of benchmarks/faults.py (``--classes``; its docstring says what each
class does and checks): per class, ``--trials`` real ``rankwise launch --on-failure continue``
jobs of tests/scripts/continue_worker.py (faults_continue.py's worker, collective timeout and
step delay), each with exactly one fault of that class, run one at a time (the times are
measured)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import itertools
import math
import os
import random
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from faults_continue import (
    ENV,
    NAN,
    NUM_SAMPLES,
    STEP_DELAY,
    TIMEOUT_MS,
    WORKER,
    stale_final_checkpoint,
    steps_log,
)

from rankwise.distributed.config import DistributedConfig, MemberConfig
from rankwise.launch.jobstore import HEARTBEAT_S
from rankwise.launch.supervisor import STOP_WAIT_S
from rankwise.testing import child_env, free_port, process_alive
from rankwise.train import AuditReport, read_audit
from rankwise.train.audit import read_audit_files
from rankwise.train.checkpoint import CheckpointManager

EPOCHS, STEPS_PER_EPOCH, EVERY = 2, 8, 3  # 192 samples, global batch 24; a save every 3 steps
STEPS = EPOCHS * STEPS_PER_EPOCH
RESTARTS = ["--max-restarts", "1"]
CHECKPOINTS = ("--checkpoint-every", EVERY)  # background saves, written by whoever is rank 0
LAUNCH_TIMEOUT_S = 300.0  # a launch still running then is reported as a hang (and killed)
TIMEOUT_S = TIMEOUT_MS / 1000  # the collective timeout the jobs run with
STALE_S = next(f.default for f in dataclasses.fields(MemberConfig) if f.name == "stale_s")
SETUP_S = 5.0  # RANKWISE_SETUP_TIMEOUT_S in the killed-in-setup class (30 s by default)
# ... whose collective timeout is 60 s, not 3: a wait for it would pass the class's bound
SETUP_ENV = {"RANKWISE_SETUP_TIMEOUT_S": str(SETUP_S), "DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": "60000"}
# Generation 0's leader waits this long for a slot that neither arrives nor is marked dead.
RENDEZVOUS_S = next(
    f.default for f in dataclasses.fields(DistributedConfig) if f.name == "timeout_ms"
) / 1000 + 60  # fmt: skip
OLD_GRACE_S = 20.0  # what the launcher gave the other ranks after the first exit 0 (issue 23)
EXIT_S = 10.0  # a process's own exit (finalize, the interpreter) plus the launcher's 0.1 s poll
LAUNCHER_STALE_S = 5.0  # `rankwise store --launcher-stale-s` in the launcher-killed class
DISK_BYTES = 1 << 20  # the tmpfs under the checkpoint folder (a checkpoint is about 58 kB)


@dataclass
class Trial:
    fault: str  # what this trial did
    outcome: str = "hang"  # how the job ended: finished, or the error it stopped with
    seconds: float = NAN  # the class's measured time to its end (FaultClass.timed)
    bound: float = NAN
    violations: int = 0  # exactly-once problems (AuditReport.violations lines)
    lost: int = 0  # optimizer steps trained past where the next attempt went on from
    failed: list[str] = field(default_factory=list)  # the class's checks that failed
    detail: str = ""  # what else was measured

    @property
    def ok(self) -> bool:
        in_bound = self.seconds <= self.bound  # False for NaN: not measured is not met
        return not self.failed and in_bound and self.violations == 0


@dataclass(frozen=True)
class FaultClass:
    name: str
    run: Callable[[Path, random.Random, int], Trial]  # (workdir, rng, trial index)
    expect: str  # the outcome every trial must end with
    timed: str  # what Trial.seconds measures, and what bounds it


# -- running jobs --------------------------------------------------------------------------------


class Job:
    """A command in a session of its own (a launcher and its ranks, or a store), its output in
    ``NAME.out`` / ``NAME.err``; its exit time noted by :meth:`poll`."""

    def __init__(self, cmd: Sequence[str], out: Path, name: str, env: Mapping[str, str]) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out_path, self.err_path = out / f"{name}.out", out / f"{name}.err"
        with open(self.out_path, "w") as stdout, open(self.err_path, "w") as stderr:
            self.proc = subprocess.Popen(
                list(cmd), env=child_env(env), stdout=stdout, stderr=stderr,
                start_new_session=True,
            )  # fmt: skip
        self.ended = NAN

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and math.isnan(self.ended):
            self.ended = time.time()
        return code

    def wait(self, timeout: float = LAUNCH_TIMEOUT_S) -> int | None:
        """The exit code, or None when it still runs after ``timeout`` seconds (a hang)."""
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)
        return self.proc.returncode

    @property
    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def end(self) -> None:
        """SIGKILL whatever still runs in its session (what a hang or a killed launcher left)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def launch(
    out: Path, *script_args: object, nproc: int = 3, launch_args: Sequence[str] = RESTARTS,
    name: str = "launch", env: Mapping[str, str] | None = None,
) -> Job:  # fmt: skip
    cmd = [sys.executable, "-m", "rankwise.cli", "launch", f"--nproc-per-node={nproc}"]
    cmd += ["--on-failure", "continue", *launch_args, str(WORKER), str(out)]
    cmd += ["--epochs", str(EPOCHS), "--step-delay", str(STEP_DELAY), *map(str, script_args)]
    return Job(cmd, out, name, {**ENV, **(env or {})})


def wait_step(out: Path, step: int, job: Job) -> float:
    """Wait until some process trains optimizer step ``step``; the time then (NaN: the job
    ended first)."""
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while job.poll() is None and time.monotonic() < deadline:
        if any(row[2] >= step for row in steps_log(out)):
            return time.time()
        time.sleep(0.02)
    return NAN


def exit_time(job: Job, out: Path, slot: int) -> float:
    """Wait for ``job``, noting when the first process of ``slot`` ended (NaN: never seen)."""
    ended, pid = NAN, None
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while job.poll() is None and time.monotonic() < deadline:
        pid = pid or next(iter(pids(out, slot)), None)
        if pid is not None and math.isnan(ended) and not process_alive(pid):
            ended = time.time()
        time.sleep(0.01)
    return ended


def pids(out: Path, slot: int) -> list[int]:
    path = out / f"pids-{slot}"
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def step_seconds(out: Path) -> float:
    """The median time between one process's consecutive optimizer steps in the run."""
    rows = sorted(steps_log(out))
    gaps = [b[3] - a[3] for a, b in itertools.pairwise(rows) if a[:2] == b[:2] and b[2] > a[2]]
    return statistics.median(gaps) if gaps else NAN


def mark_time(path: Path) -> float:
    return float(path.read_text().split()[0]) if path.exists() else NAN


def next_step_after(out: Path, when: float, slots: Sequence[int]) -> float:
    """The first micro-batch of ``slots`` after ``when``, seconds after it."""
    later = [row[3] for row in steps_log(out) if row[0] in slots and row[3] > when]
    return min(later, default=NAN) - when


# -- what a run left ------------------------------------------------------------------------------


def stopped_with(code: int | None, stderr: str) -> str:
    """``finished``, ``hang``, or the first error a process raised (``stopped (1): TypeError``)."""
    if code is None:
        return "hang"
    if code == 0:
        return "finished"
    raised = re.search(r"^(?:\[rank\d+\]: )?(?:\w+\.)*(\w+(?:Error|Exception)): ", stderr, re.M)
    return f"stopped ({code}): {raised.group(1) if raised else 'no error named'}"


def audit(out: Path) -> AuditReport | None:
    return read_audit(out / "audit") if (out / "audit").exists() else None


def violations(report: AuditReport | None, finished: bool) -> int:
    """Exactly-once problems: every epoch of a finished run; of a run that stopped, every
    epoch it trained through, and no sample twice in the one it stopped in."""
    if report is None:
        return 1 if finished else 0
    if finished:
        return len(report.violations(NUM_SAMPLES, EPOCHS))
    last = max(report.counts, default=0)
    twice = [i for i, n in report.counts.get(last, {}).items() if n > 1]
    return len(report.violations(NUM_SAMPLES, last)) + bool(twice)


def lost_steps(report: AuditReport | None) -> int:
    """Steps an attempt trained (its step in flight included) past the step the next one went
    on from: a regroup's dropped partial step, a relaunch's steps since the checkpoint."""
    if report is None:
        return 0
    runs = report.attempts
    return sum(max(0, a.last_step - b.start_step) for a, b in itertools.pairwise(runs))


def check(trial: Trial, what: str, holds: bool) -> None:
    if not holds:
        trial.failed.append(what)


def finish(trial: Trial, out: Path, code: int | None, stderr: str, finished: bool) -> Trial:
    trial.outcome = stopped_with(code, stderr) if trial.outcome == "hang" else trial.outcome
    report = audit(out)
    trial.violations = violations(report, finished)
    trial.lost = lost_steps(report)
    return trial


def check_final_checkpoint(trial: Trial, out: Path) -> None:
    """A finished run with checkpoints: its newest one holds exactly the final weights."""
    final = out / "final.pt"
    stale = stale_final_checkpoint(out, torch.load(final)) if final.exists() else "no final.pt"
    check(trial, stale or "the final checkpoint holds the final weights", not stale)


def rejoined(slot: int) -> str:
    """What rank 0 says when ``slot`` came back into a world of 2 (the joiner says it when it
    is rank 0 again)."""
    return f"slot(s) [{slot}] rejoined; continuing on 3 rank(s) (was 2)"


def final_world(out: Path) -> int:
    path = out / "final-world"
    return int(path.read_text()) if path.exists() else 0


def next_restart_joined(t: Trial, out: Path, job: Job, slot: int, code: int | None) -> Trial:
    """The end of a class whose slot's second restart joins after its first was lost: it
    rejoined, the slot had 3 processes, the job finished on 3 ranks with its checkpoint."""
    check(t, "the next restart rejoined", rejoined(slot) in job.stdout)
    check(t, "3 processes in the slot", len(pids(out, slot)) == 3)
    check(t, "finished on 3 ranks", code == 0 and final_world(out) == 3)
    check_final_checkpoint(t, out)
    return finish(t, out, code, job.stderr, code == 0)


# -- the classes -----------------------------------------------------------------------------------


def preemption(out: Path, rng: random.Random, trial: int) -> Trial:
    step = rng.randint(2, STEPS - 1)
    t = Trial(f"SIGTERM to the launcher in step {step}; relaunch (resume='auto')")
    args = (*CHECKPOINTS, "--resume")
    first = launch(out, *args, name="launch-1")
    second: Job | None = None
    try:
        sent = wait_step(out, step, first)
        if math.isnan(sent):
            check(t, f"the job reached step {step} (it ended first)", False)
            return finish(t, out, first.wait(), first.stderr, False)
        first.proc.send_signal(signal.SIGTERM)
        code = first.wait(STOP_WAIT_S + 60)
        t.seconds, t.bound = first.ended - sent, STOP_WAIT_S
        err = first.stderr
        check(t, f"the launcher exits 143 (got {code})", code == 143)
        check(t, "SIGTERM forwarded", "SIGTERM received: forwarding SIGTERM" in err)
        check(t, "no rank SIGKILLed after the drain's bound", "ending it with SIGKILL" not in err)
        ranks = [pid for slot in range(3) for pid in pids(out, slot)]
        check(t, "every rank ended", not any(process_alive(pid) for pid in ranks))
        left = CheckpointManager(out / "ckpt").latest()
        held = int(re.sub(r"\D", "", left.name.split("-s")[-1])) if left is not None else 0
        second = launch(out, *args, name="launch-2")
        code = second.wait()
        check(t, "the relaunch finished", code == 0 and (out / "final.pt").exists())
        report = audit(out)
        starts = [a.start_step for a in report.attempts] if report else []
        check(t, f"the relaunch went on from the drained checkpoint (step {held}; attempts "
              f"started at {starts})", held in starts[1:])  # fmt: skip
        check_final_checkpoint(t, out)
        t.outcome = "exit 143, relaunch " + stopped_with(code, second.stderr)
        return finish(t, out, code, second.stderr, code == 0)
    finally:
        first.end()
        if second is not None:
            second.end()


def crash_before_init(out: Path, rng: random.Random, trial: int) -> Trial:
    slot, join = rng.randrange(3), rng.randint(1, STEPS_PER_EPOCH - 1)
    t = Trial(f"slot {slot} raises in its set-up; its restart joins in step {join}")
    job = launch(out, "--crash-before-init", slot, "--await-joiner-step", join, *CHECKPOINTS)
    try:
        code = job.wait()
        crashed = mark_time(out / f"error-{slot}")
        first_gen0 = min((row[3] for row in steps_log(out) if row[1] == 0), default=NAN)
        t.seconds, t.bound = first_gen0 - crashed, RENDEZVOUS_S
        report = audit(out)
        check(t, "its error named", "failed in its set-up" in job.stderr)
        worlds = [a.world_size for a in report.attempts] if report else []
        check(t, f"generation 0 of 2 ranks (worlds {worlds})", worlds[:1] == [2])
        check(t, "the restart rejoined", rejoined(slot) in job.stdout)
        check(t, "finished on 3 ranks", code == 0 and final_world(out) == 3)
        check_final_checkpoint(t, out)
        return finish(t, out, code, job.stderr, code == 0)
    finally:
        job.end()


def joiner_killed_waiting(out: Path, rng: random.Random, trial: int) -> Trial:
    slot, killed = rng.randrange(3), rng.randint(2, 5)
    waits, rejoins = killed + 1, rng.randint(killed + 3, STEPS - 2)
    after = round(rng.uniform(0.0, 1.0), 2)
    t = Trial(
        f"slot {slot} SIGKILLed in step {killed}; its restart SIGKILLed {after} s after it "
        f"asked to join (the members in step {waits}); the next restart joins in step {rejoins}"
    )
    job = launch(
        out, "--kill-slot", slot, "--kill-step", killed, "--joiner-dies-waiting",
        "--joiner-dies-after", after, "--await-joiner-death", waits,
        "--await-joiner-step", rejoins, *CHECKPOINTS, launch_args=["--max-restarts", "2"],
    )  # fmt: skip
    try:
        code = job.wait()
        died = mark_time(out / f"joiner-died-{slot}")
        others = [s for s in range(3) if s != slot]
        t.seconds, t.bound = next_step_after(out, died, others), STALE_S
        check(t, "the joiner died", not math.isnan(died))
        heads = [lines[0] for _, lines in read_audit_files(out / "audit")]
        admitted = [h for h in heads if (h.get("slot"), h.get("incarnation")) == (slot, 1)]
        check(t, "the dead joiner never let in (no audit file of restart 1)", not admitted)
        check(t, "no joiner lost on its way in", "the joiner was lost" not in job.stdout)
        return next_restart_joined(t, out, job, slot, code)
    finally:
        job.end()


def killed_in_setup(out: Path, rng: random.Random, trial: int) -> Trial:
    slot, killed = rng.randrange(3), rng.randint(2, 5)
    joins, rejoins = killed + 1, rng.randint(killed + 3, STEPS - 2)
    t = Trial(
        f"slot {slot} SIGKILLed in step {killed}; its restart is let in after step {joins} and "
        f"SIGKILLed as it enters the group's set-up; the next restart joins in step {rejoins}"
    )
    job = launch(
        out, "--kill-slot", slot, "--kill-step", killed, "--joiner-dies-in-setup", 1,
        "--await-joiner-step", f"{joins},{rejoins}", *CHECKPOINTS,
        launch_args=["--max-restarts", "2"], env=SETUP_ENV,
    )  # fmt: skip
    try:
        code = job.wait()
        died = mark_time(out / f"joiner-died-{slot}")
        others = [s for s in range(3) if s != slot]
        t.seconds, t.bound = next_step_after(out, died, others), SETUP_S + STALE_S + EXIT_S
        check(t, "the joiner died in the set-up", not math.isnan(died))
        lost = job.stdout.count(f"a peer was lost: slot {slot}")
        check(t, f"the slot named lost twice (the kill, the set-up; {lost})", lost == 2)
        return next_restart_joined(t, out, job, slot, code)
    finally:
        job.end()


def slow_rank0_after_fit(out: Path, rng: random.Random, trial: int) -> Trial:
    work = round(rng.uniform(OLD_GRACE_S + 1, OLD_GRACE_S + 5), 1)
    t = Trial(f"rank 0 works {work} s after fit, then writes final.pt; the others exit at once")
    job = launch(out, "--master-after-fit", work)
    try:
        code = job.wait()
        final = out / "final.pt"
        written = final.stat().st_mtime if final.exists() else NAN
        trained = max((row[3] for row in steps_log(out)), default=NAN)
        t.seconds, t.bound = job.ended - written, EXIT_S
        check(t, "the file written", final.exists())
        check(t, f"after {work} s of work", written - trained >= work)
        check(t, "exit 0", code == 0)
        return finish(t, out, code, job.stderr, code == 0)
    finally:
        job.end()


def launcher_killed(out: Path, rng: random.Random, trial: int) -> Trial:
    victim, step = rng.randrange(2), rng.randint(2, STEPS - 4)
    whole = trial % 2 == 1  # the trials alternate: the launcher alone, the node
    what = "its launcher and its 2 ranks" if whole else "its launcher alone (its ranks go on)"
    t = Trial(f"2 nodes x 2 ranks, a store apart; node {victim} SIGKILLed in step {step}: {what}")
    token = out / "token"
    out.mkdir(parents=True, exist_ok=True)
    token.write_text(secrets.token_hex(32) + "\n")
    token.chmod(0o600)
    port = free_port()
    store = Job(
        [sys.executable, "-m", "rankwise.cli", "store", "--host", "127.0.0.1", "--port", str(port),
         "--nnodes", "2", "--launcher-stale-s", str(LAUNCHER_STALE_S)], out, "store", ENV,
    )  # fmt: skip
    joined = ["--nnodes", "2", "--store-endpoint", f"127.0.0.1:{port}", "--job-token-file"]
    nodes = [
        launch(out, nproc=2, name=f"node-{n}",
               launch_args=[*RESTARTS, *joined, str(token), "--node-rank", str(n)])
        for n in range(2)
    ]  # fmt: skip
    other = nodes[1 - victim]
    try:
        sent = wait_step(out, step, nodes[victim])
        if math.isnan(sent):
            check(t, f"the job reached step {step}", False)
            return finish(t, out, other.wait(), other.stderr, False)
        if whole:
            os.killpg(nodes[victim].proc.pid, signal.SIGKILL)
        else:
            os.kill(nodes[victim].proc.pid, signal.SIGKILL)
        named = f"node(s) [{victim}]: no heartbeat from their launcher for {LAUNCHER_STALE_S:.0f} s"
        said = NAN  # when the store named the node gone (then it exits)
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while (other.poll() is None or store.poll() is None) and time.monotonic() < deadline:
            if math.isnan(said) and named in store.stderr:
                said = time.time()
            time.sleep(0.02)
        code, ends = other.wait(0), store.wait(0)
        orphans = [pid for s in (2 * victim, 2 * victim + 1) for pid in pids(out, s)]
        while any(process_alive(pid) for pid in orphans) and time.monotonic() < deadline:
            time.sleep(0.1)
        # The store names the node once its launcher's beat stood still for --launcher-stale-s
        # (the store reads the beats every 0.5 s; a beat every HEARTBEAT_S) and every other
        # node is done: the other node's end, when that comes later.
        t.seconds = said - sent
        t.bound = max(LAUNCHER_STALE_S + HEARTBEAT_S + 0.5, other.ended - sent + 0.5)
        t.detail = f"the store exited {store.ended - sent:.2f} s after the kill"
        check(t, f"the other node's launcher exits 0 (got {code})", code == 0)
        check(
            t,
            f"the store exits 1 (got {ends}) naming the node",
            ends == 1 and named in store.stderr,
        )
        check(t, "training finished", (out / "final.pt").exists())
        check(t, "no process left running", not any(process_alive(pid) for pid in orphans))
        if whole:
            check(t, "the survivors regrouped", "continuing on 2 rank(s) (was 4)" in other.stdout)
        t.outcome = f"the other node {stopped_with(code, other.stderr)}; store exit {ends}"
        return finish(t, out, code, other.stderr, (out / "final.pt").exists())
    finally:
        for job in (*nodes, store):
            job.end()


def fill_method() -> str | None:
    """How this machine can fill a disk for real: ``tmpfs`` (root, who may mount one; root
    ignores file modes), ``read-only`` (anyone else: the folder's modes), or None."""
    if os.geteuid() != 0:
        return "read-only"
    probe = Path(f"/tmp/rankwise-mount-probe-{os.getpid()}")
    probe.mkdir(exist_ok=True)
    try:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(probe)],
                          capture_output=True).returncode:  # fmt: skip
            return None
        subprocess.run(["umount", str(probe)], check=True)
        return "tmpfs"
    finally:
        probe.rmdir()


def disk_full(out: Path, rng: random.Random, trial: int) -> Trial:
    return _disk_full(out, rng, leave=0)


def real_disk_full(out: Path, rng: random.Random, trial: int) -> Trial:
    """The disk fills *during* a write: a part of a checkpoint is left free, so the write
    starts and torch's own writer meets ENOSPC inside the file (its ``RuntimeError ...
    unexpected pos`` over the OS error, issue 30), not the first open."""
    return _disk_full(out, rng, leave=rng.randrange(2, 10) * 4096)


def _disk_full(out: Path, rng: random.Random, leave: int) -> Trial:
    step, how = rng.randint(2, STEPS - EVERY), fill_method()  # saves still to come
    ckpt = out / "ckpt"
    ckpt.mkdir(parents=True)
    what = f"fills (leaving {leave // 1024} kB, part of a checkpoint)" if leave else "fills"
    t = Trial(f"the checkpoint folder {what if how == 'tmpfs' else 'turns'} {how} in step {step}")
    if how is None:
        check(t, "a way to fill a disk: neither root with mount nor a non-root user", False)
        return t
    if how == "tmpfs":
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(ckpt)],
                       check=True)  # fmt: skip
    job = launch(out, *CHECKPOINTS)
    try:
        filled = wait_step(out, step, job)
        if how == "tmpfs":
            with contextlib.suppress(OSError), open(ckpt / "filler", "wb") as f:
                while True:  # ENOSPC ends it: the disk is full
                    f.write(b"\0" * 4096)
                    f.flush()
            if leave:
                filler = ckpt / "filler"
                os.truncate(filler, max(0, filler.stat().st_size - leave))
        else:
            ckpt.chmod(0o555)
        code = job.wait()
        err = job.stderr
        failed = re.findall(
            r"CheckpointWriteError: writing the checkpoint (\S+) failed: \[Errno (\d+)\]", err
        )
        stops = [mark_time(out / f"error-{s}") for s in range(3)]
        t.seconds, t.bound = max(stops) - filled, TIMEOUT_S + 2 * EVERY * step_seconds(out)
        errno = "28" if how == "tmpfs" else "13"
        check(t, f"every rank once with the same file ({len(failed)} errors)",
              len(failed) == 3 and len(set(failed)) == 1)  # fmt: skip
        check(t, f"the path in the folder and errno {errno}", all(
            p.startswith(str(ckpt)) and e == errno for p, e in failed))  # fmt: skip
        check(t, "no rank took it for a lost peer", "continuing on" not in job.stdout)
        # A restart gives up before it asks to join: its set-up's probe finds the folder full
        # (or, had the disk been freed meanwhile, the running ranks' stop is on the store).
        gave_up = err.count("will not join: the running ranks stopped the job")
        gave_up += err.count(f"CheckpointWriteError: the checkpoint folder {ckpt} is not writable")
        check(t, f"each restart gave up at once ({gave_up} of 3)", gave_up == 3)
        check(t, "the job failed", code not in (0, None))
        return finish(t, out, code, err, False)
    finally:
        job.end()
        if how == "tmpfs":
            subprocess.run(["umount", "-l", str(ckpt)], capture_output=True)
        elif how == "read-only":
            ckpt.chmod(0o755)


OWN_ERRORS = {
    "dataloader": "RuntimeError: DataLoader worker (pid 4242) timed out after 5 seconds",
    "timeout": "TimeoutError: the feature store did not answer within 5 seconds",
}


def own_timeout_error(out: Path, rng: random.Random, trial: int) -> Trial:
    slot, step = rng.randrange(3), rng.randint(2, STEPS - 4)
    kind = list(OWN_ERRORS)[trial % 2]  # the trials alternate: a DataLoader's, a TimeoutError
    rejoins = rng.randint(step + 1, STEPS - 2)
    t = Trial(f"slot {slot} raises {OWN_ERRORS[kind].split(':')[0]} in step {step}; its "
              f"restart joins in step {rejoins}")  # fmt: skip
    job = launch(
        out, "--own-error", f"{slot}:{step}", "--own-error-kind", kind,
        "--await-joiner-step", rejoins, *CHECKPOINTS,
    )  # fmt: skip
    try:
        gone = exit_time(job, out, slot)
        code = job.wait()
        raised = mark_time(out / f"error-{slot}")
        t.seconds = next_step_after(out, raised, [s for s in range(3) if s != slot])
        t.bound = EXIT_S
        t.detail = f"its process exited {gone - raised:.2f} s after the error"
        err = job.stderr
        check(t, "its error in the output", OWN_ERRORS[kind] in err)
        # Its process exits with its error; one whose exit (the interpreter's teardown, after
        # finalize stopped its heartbeat) outlasts RANKWISE_STALE_S is left out of the next
        # generation and SIGKILLed by the launcher on its way out. Either way it is restarted.
        exited = re.search(rf"slot {slot} exited with (.+?); restarting it \(1/1\)", err)
        check(t, "the launcher restarted it", exited is not None)
        if exited is not None and "SIGKILL" in exited.group(1):
            t.detail += ", SIGKILLed by the launcher on its way out (left out of a generation)"
        check(t, "the others went on", "continuing on 2 rank(s) (was 3)" in job.stdout)
        check(t, "the restart rejoined", rejoined(slot) in job.stdout)
        check(t, "finished on 3 ranks", code == 0 and final_world(out) == 3)
        check_final_checkpoint(t, out)
        t.outcome = f"the slot failed and restarted; {stopped_with(code, err)}"
        return finish(t, out, code, err, code == 0)
    finally:
        job.end()


def lost_between_epochs(out: Path, rng: random.Random, trial: int) -> Trial:
    # Slot 0 writes the checkpoints: every other pair of trials loses it (its write in
    # flight). Even trials start the timer as the figures all-reduce begins (0-2 ms: inside
    # it, where it can end on one survivor and fail on another), odd ones after the step.
    slot, epoch = (0 if trial // 2 % 2 == 0 else rng.randrange(1, 3)), rng.randrange(EPOCHS)
    step = (epoch + 1) * STEPS_PER_EPOCH
    if trial % 2 == 0:
        delay = round(rng.uniform(0.0, 0.002), 5)
        t = Trial(f"slot {slot} SIGKILLed {delay} s into epoch {epoch}'s figures all-reduce")
        job = launch(out, "--kill-in-figures", f"{slot}:{epoch}:{delay}", *CHECKPOINTS)
    else:
        # The last epoch's closing (figures, the final save) takes about 0.1 s: a later kill
        # would find the slot's fit over.
        delay = round(rng.uniform(0.0, 0.08 if epoch == EPOCHS - 1 else 0.3), 3)
        t = Trial(f"slot {slot} SIGKILLed {delay} s after epoch {epoch}'s last step ({step})")
        job = launch(out, "--kill-late", f"{slot}:{step}:{delay}", *CHECKPOINTS)
    try:
        code = job.wait()
        killed = mark_time(out / f"killed-late-{slot}")
        if mark_time(out / f"fit-done-{slot}") < killed:  # its fit was over: nothing to test
            t.outcome = "the kill came after the slot's fit (not a trial of this class)"
            t.seconds, t.bound = 0.0, 1.0
            return finish(t, out, code, job.stderr, True)
        others = [s for s in range(3) if s != slot]
        if epoch < EPOCHS - 1:  # the survivors train the next epoch
            t.seconds = next_step_after(out, killed, others)
        else:  # the survivors close the last epoch and save
            t.seconds = job.ended - killed
        t.bound = TIMEOUT_S + STALE_S + EXIT_S
        err = job.stderr
        check(t, "it was killed", not math.isnan(killed))
        check(t, "the others went on", "continuing on 2 rank(s) (was 3)" in job.stdout)
        check(t, "no mismatched collectives", "invalid root rank" not in err)
        check(t, "finished", code == 0)
        check_final_checkpoint(t, out)
        return finish(t, out, code, err, code == 0)
    finally:
        job.end()


def early_exit_0(out: Path, rng: random.Random, trial: int) -> Trial:
    exits, raises = rng.sample(range(2), 2)  # one slot leaves with exit 0, the other raises
    k1 = rng.randint(2, STEPS_PER_EPOCH - 2)
    joins = rng.randint(k1 + 1, STEPS_PER_EPOCH)
    k2 = rng.randint(joins + 1, STEPS - 3)
    t = Trial(
        f"2 ranks: slot {exits} exits 0 in step {k1} (its restart joins in step {joins}); "
        f"slot {raises} raises in step {k2}"
    )
    job = launch(
        out, "--exit-zero", f"{exits}:{k1}", "--own-error", f"{raises}:{k2}",
        "--await-joiner-step", joins, *CHECKPOINTS, nproc=2,
        launch_args=["--max-restarts", "2"],
    )  # fmt: skip
    try:
        gone = exit_time(job, out, exits)
        code = job.wait()
        restarted = out / f"setup-{exits}-1"
        started = restarted.stat().st_mtime if restarted.exists() else NAN
        # The launcher sees the exit within its 0.1 s poll and starts the restart at once:
        # what is left is the restart's own start (the interpreter, torch's import).
        t.seconds, t.bound = started - gone, EXIT_S + 20
        err = job.stderr
        early = f"slot {exits} exited with exit code 0 before training finished"
        check(t, "the early exit 0 named and restarted", f"{early}" in err and "(1/2)" in err)
        check(t, f"slot {raises}'s error restarted", re.search(
            rf"slot {raises} exited with exit code 1; restarting it", err) is not None)  # fmt: skip
        check(t, "exit 0 if and only if final.pt", (code == 0) == (out / "final.pt").exists())
        check(t, "finished", code == 0)
        check_final_checkpoint(t, out)
        return finish(t, out, code, err, code == 0)
    finally:
        job.end()


TAMPER_KEY = "sweep-checkpoint-key"


def tampered_checkpoint(out: Path, rng: random.Random, trial: int) -> Trial:
    from rankwise.testing import TAMPERS, tamper_checkpoint

    how = list(TAMPERS)[trial % len(TAMPERS)] if trial < len(TAMPERS) else rng.choice(TAMPERS)
    if how == "unlisted-file":  # a sharded folder's; the sweep's checkpoints are files
        how = "payload-unlisted"
    step = rng.randint(EVERY + 2, STEPS - 2)  # at least one checkpoint before the newest
    t = Trial(f"SIGTERM in step {step}; the newest checkpoint tampered ({how}); relaunch")
    env = {"RANKWISE_CHECKPOINT_KEY": TAMPER_KEY}
    args = (*CHECKPOINTS, "--resume")
    first = launch(out, *args, name="launch-1", env=env)
    second: Job | None = None
    marker = out / "payload-ran"
    try:
        if math.isnan(wait_step(out, step, first)):
            check(t, f"the job reached step {step}", False)
            return finish(t, out, first.wait(), first.stderr, False)
        first.proc.send_signal(signal.SIGTERM)
        first.wait(STOP_WAIT_S + 60)
        newest = CheckpointManager(out / "ckpt").latest()
        if newest is None:
            check(t, "a checkpoint to tamper with", False)
            return finish(t, out, None, first.stderr, False)
        tampered = tamper_checkpoint(str(newest), how, marker=marker)
        began = time.time()
        second = launch(out, *args, name="launch-2", env=env)
        code = second.wait()
        first_step = min((row[3] for row in steps_log(out) if row[3] > began), default=NAN)
        t.seconds, t.bound = first_step - began, RENDEZVOUS_S
        err = second.stderr
        check(t, "no code from the checkpoint ran", not marker.exists())
        check(t, f"the tampered checkpoint refused, naming it ({Path(tampered).name})",
              Path(tampered).name in err)  # fmt: skip
        report = audit(out)
        starts = [a.start_step for a in report.attempts] if report else []
        held = int(newest.name.split("-s")[-1].split(".")[0])
        check(t, f"the relaunch went on from an earlier checkpoint (attempts at {starts})",
              bool(starts[1:]) and starts[-1] < held)  # fmt: skip
        check(t, "the relaunch finished", code == 0)
        t.outcome = "exit 143, relaunch " + stopped_with(code, err)
        return finish(t, out, code, err, code == 0)
    finally:
        first.end()
        if second is not None:
            second.end()


def _store_port_args(port: int) -> list[str]:
    return ["--max-restarts", "1", "--master-port", str(port)]


def replayed_proof(out: Path, rng: random.Random, trial: int) -> Trial:
    from rankwise.testing.store_attacks import StoreRecorder, connect, protocol_keys, replay

    slot, killed = rng.randrange(1, 3), rng.randint(2, 4)
    joins = rng.randint(killed + 1, STEPS_PER_EPOCH - 1)
    t = Trial(
        f"slot {slot} SIGKILLed in step {killed}, its restart joins in step {joins} and is "
        "SIGKILLed again (no restarts left); a store client replays what it recorded"
    )
    port = free_port()
    recorder = StoreRecorder("127.0.0.1", port, protocol_keys(3, generations=8)).start()
    job = launch(
        out, "--kill-slot", slot, "--kill-step", killed, "--await-joiner-step", joins,
        *CHECKPOINTS, launch_args=_store_port_args(port),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while rejoined(slot) not in job.stdout and job.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        restart = pids(out, slot)[1:]
        if not restart or job.poll() is not None:
            check(t, "the restart rejoined before the job ended", False)
            return finish(t, out, job.wait(), job.stderr, False)
        os.kill(restart[0], signal.SIGKILL)
        while "continuing on 2 rank(s) (was 3)" not in job.stdout.split(rejoined(slot))[-1]:
            if job.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        recorded = recorder.stop()
        stranger = connect("127.0.0.1", port)
        replayed = time.time()
        replay(stranger, recorded, slot=slot, incarnation=1)
        admitted = False
        while job.poll() is None:
            try:
                admitted = admitted or bool(stranger.check([f"admit/{slot}/1"]))
            except Exception:  # the launcher closed its store on its way out
                break
            time.sleep(0.05)
        code = job.wait()
        others = [s for s in range(3) if s != slot]
        t.seconds, t.bound = next_step_after(out, replayed, others), STALE_S
        check(t, "the replayed proof never admitted", not admitted)
        check(t, "recorded the first join", bool(recorded.get(f"proof/{slot}/1")))
        check(t, "finished on 2 ranks", code == 0 and final_world(out) == 2)
        check_final_checkpoint(t, out)
        return finish(t, out, code, job.stderr, code == 0)
    finally:
        recorder.stop()
        job.end()


CHAOS_S = (
    300.0  # the chaos test's bound on a job it disturbs (tests/launch/test_launch_continue.py)
)


def store_chaos(out: Path, rng: random.Random, trial: int) -> Trial:
    from rankwise.testing.store_attacks import StoreChaos, connect, protocol_keys

    slot, killed = rng.randrange(3), rng.randint(2, 4)
    joins = rng.randint(killed + 2, STEPS_PER_EPOCH)
    port = free_port()
    chaos = StoreChaos(
        "127.0.0.1", port, protocol_keys(3, generations=8), slot=(slot + 1) % 3,
        incarnation=99, seed=rng.randrange(1 << 30), interval_s=0.02,
    )  # fmt: skip
    t = Trial(
        f"a store client writes garbage, replays and deletes every 20 ms; slot {slot} "
        f"SIGKILLed in step {killed}, its restart joins in step {joins}"
    )
    began = time.time()
    job = launch(
        out, "--kill-slot", slot, "--kill-step", killed, "--await-joiner-step", joins,
        *CHECKPOINTS, launch_args=_store_port_args(port),
    )  # fmt: skip
    try:
        store = connect("127.0.0.1", port)
        with contextlib.suppress(Exception):
            store.wait(["member/0"], datetime.timedelta(seconds=120))
        chaos.start()
        code = job.wait(CHAOS_S + 60)
        chaos.stop()
        t.seconds, t.bound = job.ended - began, CHAOS_S
        err = job.stderr
        named = any(n in err for n in ("RegroupError", "RemovedError", "JoinerLostError",
                                       "DistributedConnectionError"))  # fmt: skip
        check(t, "the chaos client never admitted", not chaos.admitted)
        check(t, "no value crashed a rank", "ValueError" not in err and "KeyError" not in err)
        check(t, "finished, or stopped naming a rankwise error", code == 0 or named)
        check(t, "exit 0 if and only if training finished (final.pt)",
              (code == 0) == (out / "final.pt").exists())  # fmt: skip
        t.detail = f"{chaos.ops} store operations by the client"
        if code == 0:
            check_final_checkpoint(t, out)
        t.outcome = "finished or a named error" if code == 0 or named else stopped_with(code, err)
        return finish(t, out, code, err, code == 0)
    finally:
        chaos.stop()
        job.end()


def frozen_store(out: Path, rng: random.Random, trial: int) -> Trial:
    from rankwise.testing.frozen_store import frozen_store as run_frozen

    step, freeze_s = rng.randint(2, STEPS - 6), round(rng.uniform(3.0, 8.0), 1)
    t = Trial(f"the object store SIGSTOPped for {freeze_s} s in step {step} (a save every step)")
    job = out / "job"
    job.mkdir(parents=True, exist_ok=True)
    run = run_frozen(
        WORKER, out, freeze_when=lambda: any(row[2] >= step for row in steps_log(job)),
        freeze_s=freeze_s, nproc=3,
        script_args=[str(job), "--epochs", str(EPOCHS), "--step-delay", str(STEP_DELAY),
                     "--checkpoint-every", "1", "--silent-s", "1"],
        launch_args=["--on-failure", "continue", *RESTARTS], env=ENV, timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip
    rows = sorted(steps_log(job))
    gaps = [
        b[3] - a[3] for a, b in itertools.pairwise(rows) if a[:2] == b[:2] and b[2] > a[2]
    ]  # fmt: skip
    t.seconds, t.bound = max(gaps, default=NAN), 2.0
    during = [r for r in rows if run.frozen_at <= r[3] <= run.thawed_at]
    t.detail = f"{len({r[2] for r in during})} steps trained while the store was frozen"
    said = run.stderr.count(f"the checkpoint store {run.url} has not answered for")
    check(t, f"the store's silence said once ({said})", said == 1)
    check(t, "steps trained while it was frozen", bool(during))
    final = job / "final.pt"
    if run.latest is not None and final.exists():
        params = torch.load(final)
        model = run.latest[1]["model"]
        check(t, "the newest checkpoint holds the final weights",
              all(torch.equal(model[k], params[k]) for k in params))  # fmt: skip
    else:
        check(t, "a final model and a checkpoint", False)
    return finish(t, job, run.returncode, run.stderr, run.returncode == 0)


CLASSES = [
    FaultClass("preemption", preemption, "exit 143, relaunch finished",
               "SIGTERM -> launcher exit <= the drain's bound (STOP_WAIT_S)"),
    FaultClass("crash-before-init", crash_before_init, "finished",
               "crash -> generation 0's first step <= the rendezvous timeout"),
    FaultClass("joiner-killed-waiting", joiner_killed_waiting, "finished",
               "joiner's death -> the members' next step <= RANKWISE_STALE_S"),
    FaultClass("slow-rank0-after-fit", slow_rank0_after_fit, "finished",
               "rank 0's file written -> launcher exit <= a process's exit"),
    FaultClass("launcher-killed", launcher_killed, "the other node finished; store exit 1",
               "kill -> the store names the node gone <= max(--launcher-stale-s + a beat + its "
               "0.5 s poll, the other node's end)"),
    FaultClass("disk-full", disk_full, "stopped: CheckpointWriteError, each rank once",
               "disk full -> every rank stopped <= 2 save intervals + the collective timeout"),
    FaultClass("own-timeout-error", own_timeout_error, "the slot failed and restarted; finished",
               "the rank's error -> the others' next step <= its process's exit and a regroup"),
    FaultClass("real-disk-full", real_disk_full, "stopped: CheckpointWriteError, each rank once",
               "disk full mid-write -> every rank stopped <= 2 save intervals + the collective "
               "timeout"),
    FaultClass("early-exit-0", early_exit_0, "finished",
               "the early exit -> its restart's set-up <= a process's start and exit"),
    FaultClass("tampered-checkpoint", tampered_checkpoint, "exit 143, relaunch finished",
               "relaunch -> its first step <= the rendezvous timeout"),
    FaultClass("replayed-proof", replayed_proof, "finished",
               "the replay -> the members' next step <= RANKWISE_STALE_S"),
    FaultClass("frozen-store", frozen_store, "finished",
               "the longest gap between two steps <= 2 s (never the store's silence)"),
    FaultClass("store-chaos", store_chaos, "finished or a named error",
               "launch -> the job's end <= the chaos test's bound"),
    FaultClass("lost-between-epochs", lost_between_epochs, "finished",
               "kill -> the survivors' next step (or the job's end after the last epoch) <= "
               "the collective timeout + RANKWISE_STALE_S + a process's exit"),
    FaultClass("killed-in-setup", killed_in_setup, "finished",
               "joiner's death -> the members' next step <= the set-up timeout + "
               "RANKWISE_STALE_S + a process's exit"),
]  # fmt: skip
NAMES = [c.name for c in CLASSES]


# -- the sweep -------------------------------------------------------------------------------------


def class_sweep(args: argparse.Namespace, workdir: Path) -> tuple[bool, str]:
    """Run ``args.trials`` trials of each class in ``args.classes``; print a line per trial
    and the table; whether every trial ended as its class must."""
    chosen = [c for c in CLASSES if c.name in args.classes]
    rng = random.Random(args.seed)
    started = time.perf_counter()
    results: list[tuple[FaultClass, list[Trial]]] = []
    for fault_class in chosen:
        trials = []
        for i in range(args.trials):
            out = workdir / f"{fault_class.name}-{i}"
            if out.exists():
                shutil.rmtree(out)
            began = time.perf_counter()
            trial = fault_class.run(out, rng, i)
            print(
                f"{fault_class.name} {i}: {'ok ' if trial.ok else 'BAD'} {trial.fault} -> "
                f"{trial.outcome}; {trial.seconds:.2f} s (bound {trial.bound:.1f} s), "
                f"violations {trial.violations}, lost {trial.lost}, "
                f"{time.perf_counter() - began:.0f} s"
                + (f"; {trial.detail}" if trial.detail else "")
                + (f"; failed: {'; '.join(trial.failed)}" if trial.failed else ""),
                flush=True,
            )
            trials.append(trial)
        results.append((fault_class, trials))
    seconds = time.perf_counter() - started
    print(table(results, seconds))
    good = sum(t.ok for _, trials in results for t in trials)
    total = sum(len(trials) for _, trials in results)
    return good == total, f"classes: {good}/{total} trials as expected, {seconds:.0f} s"


def table(results: list[tuple[FaultClass, list[Trial]]], seconds: float) -> str:
    """The markdown table: per class, the trials as expected, the outcomes against the one
    expected, the worst time against its bound, violations and work lost."""
    lines = [
        "",
        "| class | as expected | outcome (expected) | time to the end, worst of the trials "
        "(bound: what) | exactly-once violations | work lost (steps, max) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for c, trials in results:
        outcomes = "; ".join(sorted({t.outcome for t in trials}))
        worst = max(trials, key=lambda t: t.seconds / t.bound if t.seconds <= t.bound else math.inf)
        lines.append(
            f"| {c.name} | {sum(t.ok for t in trials)}/{len(trials)} | {outcomes} ({c.expect}) | "
            f"{worst.seconds:.2f} s ({worst.bound:.1f} s: {c.timed}) | "
            f"{sum(t.violations for t in trials)} | {max(t.lost for t in trials)} |"
        )
    lines.append(f"\ntotal {seconds:.0f} s")
    return "\n".join(lines)
