"""The ``--on-failure continue`` half of benchmarks/faults.py (its docstring says what it
measures): launches of tests/scripts/continue_worker.py on 3 ranks, 3 random strikes each."""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from rankwise.testing import run_script
from rankwise.train import FAULT_POINTS, read_audit

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "scripts" / "continue_worker.py"
NUM_SAMPLES, EPOCHS, STEPS_PER_EPOCH, EVERY = 192, 6, 8, 3
STEPS = EPOCHS * STEPS_PER_EPOCH
STRIKES, STEP_DELAY, TIMEOUT_MS = 3, 0.05, 3000
WORKER_ARGS = ["--epochs", str(EPOCHS), "--checkpoint-every", str(EVERY)]
# Every strike hits a world of 3: after one, the members wait in each step for the restart.
STRIKE_ARGS = ["--step-delay", str(STEP_DELAY), "--await-joiners"]
LAUNCH_ARGS = ["--on-failure", "continue", "--max-restarts", str(STRIKES)]
ENV = {"DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": str(TIMEOUT_MS)}
NAN = float("nan")


@dataclass
class Strike:
    spec: str  # as passed to --strikes
    kind: str = ""  # kill, freeze, save (empty: it never struck)
    slot: int = -1
    latency_s: float = NAN  # signal -> first micro-batch of the next generation
    redone: int = 0


@dataclass
class Launch:
    strikes: list[Strike]
    survived: bool = False
    violations: int = 0
    max_diff: float = NAN
    survivor_restarts: int = 0
    corrupt: int = 0  # checkpoint warnings or errors, and a final checkpoint that differs
    seconds: float = 0.0
    note: str = ""


def pick_strikes(rng: random.Random) -> list[str]:
    """3 strikes, one in each third of steps 2..STEPS (a save strike at step STEPS hits the
    final checkpoint, written after the last step)."""
    span = (STEPS - 1) // STRIKES
    specs = []
    for i in range(STRIKES):
        step = rng.randint(2 + i * span, 1 + (i + 1) * span if i < STRIKES - 1 else STEPS)
        roll = rng.random()
        if roll < 0.35:
            specs.append(f"{rng.choice(FAULT_POINTS)}@{step}")
        else:
            specs.append(f"{'kill' if roll < 0.7 else 'stop'}@{rng.randrange(3)}:{step}")
    return specs


def steps_log(out: Path) -> list[tuple[int, int, int, float]]:
    """``(slot, generation, step, time)`` of every micro-batch every process trained (a line
    being written, read while the run goes on, is left out)."""
    rows = []
    for path in out.glob("steps-*"):
        slot = int(path.name.split("-")[1])
        for line in path.read_text().split("\n")[:-1]:  # complete lines only
            gen, step, t = line.split()
            rows.append((slot, int(gen), int(step), float(t)))
    return rows


def run_launch(out: Path, specs: list[str], reference: dict[str, torch.Tensor]) -> Launch:
    launch = Launch([Strike(spec) for spec in specs])
    started = time.perf_counter()
    result = run_script(
        WORKER,
        3,
        script_args=[str(out), *WORKER_ARGS, *STRIKE_ARGS, "--strikes", ",".join(specs)],
        launch_args=LAUNCH_ARGS,
        timeout=600,
        env=ENV,
    )
    launch.seconds = time.perf_counter() - started
    launch.corrupt = result.stderr.count("CheckpointWarning") + result.stderr.count(
        "CheckpointError"
    )
    rows = steps_log(out)
    hits: dict[int, int] = {}
    for i, strike in enumerate(launch.strikes):
        mark = out / f"struck-{i}"
        if not mark.exists():
            continue
        kind, slot, gen, at = mark.read_text().split()
        strike.kind = {"kill": "kill", "stop": "freeze"}.get(kind, "save")
        strike.slot, g, t = int(slot), int(gen), float(at)
        hits[strike.slot] = hits.get(strike.slot, 0) + 1
        later = [r for r in rows if r[1] > g and r[3] > t]
        if later:
            strike.latency_s = min(r[3] for r in later) - t
            next_gen = min(r[1] for r in later)
            first = min(r[2] for r in later if r[1] == next_gen)
            done = max((r[2] for r in rows if r[1] == g), default=first - 1)
            strike.redone = max(0, done - (first - 1))
    for slot in range(3):
        pids = out / f"pids-{slot}"
        restarts = len(pids.read_text().split()) - 1 if pids.exists() else 0
        launch.survivor_restarts += max(0, restarts - hits.get(slot, 0))
    if result.returncode != 0 or not (out / "final.pt").exists():
        launch.note = result.stderr[-2000:]
        return launch
    launch.survived = True
    params = torch.load(out / "final.pt")
    launch.max_diff = max((params[k] - reference[k]).abs().max().item() for k in reference)
    launch.violations = len(read_audit(out / "audit").violations(NUM_SAMPLES, EPOCHS))
    stale = stale_final_checkpoint(out, params)
    if stale:
        launch.corrupt += 1
        launch.note = stale
    return launch


def stale_final_checkpoint(out: Path, params: dict[str, torch.Tensor]) -> str:
    """What is wrong with the newest checkpoint in ``out/ckpt`` against the final weights
    ``params`` (empty: it holds them exactly)."""
    from rankwise.train.checkpoint import CheckpointManager, read_checkpoint

    latest = CheckpointManager(out / "ckpt").latest()
    saved = read_checkpoint(latest)["model"] if latest is not None else {}
    if saved.keys() != params.keys() or any(not torch.equal(saved[k], params[k]) for k in params):
        return f"the final checkpoint {latest} does not hold the final weights"
    return ""


def reference_run(workdir: Path) -> dict[str, torch.Tensor]:
    out = workdir / "reference"
    out.mkdir(parents=True, exist_ok=True)
    result = run_script(
        WORKER, 3, script_args=[str(out), *WORKER_ARGS], launch_args=LAUNCH_ARGS, timeout=600
    )
    if result.returncode != 0:
        sys.exit(f"the uninterrupted continue run failed:\n{result.stderr[-3000:]}")
    return torch.load(out / "final.pt")


def continue_sweep(args: argparse.Namespace, workdir: Path) -> tuple[bool, str]:
    """Launch until ``args.k`` strikes are planned; print one line per launch and the table."""
    started = time.perf_counter()
    reference = torch.load(args.reference) if args.reference else reference_run(workdir)
    rng = random.Random(args.seed)
    plans = [pick_strikes(rng) for _ in range(-(-args.k // STRIKES))]
    launches: list[Launch] = []
    with ThreadPoolExecutor(args.jobs) as pool:
        runs = pool.map(
            lambda i: run_launch(workdir / f"launch-{i:04d}", plans[i], reference),
            range(len(plans)),
        )
        for i, launch in enumerate(runs):
            print(launch_line(i, launch), flush=True)
            launches.append(launch)
    line = report(launches, time.perf_counter() - started)
    ok = all(
        x.survived and x.violations == 0 and x.corrupt == 0 and x.survivor_restarts == 0
        for x in launches
    )
    return ok, line


def launch_line(i: int, x: Launch) -> str:
    struck = " ".join(f"{s.spec}->{_outcome(s)}" for s in x.strikes)
    return (
        f"launch {i:3d}  survived={x.survived!s:5s} diff={x.max_diff:.3g} "
        f"violations={x.violations} survivor-restarts={x.survivor_restarts} "
        f"corrupt={x.corrupt} {x.seconds:.0f}s  {struck} {x.note[-300:]!r}"
    )


def _outcome(s: Strike) -> str:
    if not s.kind:
        return "unreached"
    if s.latency_s != s.latency_s:  # NaN
        return f"{s.kind}(no step left)"  # the final save: training was over
    return f"{s.kind}({s.latency_s:.1f}s,+{s.redone})"


def _stats(values: list[float]) -> str:
    if not values:
        return "-"
    return f"median {statistics.median(values):.2f} s, max {max(values):.2f} s (n={len(values)})"


def report(launches: list[Launch], seconds: float) -> str:
    strikes = [s for x in launches for s in x.strikes]
    struck = [s for s in strikes if s.kind]
    survived = [s for x in launches for s in x.strikes if s.kind and x.survived]
    diff = max((x.max_diff for x in launches if x.survived), default=NAN)
    violations = sum(x.violations for x in launches)
    restarts = sum(x.survivor_restarts for x in launches)
    latency = {
        kind: [s.latency_s for s in struck if s.kind == kind and s.latency_s == s.latency_s]
        for kind in ("kill", "save", "freeze")
    }
    kills = latency["kill"] + latency["save"]
    redone = [s.redone for s in struck]
    print()
    print("| --on-failure continue | value | goal |")
    print("| --- | --- | --- |")
    print(f"| strikes planned / struck | {len(strikes)} / {len(struck)} | |")
    count = {k: sum(s.kind == k for s in struck) for k in ("kill", "freeze", "save")}
    print(
        f"| of which kills in a step / freezes / kills in a checkpoint write | "
        f"{count['kill']} / {count['freeze']} / {count['save']} | |"
    )
    print(f"| failures survived | {len(survived)}/{len(struck)} | all |")
    print(f"| launches survived | {sum(x.survived for x in launches)}/{len(launches)} | all |")
    print(f"| exactly-once violations | {violations} | 0 |")
    print(f"| max abs(weights - reference) | {diff:.3g} | < 1e-4 |")
    print(f"| survivors' restarts | {restarts} | 0 |")
    print(f"| corrupt or stale final checkpoints, checkpoint warnings | "
          f"{sum(x.corrupt for x in launches)} | 0 |")  # fmt: skip
    print(f"| kill -> next step (kills in a step) | {_stats(latency['kill'])} | median <= 2 s |")
    print(f"| kill -> next step (kills in a checkpoint write) | {_stats(latency['save'])} | |")
    print(f"| freeze -> next step (collective timeout {TIMEOUT_MS / 1000:.0f} s) | "
          f"{_stats(latency['freeze'])} | |")  # fmt: skip
    after = sum(s.latency_s != s.latency_s for s in struck)
    print(f"| strikes with no step left (in the final save) | {after} | |")
    print(f"| steps redone | max {max(redone, default=0)}, total {sum(redone)} | 0 |")
    print(f"| total | {seconds:.0f} s | |")
    median = statistics.median(kills) if kills else NAN
    return (
        f"continue: {len(survived)}/{len(struck)} strikes survived "
        f"({count['kill']} kills, {count['freeze']} freezes, {count['save']} in a save), "
        f"{violations} exactly-once violations, max diff {diff:.3g}, {restarts} survivors' "
        f"restarts, kill -> next step median {median:.2f} s, "
        f"max {max(kills, default=NAN):.2f} s, {seconds:.0f} s"
    )
