"""``rankwise launch``: its options, the checks made before anything starts, and the choice
between the two ways a job is run.

- ``--on-failure restart`` (the default): torchrun runs the job (:mod:`.torchrun`), with
  rankwise's rendezvous defaults; a lost rank restarts every rank.
- ``--on-failure continue``: torchrun's agent cannot keep survivors running, so rankwise does
  not use it; it supervises its own processes (:mod:`.supervisor`) and restarts only the lost.

Both take torchrun's options, so one command line moves from one mode to the other.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from torch.distributed.run import (
    determine_local_world_size,
    get_args_parser,
    parse_min_max_nnodes,
)

from rankwise.distributed.config import check_variables
from rankwise.distributed.environment import threads_per_process
from rankwise.launch.supervisor import check_continue_args, run_continue
from rankwise.launch.torchrun import run_torchrun

__all__ = ["add_launch_parser", "check_args", "launch", "run_launch"]

DESCRIPTION = """\
Run a training script on N processes per node. With --on-failure restart (the default),
torchrun runs them with rankwise's defaults: c10d rendezvous with a fresh store per restart
attempt (so --max-restarts works reliably) and, on a single node without --master-port, a free
port chosen by the OS; a lost rank restarts every rank. With --on-failure continue, rankwise
supervises the processes itself instead of torchrun: the survivors keep training and only the
lost rank restarts and rejoins. Either way torchrun's options are accepted, and each process
gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, which
rankwise.distributed.init() reads.

examples:
  rankwise launch --nproc-per-node 2 train.py --epochs 5
  rankwise launch --nproc-per-node 4 --max-restarts 3 train.py
  # a lost rank: the others keep training, only it restarts and rejoins
  rankwise launch --nproc-per-node 3 --max-restarts 2 --on-failure continue train.py
  # two machines, run on each (node 0 at 10.0.0.1):
  rankwise launch --nnodes 2 --nproc-per-node 4 --master-addr 10.0.0.1 --master-port 29500 train.py
  # the same with continue: node R of 2 (R = 0 on 10.0.0.1, which hosts the store)
  rankwise launch --nnodes 2 --node-rank R --nproc-per-node 4 --master-addr 10.0.0.1 \\
      --master-port 29500 --on-failure continue train.py
  # ... with the store on a third machine (10.0.0.5), so losing node 0 stops nobody else:
  rankwise store --host 10.0.0.5 --port 29600 --nnodes 2     # on 10.0.0.5
  rankwise launch --nnodes 2 --node-rank R --nproc-per-node 4 \\
      --store-endpoint 10.0.0.5:29600 --on-failure continue train.py
"""


def add_launch_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``launch`` with every torchrun option, under rankwise's own help text."""
    parser = subparsers.add_parser(
        "launch",
        parents=[get_args_parser()],
        conflict_handler="resolve",  # our -h/--help replaces torchrun's
        help="run a script on N processes per node (through torchrun, or under --on-failure "
        "continue rankwise's own supervisor)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # None = "not given", so an explicit --rdzv-backend static or --node-rank 0 can be told
    # apart from torchrun's defaults (filled in by apply_defaults).
    parser.set_defaults(rdzv_backend=None, node_rank=None)
    parser.add_argument(
        "--on-failure",
        choices=("restart", "continue"),
        default="restart",
        help="restart: a lost rank restarts every rank (torchrun's --max-restarts; the "
        "default). continue: the survivors keep training and only the lost rank restarts "
        "(rankwise supervises the processes instead of torchrun). Across nodes, continue needs a fixed --nnodes N, --node-rank "
        "on each node and --master-port: node 0's launcher hosts the membership store at "
        "--master-addr:--master-port (or see --store-endpoint).",
    )
    parser.add_argument(
        "--min-nproc",
        type=int,
        default=None,  # None = not given: refused under restart only when given
        help="--on-failure continue: stop once fewer ranks than this are left, counted over "
        "all nodes (default 1)",
    )
    parser.add_argument(
        "--store-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="--on-failure continue: connect to the membership store a `rankwise store` "
        "serves at HOST:PORT instead of node 0's launcher hosting it, so that losing any "
        "node (node 0 included) leaves the others their store. Give it to every node.",
    )
    parser.add_argument(
        "--store-wait-s",
        type=float,
        default=None,  # None = not given: refused under restart only when given
        metavar="SECONDS",
        help="--on-failure continue: how long a launcher that does not host the membership "
        "store (a node other than 0, or any with --store-endpoint) waits to reach it before it "
        "gives up, naming the address (default 120)",
    )
    parser.add_argument(
        "--job-token-file",
        default=None,
        metavar="PATH",
        help="--on-failure continue: the file holding the job's secret, which a restarted "
        "rank proves (an HMAC) before it is let into the running job; node 0's launcher "
        "creates it (mode 0600) if it is missing. Needed with --nnodes above 1 (the same file "
        "on every node); on one node each launch makes its own secret.",
    )
    return parser


# The words torchrun's --nproc-per-node takes besides a number (one process per CPU / device).
_NPROC_WORDS = ("auto", "cpu", "gpu", "xpu")


def check_args(args: argparse.Namespace) -> None:
    """Refuse options torchrun would only reject after starting (with a traceback, a bare
    ``AssertionError``, or N ranks failing to open the script); ``ValueError`` names the fix.

    >>> check_args(argparse.Namespace(nproc_per_node="two", nnodes="1"))
    Traceback (most recent call last):
    ...
    ValueError: --nproc-per-node ('two') must be a whole number >= 1 or one of ...
    """
    nproc = str(args.nproc_per_node).strip()
    if nproc not in _NPROC_WORDS and not (nproc.isdigit() and int(nproc) >= 1):
        raise ValueError(
            f"--nproc-per-node ({nproc!r}) must be a whole number >= 1 or one of "
            f"{', '.join(map(repr, _NPROC_WORDS))}; e.g. --nproc-per-node 2."
        )
    try:
        low, high = parse_min_max_nnodes(str(args.nnodes))
    except (ValueError, RuntimeError):
        low = high = 0
    if not 1 <= low <= high:
        raise ValueError(
            f"--nnodes ({args.nnodes!r}) must be N or MIN:MAX with 1 <= MIN <= MAX; e.g. "
            "--nnodes 2, or --nnodes 1:4 for a job that runs on 1 to 4 machines."
        )
    restarts = getattr(args, "max_restarts", 0)
    if restarts < 0:
        raise ValueError(
            f"--max-restarts ({restarts}) must be 0 or more: the times a lost rank (under "
            "--on-failure continue) or the whole world (under restart) is started again; e.g. "
            "--max-restarts 2, or 0 for none."
        )
    port = getattr(args, "master_port", None)
    if port is not None and not (0 <= port <= 65535 and (port > 0 or high == 1)):
        raise ValueError(
            f"--master-port ({port}) must be a TCP port, 1 to 65535 (0 on one node: a free "
            "port the OS picks, the default there); e.g. --master-port 29500."
        )
    if getattr(args, "on_failure", "restart") == "restart":
        node = getattr(args, "node_rank", None)  # continue mode's check says more
        if node is not None and not 0 <= node < high:
            raise ValueError(
                f"--node-rank ({node}) must be between 0 and {high - 1}: the nodes of "
                f"--nnodes {args.nnodes} are numbered from 0; give each node's launcher its own."
            )
        _refuse_continue_only(args)
    script = getattr(args, "training_script", None)
    direct = not (getattr(args, "module", False) or getattr(args, "no_python", False))
    if script is not None and direct and not os.path.isfile(script):
        raise ValueError(
            f"training script {script!r} does not exist; pass the path of a Python file "
            "(relative to the current directory), or -m for a module."
        )


def _refuse_continue_only(args: argparse.Namespace) -> None:
    """``--min-nproc`` and ``--store-endpoint`` mean nothing to torchrun: refuse them given
    under ``--on-failure restart`` rather than ignore them."""
    for flag, value in (
        ("--min-nproc", getattr(args, "min_nproc", None)),
        ("--store-endpoint", getattr(args, "store_endpoint", None)),
        ("--job-token-file", getattr(args, "job_token_file", None)),
        ("--store-wait-s", getattr(args, "store_wait_s", None)),
    ):
        if value is not None:
            raise ValueError(
                f"{flag} ({value!r}) is an option of --on-failure continue only: under "
                "--on-failure restart (the default) torchrun restarts the whole world, which "
                f"never shrinks and keeps no store of its own. Add --on-failure continue, or "
                f"drop {flag}."
            )


def run_launch(args: argparse.Namespace) -> int:
    """Run the job as ``--on-failure`` says; return its exit code (0 when training finished)."""
    try:
        check_args(args)
        if getattr(args, "on_failure", "restart") == "continue":
            check_continue_args(args)
        # Every variable the ranks will read, once, before any of them starts (each rank
        # would otherwise refuse it in turn, and again after every restart).
        check_variables(launching=getattr(args, "on_failure", "restart"))
    except ValueError as exc:  # argparse's way: a usage error exits 2, no traceback
        print(f"rankwise launch: error: {exc}", file=sys.stderr)
        return 2
    ours = set_threads(args)
    try:
        if getattr(args, "on_failure", "restart") == "continue":
            return run_continue(args)
        return run_torchrun(args)
    finally:
        if ours:  # a programmatic launch() leaves its caller's environment as it was
            os.environ.pop("OMP_NUM_THREADS", None)


def set_threads(args: argparse.Namespace) -> bool:
    """Give each process this node's cores shared out as ``OMP_NUM_THREADS``, where the user
    did not set it (torch's agent would set 1 and print a banner), and say it once; whether
    it set the variable."""
    try:
        nproc = determine_local_world_size(str(args.nproc_per_node))
    except ValueError:  # e.g. "gpu" on a machine without one: torchrun says so
        return False
    threads, given = threads_per_process(nproc)
    why = "yours" if given else "this machine's cores shared out; set it to choose"
    os.environ["OMP_NUM_THREADS"] = threads  # the processes inherit it
    print(
        f"rankwise launch: {nproc} process(es) on this node, OMP_NUM_THREADS={threads} each "
        f"({why})",
        file=sys.stderr,
        flush=True,
    )
    return not given


def launch(argv: Sequence[str]) -> int:
    """Programmatic ``rankwise launch ARGV...``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="rankwise")
    add_launch_parser(parser.add_subparsers(dest="command"))
    return run_launch(parser.parse_args(["launch", *argv]))
