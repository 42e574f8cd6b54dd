"""The ``rankwise`` command: ``launch``, ``env``, ``store``, ``audit`` and ``demo``.

``rankwise launch`` runs a script on N processes (through torchrun, or under ``--on-failure
continue`` rankwise's own supervisor); ``rankwise env`` says what this machine and environment
would give a launch; ``rankwise store`` hosts the membership store of an ``--on-failure
continue`` job apart from its nodes; ``rankwise audit`` summarises, checks and draws a run's
:class:`~rankwise.train.AuditLog` folder; ``rankwise demo`` trains a small model on 2 CPU processes
to show that everything works. The commands' logic lives in :mod:`rankwise.launch` (launch,
store), :mod:`rankwise.train.audit.timeline` (audit) and :mod:`rankwise.demo`.
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rankwise.launch import add_launch_parser, add_store_parser, launch, run_launch, serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rankwise",
        description=(
            "rankwise: data-parallel distributed training on PyTorch. "
            "Run `rankwise COMMAND --help` for each command's options."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "commands:\n"
            "  launch  run a script on N processes per node (torchrun, or rankwise's supervisor)\n"
            "  env     show rank variables, backends, CUDA devices and whether the port is free\n"
            "  store   host one --on-failure continue job's membership store apart from its nodes\n"
            "  audit   summarise an AuditLog folder, check exactly-once, draw the run's timeline\n"
            "  demo    train an MLP on the digits data set on 2 CPU processes\n\n"
            "examples:\n"
            "  rankwise demo\n"
            "  rankwise launch --nproc-per-node 2 train.py --epochs 5\n"
            "  rankwise audit runs/audit --samples 60000 --epochs 3 --plot timeline.png\n"
            "  RANK=0 WORLD_SIZE=2 rankwise env"
        ),
    )
    from rankwise import __version__

    parser.add_argument("--version", action="version", version=f"rankwise {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_launch_parser(sub)

    env = sub.add_parser(
        "env",
        help="show what a launch would see: rank variables, backends, CUDA devices, port",
        description=(
            "Print the distributed environment as rankwise reads it: the rank variables, "
            "whether they form a valid configuration, the available backends, the CUDA "
            "devices, and whether MASTER_PORT is free on this machine."
        ),
    )
    env.add_argument("--json", action="store_true", help="print one JSON object instead")

    add_store_parser(sub)
    add_audit_parser(sub)

    demo = sub.add_parser(
        "demo",
        help="train an MLP on scikit-learn's digits on 2 CPU processes",
        description=(
            "A real distributed training run: rankwise launch starts NPROC processes that "
            "train a small MLP on scikit-learn's bundled digits data set with "
            "rankwise.train.DistributedTrainer (DDP over gloo), each rank on its own shard. "
            "Rank 0 shows a progress bar and per-epoch metrics (reduced over all ranks), the "
            "final test accuracy, and leaves history.json, history.png, a CSV log and "
            "checkpoints in a fresh folder in --out each time it runs (run-YYYYMMDD-HHMMSS)."
        ),
        epilog="example: rankwise demo --out /tmp/demo epochs=5 precision=bf16",
    )
    demo.add_argument("--nproc", type=int, default=2, help="processes to launch (default: 2)")
    demo.add_argument(
        "--out",
        default="./rankwise-demo",
        help="folder for the runs: each run writes a fresh run-YYYYMMDD-HHMMSS folder in it",
    )
    demo.add_argument("--config", default=None, help="DistributedTrainingConfig YAML file")
    demo.add_argument("--epochs", type=int, default=None, help="epochs (default: 15)")
    demo.add_argument("--batch-size", type=int, default=None, help="per-rank batch (default 32)")
    demo.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default: 3e-3)")
    demo.add_argument("--seed", type=int, default=None, help="seed for split, init, order")
    demo.add_argument(
        "overrides", nargs="*", metavar="FIELD=VALUE", help="config fields, e.g. epochs=5"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "launch":
        return run_launch(args)
    if args.command == "env":
        return print_env(as_json=args.json)
    if args.command == "demo":
        return run_demo(args)
    if args.command == "store":
        return serve(args)
    if args.command == "audit":
        return run_audit(args)
    parser.print_help()
    return 0


def add_audit_parser(sub: Any) -> None:
    audit = sub.add_parser(
        "audit",
        help="summarise an AuditLog folder, check exactly-once, draw the run's timeline",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Read the folder a run's rankwise.train.AuditLog wrote (the trainer's\n"
            "callbacks=[AuditLog(DIR)]: a file audit-*-rank*.jsonl per rank and attempt)\n"
            "and print what happened: the attempts, the slots (ranks) and processes, the\n"
            "optimizer steps, the processes lost, the regroups, rejoins and restarts, the\n"
            "checkpoints saved, and checks that every sample was trained exactly once per\n"
            "epoch across all of that (exit 1 naming the ids missing or repeated): the\n"
            "records say the data set's size, its validation hold-out, the sampler's\n"
            "padding and the epochs; --samples/--epochs override them (records written\n"
            "before they said so are checked only with --samples). With --plot it draws the run through its faults: a row per slot\n"
            "(rank), wall time across, a tick per optimizer step, the losses, regroups,\n"
            'rejoins and checkpoints marked (needs matplotlib: pip install "rankwise[demo]").'
        ),
        epilog=(
            "examples:\n"
            "  rankwise audit out/audit\n"
            "  rankwise audit out/audit --samples 192 --epochs 2\n"
            "  rankwise audit out/audit --samples 192 --epochs 2 --plot timeline.png\n\n"
            "exit status: 0, 1 when the check finds a violation, 2 when DIR holds no records."
        ),
    )
    audit.add_argument("directory", metavar="DIR", help="the folder given to AuditLog(DIR)")
    audit.add_argument("--plot", metavar="PNG", default=None, help="draw the timeline there")
    audit.add_argument(
        "--samples", type=int, default=None, metavar="N",
        help="the data set's size: check each of ids 0..N-1 (but the held-out ones) was "
        "trained once per epoch (default: the size the records say)",
    )  # fmt: skip
    audit.add_argument(
        "--epochs", type=int, default=None, metavar="E",
        help="require E epochs (default: the epochs the run was configured for, else the "
        "epochs the records hold)",
    )  # fmt: skip


def run_audit(args: argparse.Namespace) -> int:
    from rankwise.train.audit import read_audit
    from rankwise.train.audit.timeline import plot, read_timeline, summary

    line = read_timeline(args.directory)
    if not line.lanes:
        print(
            f"rankwise audit: no audit records (audit-*-rank*.jsonl) in {args.directory}: "
            "give the folder the run passed to AuditLog(...)",
            file=sys.stderr,
        )
        return 2
    report = read_audit(args.directory)
    if args.samples is None and report.data_size is None and args.epochs is not None:
        print(
            f"rankwise audit: --epochs needs --samples N: the records in {args.directory} do "
            "not say the data set's size (written by an older rankwise)",
            file=sys.stderr,
        )
        return 2
    lines, problems = summary(line, report, args.samples, args.epochs)
    print(f"rankwise audit {args.directory}")
    print("\n".join(lines))
    if args.plot is not None:
        verdict = ""
        if args.samples is not None or report.data_size is not None:
            verdict = " · exactly once: " + ("VIOLATED" if problems else "ok")
        kinds = [t.kind for t in line.transitions]
        title = (
            f"rankwise audit {args.directory}: {len(line.attempts)} attempt(s), "
            f"{len(line.lost)} lost, {kinds.count('regroup')} regroup(s), "
            f"{kinds.count('rejoin')} rejoin(s){verdict}"
        )
        try:
            print(f"timeline: {plot(line, args.plot, title=title)}")
        except ImportError as exc:
            print(f"rankwise audit: {exc}", file=sys.stderr)
            return 2
    return 1 if problems else 0


def run_demo(args: argparse.Namespace) -> int:
    if args.nproc < 1:
        print(f"rankwise demo: --nproc ({args.nproc}) must be >= 1", file=sys.stderr)
        return 2
    try:
        import sklearn  # noqa: F401
    except ImportError:
        print(
            "rankwise demo needs scikit-learn for its bundled digits data set: "
            "pip install -c constraints.txt 'rankwise[demo]'",
            file=sys.stderr,
        )
        return 2
    overrides = list(args.overrides)
    for field, value in (
        ("epochs", args.epochs),
        ("batch_size", args.batch_size),
        ("seed", args.seed),
    ):
        if value is not None:
            overrides.append(f"{field}={value}")
    error = _check_demo_config(args.config, overrides)
    if error is not None:
        print(f"rankwise demo: {error}", file=sys.stderr)
        return 2
    run = fresh_run_folder(Path(args.out))  # never an earlier run's: its CSV would go on
    script_args = [f"--out={run}", f"--lr={args.lr}", *overrides]
    if args.config is not None:
        script_args.insert(0, f"--config={args.config}")
    return launch([f"--nproc-per-node={args.nproc}", "-m", "rankwise.demo", *script_args])


def fresh_run_folder(out: Path, now: float | None = None) -> Path:
    """A new, empty ``out/run-YYYYMMDD-HHMMSS`` (local time; ``-2``, ``-3``... when a run of
    the same second has it), created here, so that a demo run never appends to an earlier one's
    ``metrics.csv`` nor resumes its checkpoints. ``out`` gets a ``.gitignore`` of ``*``: the
    runs of a demo started in a clone are not left untracked in it."""
    out.mkdir(parents=True, exist_ok=True)
    ignore = out / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# rankwise demo runs: not for version control\n*\n")
    stamp = time.strftime("run-%Y%m%d-%H%M%S", time.localtime(now))
    n = 1
    while True:
        folder = out / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            folder.mkdir()  # atomic: two demos started at once get two folders
        except FileExistsError:
            n += 1
            continue
        return folder


def _check_demo_config(config: str | None, overrides: list[str]) -> str | None:
    """The error a bad --config / override would raise in every rank, before launching."""
    from rankwise.train.config import DistributedTrainingConfig

    try:
        if config is not None:
            DistributedTrainingConfig.from_yaml(config, overrides=overrides)
        else:
            DistributedTrainingConfig().with_overrides(overrides)
    except (ValueError, OSError) as exc:
        return str(exc)
    return None


def environment_report() -> dict[str, Any]:
    """What ``rankwise env`` prints, as a dict."""
    import torch
    import torch.distributed as dist

    from rankwise import __version__
    from rankwise.distributed import DistributedConfig, DistributedConfigError, select_backend
    from rankwise.distributed.config import environment_variables
    from rankwise.distributed.environment import detect
    from rankwise.distributed.rendezvous import port_is_free

    report: dict[str, Any] = {
        "rankwise": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "variables": environment_variables(),
    }
    cuda = torch.cuda.is_available()
    devices = torch.cuda.device_count() if cuda else 0
    available = {
        "gloo": dist.is_available() and dist.is_gloo_available(),
        "nccl": dist.is_available() and dist.is_nccl_available(),
        "mpi": dist.is_available() and dist.is_mpi_available(),
    }
    try:
        found = detect()
        report["environment"] = {
            "kind": found.kind,
            "launched": found.launched,
            "decided_by": {v: report["variables"].get(v) for v in found.decided_by},
            "notes": list(found.notes),
        }
        cfg = DistributedConfig.from_environment()
        # The same check init() makes, so "valid" here means init() would accept it.
        backend = select_backend(
            cfg.backend_name,
            cfg.resolved_local_rank,
            cuda_devices=devices,
            nccl_available=available["nccl"],
            gloo_available=available["gloo"],
        )
        report["config"] = {
            "valid": True,
            "rank": cfg.rank,
            "world_size": cfg.world_size,
            "local_rank": cfg.resolved_local_rank,
            "master": f"{cfg.master_addr}:{cfg.master_port}",
            "backend": backend,
            "process_group": cfg.world_size > 1 or cfg.launched,
        }
        port: int | None = cfg.master_port
    except DistributedConfigError as exc:
        report.setdefault("environment", {"kind": "unknown", "launched": None})
        report["config"] = {"valid": False, "error": str(exc)}
        port = None
    report["backends"] = available
    report["auto_backend"] = select_backend(
        "auto", 0, cuda_devices=devices, nccl_available=available["nccl"]
    )
    report["cuda"] = {
        "available": cuda,
        "devices": [torch.cuda.get_device_name(i) for i in range(devices)],
    }
    report["master_port_free"] = None if port is None else port_is_free(port)
    return report


# Shown even when unset; a launcher's other variables (SLURM_*, OMPI_*, ...) only when set.
_ALWAYS_SHOWN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _environment_lines(env: dict[str, Any]) -> list[str]:
    names = {
        "torchelastic": "torchrun / torchelastic",
        "slurm": "SLURM (srun)",
        "openmpi": "Open MPI",
        "mpich": "MPICH / Intel MPI",
        "plain": "plain RANK / WORLD_SIZE",
        "none": "none (a bare `python script.py`: a world of one, no process group)",
    }
    kind = env["kind"]
    if kind == "unknown":
        return ["detected: (the variables below are invalid)"]
    lines = [f"detected: {names[kind]}"]
    if env["decided_by"]:
        lines.append("  because: " + ", ".join(f"{k}={v}" for k, v in env["decided_by"].items()))
    lines += [f"  {note}" for note in env["notes"]]
    return lines


def print_env(as_json: bool = False) -> int:
    report = environment_report()
    if as_json:
        print(json.dumps(report, indent=2))
        return 0 if report["config"]["valid"] else 1
    lines = [
        f"rankwise {report['rankwise']}  torch {report['torch']}  "
        f"python {report['python']}  host {report['host']}",
        "",
        "environment:",
    ]
    lines += [
        f"  {k:<34} {v if v is not None else '(unset)'}"
        for k, v in report["variables"].items()
        if v is not None or k in _ALWAYS_SHOWN
    ]
    lines += ["", *_environment_lines(report["environment"])]
    cfg = report["config"]
    if cfg["valid"]:
        lines.append(
            f"configuration: rank {cfg['rank']} of {cfg['world_size']} (local rank "
            f"{cfg['local_rank']}), master {cfg['master']}, backend {cfg['backend']}, "
            + ("a torch process group" if cfg["process_group"] else "no process group")
        )
    else:
        lines.append(f"configuration: INVALID: {cfg['error']}")
    b = report["backends"]
    lines.append(
        "backends: "
        + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in b.items())
        + f"  (auto picks {report['auto_backend']})"
    )
    devices = report["cuda"]["devices"]
    lines.append(f"CUDA devices: {len(devices)}" + (": " + ", ".join(devices) if devices else ""))
    free = report["master_port_free"]
    if free is not None:
        port = cfg["master"].rsplit(":", 1)[1]
        lines.append(
            f"master port {port}: {'free' if free else 'IN USE on this machine'}"
            + ("" if free else " (fine if a launcher on this machine holds it; else pick another)")
        )
    print("\n".join(lines))
    return 0 if cfg["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
