"""Fault sweep: K random failures, each recovered under ``--max-restarts``, against one
uninterrupted run (issues 10 and 16), for ``--on-failure restart`` (the default), ``continue``
or ``both`` (one table each, in one run).

``--on-failure restart`` (issue 10). Each trial launches tests/scripts/fault_worker.py on 2
gloo ranks (2 epochs x 12 optimizer steps, a checkpoint every 3) with one random fault on the
first attempt: a SIGKILL of a random rank inside a random step, or (one trial in three) a
SIGKILL of the writing rank at a random point of a random checkpoint save. Then it reports:

- survived/total: the relaunched job exited 0 and wrote its weights;
- max parameter difference to the uninterrupted run (goal: 0, same world size);
- exactly-once violations: samples missing or repeated in an epoch, from the audit logs'
  committed records (goal: 0);
- corrupt resumes: a resume that had to skip a checkpoint file or failed to load one (goal: 0);
- time from the failure to the first micro-batch of the resumed attempt;
- work lost per failure: optimizer steps done (or in flight) past the checkpoint resumed from
  (goal: at most one checkpoint interval, 3, plus the steps trained while the last background
  write was in flight: ``fit`` saves in the background by default).

``--on-failure continue`` (issue 16). Each launch runs tests/scripts/continue_worker.py on 3
gloo ranks under ``rankwise launch --on-failure continue --max-restarts 3`` (6 epochs x 8
optimizer steps, global batch 24, background checkpoints every 3 steps and at each epoch's end,
``DISTRIBUTED_COLLECTIVE_TIMEOUT_MS`` 3000 so that a freeze is seen in seconds) and takes 3
random strikes, one in each third of the run: a SIGKILL of a random slot inside a step (after
its gradient reached the others), a SIGSTOP of a random slot there (a freeze: seen only when
the collective times out), or a SIGKILL of the writing rank at a random point of a background
checkpoint write (the last third reaches the final checkpoint, written after the last step).
After a strike the members wait in each step until the restarted process asks to join, so
every strike hits a world of 3 (the launch's length does not depend on how fast a process
starts). K counts strikes (K/3 launches). Per strike and per launch it reports:

- survived: the launch exited 0 and wrote its weights;
- exactly-once violations across the membership changes (``read_audit``: each regroup and
  each rejoin is an attempt; goal 0);
- max |weights - reference| against one uninterrupted continue run (goal < 1e-4);
- survivors' restarts: restarts of slots beyond the strikes that hit them (PID files; goal 0);
- kill-to-next-step: from the signal to the first micro-batch the survivors train in the
  next generation (goal: median <= 2 s for kills), kills, freezes and in-save kills apart;
- steps redone: steps trained in the struck generation past the step the next one went on
  from (goal 0: the partial step is dropped, never a completed one).

``--classes [NAME,...]`` (issue 23, beside the random sweeps; implemented in
benchmarks/faults_classes.py): per fault class ``--trials`` (2) real ``rankwise launch
--on-failure continue`` jobs of tests/scripts/continue_worker.py (3 gloo ranks unless said,
2 epochs x 8 optimizer steps, global batch 24, ``--max-restarts 1`` unless said, collective
timeout 3 s so that a hang shows as an error, background checkpoints every 3 steps in classes
1-3, 6 and 7, whose newest must then hold the final weights exactly), one at a time, each with
exactly one fault of that class at a random step (or slot):

1. preemption: SIGTERM to the launcher (background checkpoints every 3 steps,
   ``resume="auto"``), then the same command again: the launcher drains and exits 143 within
   its 30 s bound, every rank ended; the relaunch finishes, exactly once across both.
2. crash-before-init: a slot raises in its set-up, before ``rankwise.distributed`` starts:
   generation 0 forms from the other two (once the launcher marks it dead, not after the
   rendezvous timeout), its restart joins, the job finishes on 3 ranks.
3. joiner-killed-waiting: a slot is SIGKILLed in a step; its restart asks to join and is
   SIGKILLed while it waits (the members hold that step until the launcher has marked it
   dead): it is never let in, the members go on at once (within ``RANKWISE_STALE_S``), the
   slot's next restart (``--max-restarts 2``) joins and the job finishes on 3 ranks.
4. slow-rank0-after-fit: rank 0 works 21-25 s after ``fit`` (past the 20 s the launcher used
   to give) before it writes its file; the others exit at once: the launcher waits, the file
   exists, exit 0.
5. launcher-killed: two launchers on this machine (``--nnodes 2``, 2 ranks each) and a
   ``rankwise store --launcher-stale-s 5`` apart; one node's launcher is SIGKILLed, alone
   (its ranks train on) or with its ranks (a lost node: the others regroup), trials
   alternating: the other node finishes (exit 0) and the store ends within its bound with
   ``node(s) [N]: no heartbeat from their launcher``, no hang.
6. disk-full: the checkpoint folder (saves every 3 steps) is a 1 MiB tmpfs that the sweep
   fills to ENOSPC mid-run (as root, who ignores file modes but may mount; as another user
   the folder is made read-only instead, EACCES): every rank stops once, at the next save,
   with the same ``CheckpointWriteError`` naming the file and the OS error; no regroup; each
   restart gives up at once.
7. own-timeout-error: a slot's own code raises a timeout error mid-step, while fetching its
   data (a DataLoader's ``RuntimeError: ... timed out``, or a ``TimeoutError``: trials
   alternate): its own failure, never taken for a lost peer (``rankwise.distributed.classify``).
   As docs/continue.md says, that rank exits with its error (its traceback printed), the
   others go on without it once its process is gone (or its heartbeat, stopped at exit, stood
   still for ``RANKWISE_STALE_S``: then the launcher ends the exiting process), the launcher
   restarts it and it rejoins: the job finishes.

The classes of issue 30 (trust, second round):

8. real-disk-full: as disk-full, but the tmpfs is left with 8-36 kB free, part of one
   checkpoint: the write starts and fails inside torch's own writer (its ``RuntimeError ...
   unexpected pos`` over the OS error): still one ``CheckpointWriteError`` per rank, errno 28.
9. early-exit-0: 2 ranks, ``--max-restarts 2``: one slot exits 0 mid-epoch (a script that
   left early), the other raises later: both are restarted and named, the job finishes and
   exits 0 only with its final model.
10. tampered-checkpoint: a job with ``RANKWISE_CHECKPOINT_KEY`` set is SIGTERMed, its newest
   checkpoint tampered (each of ``rankwise.testing.TAMPERS`` in turn: a pickle payload, a
   rehash, a stripped or forged MAC, a step renamed ...), and relaunched: the tampered
   checkpoint is refused naming it, the relaunch goes on from an earlier one, no code from
   the checkpoint runs (the payload's marker file never appears).
11. replayed-proof: a slot is SIGKILLed, its restart rejoins and is SIGKILLed again (no
   restarts left); a store client that recorded the store meanwhile
   (``rankwise.testing.store_attacks``) replays the dead and member marks, the join request,
   challenge and proof and deletes the admit mark: never admitted, the job finishes on 2.
12. frozen-store: 3 ranks save every step to their own SeaweedFS, which is SIGSTOPped for
   3-8 s: no gap between two steps passes 2 s, the silence is said once, the newest
   checkpoint holds the final weights.
13. store-chaos: a store client writes garbage, replays values to other keys and deletes
   keys across the protocol every 20 ms, and asks to join with made-up proofs, during a job
   with a kill and a rejoin: never admitted, no value crashes a rank; the job finishes
   exactly once or stops naming a rankwise error.
14. killed-in-setup: a slot is SIGKILLed in a step; its restart is let in and SIGKILLed as it
   enters the new generation's group set-up (its ready mark written: the members wait in
   gloo's rendezvous, where nobody watches heartbeats), ``RANKWISE_SETUP_TIMEOUT_S`` 5 and a
   collective timeout of 60 s (not 3): the members give the group up after the set-up
   timeout (before, the group's set-up waited out the collective timeout itself), recover
   without it, and the slot's next restart joins: the job finishes on 3 ranks.
15. lost-between-epochs: a slot (the writing rank 0 in every other pair of trials) is
   SIGKILLed by a timer started as the epoch's figures all-reduce begins (0-2 ms) or 0-0.3 s
   after an epoch's last step, so that it dies in the figures all-reduce, the save or their
   barriers, where a collective can end on one survivor and fail on another: the survivors agree where they stopped (rankwise.train.closings) and the
   job finishes exactly once, its newest checkpoint the final weights.

Per class it reports the outcome (``finished``, or the error a job stopped with, read from
its output), the time to that end against the class's bound, exactly-once violations
(``read_audit``; for a job that stops, over what it committed: every epoch it went through,
nothing twice in the last) and the work lost (optimizer steps trained past the step the next
attempt went on from). A trial is as expected when all its class's checks hold, its time is
within the bound and it has no violation.

    python benchmarks/faults.py --k 100 --jobs 6                        # restart, as before
    python benchmarks/faults.py --on-failure both --k 100 --jobs 2       # the two tables
    python benchmarks/faults.py --on-failure both --k 100 --restart-k 30 --jobs 2  # shorter
    python benchmarks/faults.py --classes --trials 2                     # the fault classes
    python benchmarks/faults.py --classes disk-full,preemption --trials 1
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from faults_classes import NAMES, class_sweep  # beside this file
from faults_continue import continue_sweep

from rankwise.testing import run_script
from rankwise.train import FAULT_POINTS, read_audit

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "scripts" / "fault_worker.py"
NUM_SAMPLES, EPOCHS, STEPS, EVERY = 192, 2, 24, 3
# The worker saves every EVERY steps; the saves due at an epoch's end fall on such a step and are
# one file, so a run makes STEPS // EVERY saves. A --kill-save-index past them never strikes.
SAVES = STEPS // EVERY


NO_FAILURE = "no failure happened"


@dataclass
class Trial:
    fault: str
    survived: bool = False
    max_diff: float = float("nan")
    violations: int = 0
    corrupt: int = 0
    recovery_s: float = float("nan")
    lost_steps: int = 0
    note: str = ""


def pick_fault(rng: random.Random) -> list[str]:
    if rng.random() < 1 / 3:
        point = rng.choice(FAULT_POINTS)
        index = rng.randrange(SAVES)
        return ["--kill-in-save", point, "--kill-save-index", str(index)]
    rank, step = rng.randrange(2), rng.randint(1, STEPS)
    return ["--kill-rank", str(rank), "--kill-step", str(step)]


def run_trial(out: Path, fault: list[str], reference: dict[str, torch.Tensor]) -> Trial:
    trial = Trial(" ".join(fault))
    result = run_script(
        WORKER, 2, script_args=[str(out), *fault], launch_args=["--max-restarts", "2"], timeout=600
    )
    trial.corrupt = result.stderr.count("CheckpointWarning") + result.stderr.count(
        "CheckpointError"
    )
    if result.returncode != 0 or not (out / "final.pt").exists():
        trial.note = result.stderr[-2000:]
        return trial
    if trial.corrupt:  # name what the resume skipped (the warning's text)
        warned = [line for line in result.stderr.splitlines() if "Checkpoint" in line]
        trial.note = " | ".join(warned)[:600]
    trial.survived = True
    params = torch.load(out / "final.pt")
    trial.max_diff = max((params[k] - reference[k]).abs().max().item() for k in reference)
    report = read_audit(out / "audit")
    trial.violations = len(report.violations(NUM_SAMPLES, EPOCHS))
    if len(report.attempts) >= 2:
        failed, resumed = report.attempts[0], report.attempts[1]
        marks = list(out.glob("killed-rank*"))
        times = [b["time"] for b in failed.batches]
        failed_at = float(marks[0].read_text()) if marks else max(times, default=failed.started)
        first = min((b["time"] for b in resumed.batches), default=float("nan"))
        trial.recovery_s = first - failed_at
        trial.lost_steps = failed.last_step - resumed.start_step
    else:
        trial.note = NO_FAILURE  # e.g. a fault point this run never reached
    return trial


def reference_run(workdir: Path) -> dict[str, torch.Tensor]:
    out = workdir / "reference"
    workdir.mkdir(parents=True, exist_ok=True)
    result = run_script(WORKER, 2, script_args=[str(out)], timeout=600)
    if result.returncode != 0:
        sys.exit(f"the uninterrupted run failed:\n{result.stderr[-3000:]}")
    return torch.load(out / "final.pt")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--k", type=int, default=10, help="number of failures (trials / strikes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="launches run at once")
    p.add_argument("--on-failure", choices=("restart", "continue", "both"), default="restart")
    p.add_argument("--restart-k", type=int, help="trials of the restart sweep (default: --k)")
    p.add_argument("--reference", type=Path, help="final.pt of an uninterrupted run (reused)")
    p.add_argument("--workdir", type=Path, help="where runs go (default: a temporary folder)")
    p.add_argument(
        "--classes",
        nargs="?",
        const=",".join(NAMES),
        help="run the fault-class sweep instead (see above): every class, or those named, "
        f"comma-separated, of: {', '.join(NAMES)}",
    )
    p.add_argument("--trials", type=int, default=2, help="--classes: trials per class")
    args = p.parse_args(argv)
    if args.classes is not None:
        args.classes = [c.strip() for c in args.classes.split(",") if c.strip()]
        unknown = sorted(set(args.classes) - set(NAMES))
        if unknown or not args.classes or args.trials < 1:
            p.error(f"--classes takes names of {', '.join(NAMES)} (got {unknown or 'none'}) "
                    f"and --trials ({args.trials}) must be >= 1")  # fmt: skip
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rankwise-faults-"))
        ok, line = class_sweep(args, workdir / "classes")
        print(f"\n{line}")
        return 0 if ok else 1
    if args.k < 1 or args.jobs < 1:
        p.error(f"--k ({args.k}) and --jobs ({args.jobs}) must be >= 1")
    if args.restart_k is not None and args.restart_k < 1:
        p.error(f"--restart-k ({args.restart_k}) must be >= 1")
    if args.reference and args.on_failure == "both":
        p.error("--reference is one mode's uninterrupted run: use it with restart or continue")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rankwise-faults-"))
    ok, summaries = True, []
    if args.on_failure in ("restart", "both"):
        print("== --on-failure restart ==", flush=True)
        good, line = restart_sweep(args, workdir / "restart")
        ok, summaries = ok and good, [*summaries, line]
    if args.on_failure in ("continue", "both"):
        print("\n== --on-failure continue ==", flush=True)
        good, line = continue_sweep(args, workdir / "continue")
        ok, summaries = ok and good, [*summaries, line]
    print()
    for line in summaries:
        print(line)
    return 0 if ok else 1


def restart_sweep(args: argparse.Namespace, workdir: Path) -> tuple[bool, str]:
    started = time.perf_counter()
    reference = torch.load(args.reference) if args.reference else reference_run(workdir)
    rng = random.Random(args.seed)
    k = args.restart_k or args.k
    faults = [pick_fault(rng) for _ in range(k)]
    trials: list[Trial] = []
    with ThreadPoolExecutor(args.jobs) as pool:
        runs = pool.map(
            lambda i: run_trial(workdir / f"trial-{i:04d}", faults[i], reference), range(k)
        )
        for i, trial in enumerate(runs):  # as they finish, in order: a cut-off run keeps these
            print(trial_line(i, trial), flush=True)
            trials.append(trial)
    line = report(trials, time.perf_counter() - started)
    ok = all(t.survived and t.violations == 0 and t.corrupt == 0 for t in trials)
    return ok, line


def trial_line(i: int, t: Trial) -> str:
    return (
        f"trial {i:3d}  {t.fault:<52s} survived={t.survived!s:5s} diff={t.max_diff:.3g} "
        f"violations={t.violations} corrupt={t.corrupt} lost={t.lost_steps} "
        f"recovery={t.recovery_s:.1f}s {t.note[:300]!r}"
    )


def report(trials: list[Trial], seconds: float) -> str:
    survived = [t for t in trials if t.survived]
    failed = [t for t in survived if t.note != NO_FAILURE]
    recovered = [t.recovery_s for t in failed if t.recovery_s == t.recovery_s]
    lost = [t.lost_steps for t in failed]
    diff = max((t.max_diff for t in survived), default=float("nan"))
    print()
    print(f"survived {len(survived)}/{len(trials)}")
    unreached = len(survived) - len(failed)
    print(f"failures that struck {len(trials) - unreached} ({unreached} never reached their point)")
    print(f"max parameter difference {diff:.3g}")
    print(f"exactly-once violations {sum(t.violations for t in trials)}")
    print(f"corrupt resumes {sum(t.corrupt for t in trials)}")
    if recovered:
        print(
            f"failure -> first resumed step: median {statistics.median(recovered):.1f} s, "
            f"max {max(recovered):.1f} s"
        )
    if lost:
        print(
            f"work lost per failure: mean {statistics.mean(lost):.2f} steps, max {max(lost)} "
            f"(checkpoint interval {EVERY})"
        )
    print(f"total {seconds:.0f} s")
    median = statistics.median(recovered) if recovered else float("nan")
    return (
        f"restart: {len(survived)}/{len(trials)} survived, "
        f"{sum(t.violations for t in trials)} exactly-once violations, max diff {diff:.3g}, "
        f"failure -> first resumed step median {median:.1f} s, "
        f"max {max(recovered, default=float('nan')):.1f} s, {seconds:.0f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
