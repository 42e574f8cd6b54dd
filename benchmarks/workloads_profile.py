"""Where a trainer step differs from the hand-written loop's, on the workloads' models.

One process, a world of one, one torch thread (so every op runs on this thread); the loop and
the trainer of ``benchmarks/workloads.py`` train the same model on the same data. First
``--rounds`` rounds of loop / trainer / loop again (an A/A control for the machine's noise now),
in a rotating order, unprofiled: the main thread's CPU time per step as per-round ratios. Then
each under ``torch.profiler`` and ``sys.setprofile`` for its timed steps: the ops whose calls
per step differ between the two, with the self CPU time they take, and the function calls
(Python and C) per step. Load does not change the counts; the times are this thread's.

Page faults: glibc's malloc may hand the backward's multi-MB buffers back to the kernel after
each step and fault them in again (its mmap threshold moves at run time); compare with
``MALLOC_MMAP_THRESHOLD_=67108864 MALLOC_TRIM_THRESHOLD_=134217728`` set (workloads.py's
``--fixed-malloc``).

    PYTHONPATH=src python benchmarks/workloads_profile.py [--workload gpt|resnet] [--compiled]
"""

from __future__ import annotations

import argparse
import itertools
import resource
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

import torch
import workloads as wl
from torch.profiler import ProfilerActivity, profile


def cpu_ms(impl: str, w: wl.Workload, compiled: bool) -> tuple[float, float, float]:
    """One unprofiled run, medians per step after warm-up: this thread's CPU ms, its minor
    page faults and its system (kernel) CPU ms."""
    x, y = wl.make_data(w, w.steps * w.batch)
    run, marks = wl.Run(w, x, y, compiled, torch.device("cpu"), False), []

    def mark(*_: Any) -> None:
        use = resource.getrusage(resource.RUSAGE_THREAD)
        marks.append((time.thread_time(), use.ru_minflt, use.ru_stime))

    run.stamp = lambda opt: opt.register_step_post_hook(mark)  # type: ignore[method-assign]
    wl.RUNNERS[impl](run, wl.make_model(w))
    steps = list(itertools.pairwise(marks[w.warmup :]))
    return (
        1e3 * statistics.median(b[0] - a[0] for a, b in steps),
        statistics.median(b[1] - a[1] for a, b in steps),
        1e3 * statistics.median(b[2] - a[2] for a, b in steps),
    )


def ab_rounds(w: wl.Workload, compiled: bool, rounds: int) -> dict[str, list[Any]]:
    """Per round, in a rotating order: the loop, the trainer and the loop again (an A/A
    control: how far two identical runs differ on this machine now). Returns per round the
    speed ratio against the loop and each run's (CPU ms, page faults, system ms) per step."""
    order = ["loop", "trainer", "loop again"]
    out: dict[str, list[Any]] = {k: [] for k in order}
    for r in range(rounds):
        got = {k: cpu_ms(k.split()[0], w, compiled) for k in order[r % 3 :] + order[: r % 3]}
        for k in order:
            out[k].append((got["loop"][0] / got[k][0], *got[k]))
    return out


def profiled(impl: str, w: wl.Workload, compiled: bool) -> dict[str, list[float]]:
    """{op: [calls per step, self CPU ms per step]} over the steps after warm-up."""
    x, y = wl.make_data(w, w.steps * w.batch)
    # Function calls (Python and C, sys.setprofile) per step: exact, load cannot move them.
    run, calls, seen = wl.Run(w, x, y, compiled, torch.device("cpu"), False), [0], [0]

    def count(_frame: Any, event: str, _arg: Any) -> None:
        calls[0] += event in ("call", "c_call")

    def on_count(*_: Any) -> None:
        seen[0] += 1
        if seen[0] in (w.warmup, w.steps - 1):
            sys.setprofile(count if seen[0] == w.warmup else None)

    run.stamp = lambda opt: opt.register_step_post_hook(on_count)  # type: ignore[method-assign]
    try:
        wl.RUNNERS[impl](run, wl.make_model(w))
    finally:
        sys.setprofile(None)
    run = wl.Run(w, x, y, compiled, torch.device("cpu"), False)
    prof = profile(activities=[ProfilerActivity.CPU])
    steps = [0]

    def on_step(*_: Any) -> None:
        steps[0] += 1
        if steps[0] == w.warmup:
            prof.start()
        elif steps[0] == w.steps - 1:
            prof.stop()

    run.stamp = lambda opt: opt.register_step_post_hook(on_step)  # type: ignore[method-assign]
    wl.RUNNERS[impl](run, wl.make_model(w))
    timed = w.steps - 1 - w.warmup
    ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for event in prof.key_averages():
        ops[event.key][0] += event.count / timed
        ops[event.key][1] += event.self_cpu_time_total / 1e3 / timed
    ops["(function calls, Python and C)"] = [calls[0] / timed, 0.0]
    return ops


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=("gpt", "resnet"), default="gpt")
    parser.add_argument("--compiled", action="store_true")
    parser.add_argument("--full", action="store_true", help="the full shapes (default: --quick's)")
    parser.add_argument("--rounds", type=int, default=8, help="A/B/A rounds (default 8)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import rankwise.distributed as rd

    rd.init()
    w = wl.workload(args.workload, not args.full, "cpu")
    w = wl.Workload(**{**w.__dict__, "steps": max(w.steps, 12), "warmup": max(w.warmup, 3)})
    started = time.perf_counter()
    cpu_ms("loop", w, args.compiled)  # warm start (and the compile, when compiled)
    ratios = ab_rounds(w, args.compiled, args.rounds)
    print(
        f"{args.workload} ({'compiled' if args.compiled else 'eager'}), world of one, batch "
        f"{w.batch}, {args.rounds} rounds: main-thread CPU time per step, loop / this one "
        "(> 1: faster than the loop), median (min-max) of the per-round ratios; this thread's "
        "minor page faults and system CPU ms per step:"
    )
    print(f"  {'':<12} {'vs loop':>22} {'CPU ms':>7} {'faults':>7} {'sys ms':>7}  (medians)")
    for k, r in ratios.items():
        ratio, ms, faults, sys_ms = (statistics.median(v[i] for v in r) for i in range(4))
        spread = f"({min(v[0] for v in r):.3f}-{max(v[0] for v in r):.3f})"
        print(f"  {k:<12} {ratio:>6.3f}x {spread:>15} {ms:>7.2f} {faults:>7.0f} {sys_ms:>7.2f}")
    loop, trainer = profiled("loop", w, args.compiled), profiled("trainer", w, args.compiled)
    total = {k: sum(v[1] for v in o.values()) for k, o in (("loop", loop), ("trainer", trainer))}
    print(f"profiled self CPU ms/step: loop {total['loop']:.2f}, trainer {total['trainer']:.2f}")
    print(
        f"\nops whose calls per step differ (trainer - loop):\n{'op':<44} {'loop':>7} {'trainer':>8} {'ms loop':>8} {'ms trainer':>10}"
    )
    extra = 0.0
    for key in sorted(set(loop) | set(trainer), key=lambda k: -abs(trainer[k][1] - loop[k][1])):
        (lc, lt), (tc, tt) = loop[key], trainer[key]
        if abs(tc - lc) > 1e-6:
            extra += tt - lt
            print(f"{key[:44]:<44} {lc:>7.2f} {tc:>8.2f} {lt:>8.3f} {tt:>10.3f}")
    print(f"\nthose ops' self CPU ms/step, trainer - loop: {extra:+.3f}")
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
