"""Repeat launches many times and count how many end as they should (run on demand, not in CI).

Cases (gloo jobs of tests/scripts/launch_worker.py):

  restart      2 ranks; rank 1 fails on attempt 0 under --max-restarts 1; success = exit 0 and
               both ranks finish attempt 1 (the restarted attempt must re-rendezvous).
  exit         2 ranks; a finished DDP job that never calls finalize(); success = exit 0 (no
               SIGABRT at interpreter exit).
  early-exit   3 ranks; rank 0 (the store's host) exits the moment init returns; success =
               exit 0 and ranks 1 and 2 finish.

Launchers:

  rankwise          `rankwise launch` (c10d rendezvous, fresh store per attempt) + rankwise.init()
  torchrun-static   plain `torchrun --master-port P` (shared agent store) + rankwise.init()
  torchrun-baseline plain `torchrun --master-port P` + torch's own init_process_group /
                    destroy_process_group: what a user gets without rankwise

  python scripts/stress_launch.py --case restart --runs 50
  python scripts/stress_launch.py --case exit --runs 200
  python scripts/stress_launch.py --case restart --runs 20 --launcher torchrun-baseline
  python scripts/stress_launch.py --case early-exit --runs 100
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "scripts" / "launch_worker.py"
sys.path.insert(0, str(ROOT / "src"))

from rankwise.testing import child_env, free_port, run_isolated  # noqa: E402


class Case(NamedTuple):
    worker_args: list[str]
    nproc: int
    max_restarts: int
    ok_line: str  # printed by each rank that finishes; a run is ok when exactly 2 ranks print it


CASES = {
    "restart": Case(["--fail-attempts", "1"], 2, 1, "attempt 1: ok"),
    "exit": Case(["--no-finalize"], 2, 0, "attempt 0: ok"),
    "early-exit": Case(["--rank0-exits-after-init"], 3, 0, ": ok"),
}


def command(case: str, launcher: str) -> list[str]:
    spec = CASES[case]
    worker_args = [
        *spec.worker_args,
        *(["--init=torch"] if launcher == "torchrun-baseline" else []),
    ]
    launch = [f"--nproc-per-node={spec.nproc}", f"--max-restarts={spec.max_restarts}"]
    if launcher == "rankwise":
        head = [sys.executable, "-m", "rankwise.cli", "launch"]
    else:
        head = [sys.executable, "-m", "torch.distributed.run", f"--master-port={free_port()}"]
    return [*head, *launch, str(WORKER), *worker_args]


def classify(proc: subprocess.CompletedProcess[str] | None, case: str) -> str:
    if proc is None:
        return "hang (timeout)"
    out = proc.stdout + proc.stderr
    if proc.returncode == 0:
        finished = out.count(CASES[case].ok_line)
        return "ok" if finished == 2 else "exit 0 but a rank did not finish"
    if "terminate called" in out or "SIGABRT" in out or "Signals.SIGABRT" in out:
        return "SIGABRT at exit"
    if "connectFullMesh" in out or "Connection refused" in out:
        return "gloo connectFullMesh failed"
    if "Connection reset by peer" in out:
        return "connection reset by peer"
    return f"exit {proc.returncode}"


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--case", choices=sorted(CASES), required=True)
    p.add_argument("--runs", type=int, default=50)
    p.add_argument(
        "--launcher",
        choices=["rankwise", "torchrun-static", "torchrun-baseline"],
        default="rankwise",
    )
    p.add_argument("--timeout", type=float, default=90.0)
    p.add_argument("--json", type=Path, help="write the counts here")
    p.add_argument("--keep-logs", type=Path, help="folder for the output of failed runs")
    args = p.parse_args()

    counts: collections.Counter[str] = collections.Counter()
    started = time.perf_counter()
    for i in range(args.runs):
        try:
            # In a session of its own, so a hang is killed with all of its ranks.
            proc: subprocess.CompletedProcess[str] | None = run_isolated(
                command(args.case, args.launcher),
                env=child_env({"PYTHONUNBUFFERED": "1"}),
                timeout=args.timeout,
            )
        except subprocess.TimeoutExpired:
            proc = None
        verdict = classify(proc, args.case)
        counts[verdict] += 1
        if verdict != "ok" and args.keep_logs and proc is not None:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            (args.keep_logs / f"{args.case}-{args.launcher}-{i}.log").write_text(
                proc.stdout + proc.stderr
            )
        print(f"[{i + 1}/{args.runs}] {verdict}  ({dict(counts)})", flush=True)
    elapsed = time.perf_counter() - started
    result = {
        "case": args.case,
        "launcher": args.launcher,
        "runs": args.runs,
        "counts": dict(counts),
        "seconds": round(elapsed, 1),
    }
    print(json.dumps(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if counts["ok"] == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
