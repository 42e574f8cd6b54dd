"""Run code on N real gloo ranks, for tests and examples.

:func:`run_distributed` runs a picklable function on ``world_size`` processes joined in a real
process group (free port, gloo, a timeout on the whole run) and returns each rank's result in
rank order. A rank that raises fails the call with that rank's traceback; ranks that never
finish fail it with their numbers. :func:`run_script` does the same for a script through
``rankwise launch``, and :func:`run_by_hand` starts a command once per rank with the rank
variables set, as the guides' manual launches do. :func:`hygiene` restores the environment and
destroys any process group a test left behind. :mod:`rankwise.testing.faults` breaks a training
run on purpose and checks what it trained (:func:`kill_at_checkpoint`,
:func:`assert_exactly_once`), :mod:`rankwise.testing.tamper` tampers with a checkpoint as an
attacker would (:func:`tamper_checkpoint`); :class:`TorchCalls` counts a code's calls into torch.

Processes come from a ``forkserver`` that has imported torch once, so each rank starts in
milliseconds without inheriting the test process's threads (``fork`` after OpenMP has run is
unsafe).

>>> def total(x):
...     import torch, rankwise.distributed as rd
...     return rd.all_reduce(torch.tensor([x])).item()
>>> run_distributed(total, 2, args=(1.0,))  # doctest: +SKIP
[2.0, 2.0]
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rankwise.testing.counting import TorchCalls
from rankwise.testing.faults import assert_exactly_once, kill_at_checkpoint
from rankwise.testing.tamper import TAMPERS, tamper_checkpoint

__all__ = [
    "TAMPERS",
    "RankFailedError",
    "TorchCalls",
    "assert_exactly_once",
    "child_env",
    "free_port",
    "hygiene",
    "kill_at_checkpoint",
    "process_alive",
    "rank_env",
    "run_by_hand",
    "run_distributed",
    "run_isolated",
    "run_script",
    "src_path",
    "tamper_checkpoint",
]

_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class RankFailedError(RuntimeError):
    """A rank raised; the message carries its traceback."""


def free_port() -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (Linux's ``/proc``): a zombie nobody reaped yet, as
    the orphans of a killed launcher may stay, does not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def src_path() -> str:
    """The folder that holds the imported ``rankwise`` package (for children's PYTHONPATH)."""
    import rankwise

    return str(Path(rankwise.__file__).resolve().parent.parent)


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The current environment minus rank variables, with rankwise importable."""
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARS}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src_path(), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def rank_env(
    rank: int, world_size: int, port: int, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """:func:`child_env` plus what a launcher gives rank ``rank`` of ``world_size`` on this host.

    >>> {k: rank_env(1, 2, 29555)[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    {'RANK': '1', 'WORLD_SIZE': '2', 'LOCAL_RANK': '1', 'MASTER_PORT': '29555'}
    """
    return child_env(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            **(extra or {}),
        }
    )


def _context(start_method: str) -> Any:
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        # torch._dynamo: DDP imports it on construction, seconds per rank if not preloaded.
        ctx.set_forkserver_preload(
            ["torch", "torch.distributed", "torch._dynamo", "rankwise.distributed"]
        )
    return ctx


def _rank_main(
    fn: Callable[..., Any],
    env: dict[str, str],  # carries RANK, WORLD_SIZE, ... for rankwise.distributed.init()
    init_group: bool,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    conn: mpc.Connection,
    start: Any,  # a multiprocessing Barrier of every rank
    timeout: float,
) -> None:
    # The forkserver's environment is a copy from its start; take the caller's as it is now.
    os.environ.clear()
    os.environ.update(env)
    import torch

    import rankwise.distributed as rd

    # What the forkserver preloaded (torch, dynamo: millions of objects) never becomes garbage:
    # out of the collector's sight, finalize()'s gc.collect() takes ms instead of ~1.5 s (it
    # would walk, and copy on write, the whole inherited heap).
    gc.freeze()
    torch.set_num_threads(1)
    try:
        # Every rank's clock starts together: a rank whose process a loaded machine started
        # seconds late would otherwise use up its peers' rendezvous timeout (a test's short
        # DISTRIBUTED_TIMEOUT_MS timed out before rank 1 had even begun).
        start.wait(timeout)
        if init_group:
            rd.init()
        result = fn(*args, **kwargs)
        # Plain pickle, not the connection's: torch registers multiprocessing reductions that
        # send a tensor as a shared-memory handle, which the parent can open only while this
        # process is alive (a rank that exits first left the parent a FileNotFoundError).
        conn.send_bytes(pickle.dumps(("ok", result)))
    except BaseException:
        conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
    finally:
        rd.finalize()
        conn.close()


def run_distributed(
    fn: Callable[..., Any],
    world_size: int = 2,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    timeout: float = 60.0,
    backend: str = "gloo",
    env: Mapping[str, str] | None = None,
    init_group: bool = True,
    start_method: str = "forkserver",
    timeout_ms: int = 20000,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return the results in rank order.

    Each rank gets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT set (a fresh free
    port), plus ``env``. With ``init_group`` (the default) the group is joined with
    :func:`rankwise.distributed.init` before ``fn`` runs, by every rank at once (each waits
    for the others' processes to start first). ``fn`` must be picklable (defined at
    module level). Raises :class:`RankFailedError` if a rank raises and ``TimeoutError`` if the
    ranks do not all finish within ``timeout`` seconds; no process outlives the call.
    """
    if world_size < 1:
        raise ValueError(f"world_size ({world_size}) must be >= 1.")
    ctx = _context(start_method)
    port = free_port()
    procs: list[Any] = []
    conns: dict[mpc.Connection, int] = {}
    start = ctx.Barrier(world_size)
    for rank in range(world_size):
        env_r = rank_env(
            rank,
            world_size,
            port,
            {
                "DISTRIBUTED_BACKEND": backend,
                "DISTRIBUTED_TIMEOUT_MS": str(timeout_ms),
                "DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": str(int(timeout * 1000)),
                **(env or {}),
            },
        )
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_rank_main,
            args=(fn, env_r, init_group, tuple(args), dict(kwargs or {}), child, start, timeout),
            name=f"rankwise-rank{rank}",
            daemon=False,  # a rank may start DataLoader workers; _reap() ends it anyway
        )
        proc.start()
        child.close()
        procs.append(proc)
        conns[parent] = rank
    ok = False
    try:
        results = _collect(procs, conns, world_size, timeout)
        ok = True
        return results
    finally:
        _reap(procs, graceful=ok)


def _collect(
    procs: list[Any], conns: dict[mpc.Connection, int], world_size: int, timeout: float
) -> list[Any]:
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    grace_deadline: float | None = None
    pending = dict(conns)
    while pending:
        now = time.monotonic()
        limit = deadline if grace_deadline is None else min(deadline, grace_deadline)
        if now >= limit:
            break
        for conn in mpc.wait(list(pending), timeout=limit - now):
            assert isinstance(conn, mpc.Connection)
            rank = pending.pop(conn)
            try:
                status, payload = pickle.loads(conn.recv_bytes())
            except EOFError:
                code = procs[rank].exitcode
                status, payload = "error", f"rank {rank} exited (code {code}) without a result"
            if status == "ok":
                results[rank] = payload
            else:
                failures[rank] = payload
                # Peers of a failed rank are usually blocked in a collective: give them a moment
                # to fail on their own (a clearer message), then stop waiting.
                grace_deadline = grace_deadline or time.monotonic() + 3.0
    if failures:
        # Report the rank that failed first: its peers usually fail as a consequence
        # ("Connection closed by peer"), and their rank numbers may well be lower.
        first = next(iter(failures))
        others = sorted(set(failures) - {first})
        raise RankFailedError(
            f"rank {first} of {world_size} failed"
            + (f" (ranks {others} failed too)" if others else "")
            + f":\n{failures[first]}"
        )
    if pending:
        waiting = sorted(pending.values())
        raise TimeoutError(
            f"ranks {waiting} of {world_size} did not finish within {timeout:g} s "
            "(a hang: a collective some rank never reached?)"
        )
    return [results[r] for r in range(world_size)]


def _reap(procs: list[Any], graceful: bool) -> None:
    if graceful:  # every rank reported: give them time to exit on their own
        for proc in procs:
            proc.join(timeout=5)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


def run_script(
    script: str | Path,
    nproc: int = 2,
    *,
    script_args: Sequence[str] = (),
    launch_args: Sequence[str] = (),
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    module: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` on ``nproc`` ranks through ``rankwise launch``; capture its output.

    Never raises for the script's own failure: check ``returncode``. Raises
    ``subprocess.TimeoutExpired`` (after killing the launch) when it outlives ``timeout``.
    """
    cmd = [sys.executable, "-m", "rankwise.cli", "launch", f"--nproc-per-node={nproc}"]
    cmd += [*launch_args, *(["-m"] if module else []), str(script), *script_args]
    return run_isolated(cmd, env=child_env(env), timeout=timeout)


def run_isolated(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)`` in a session of its own.

    On timeout the whole session is killed — the launcher *and* the ranks it started; killing
    only the launcher (what ``subprocess.run`` does) leaves hung ranks behind — and
    ``subprocess.TimeoutExpired`` is raised, carrying what the command printed (its last
    lines also go to this process's stderr, so a test runner shows where it hung).
    """
    with subprocess.Popen(
        list(cmd),
        env=None if env is None else dict(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            for name, text in (("stdout", out), ("stderr", err)):
                print(f"--- its {name}, to the end ---\n{text[-6000:]}", file=sys.stderr)
            raise subprocess.TimeoutExpired(list(cmd), timeout, out, err) from None
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def run_by_hand(
    cmd: Sequence[str],
    world_size: int = 2,
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> list[subprocess.CompletedProcess[str]]:
    """Start ``cmd`` once per rank with :func:`rank_env` (a fresh free port) plus ``env``: the
    guides' manual launch, ``RANK=r WORLD_SIZE=N ... python train.py &`` for each rank.

    Returns each rank's ``CompletedProcess`` in rank order; never raises for the command's own
    failure (check ``returncode``). Each rank runs in a session of its own; when they do not
    all finish within ``timeout`` seconds, every session is killed (the ranks and anything
    they started) and ``subprocess.TimeoutExpired`` is raised.
    """
    if world_size < 1:
        raise ValueError(f"world_size ({world_size}) must be >= 1.")
    port = free_port()
    procs: list[tuple[subprocess.Popen[bytes], Any, Any]] = []
    deadline = time.monotonic() + timeout
    with contextlib.ExitStack() as files:
        try:
            for rank in range(world_size):
                # Files, not pipes: a rank blocked on a full pipe that nobody reads yet would
                # hang its peers in their next collective.
                out = files.enter_context(tempfile.TemporaryFile())
                err = files.enter_context(tempfile.TemporaryFile())
                proc = subprocess.Popen(
                    list(cmd),
                    env=rank_env(rank, world_size, port, env),
                    cwd=cwd,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
                procs.append((proc, out, err))
            for proc, _, _ in procs:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            return [_completed(cmd, *entry) for entry in procs]
        finally:
            for proc, _, _ in procs:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def _completed(
    cmd: Sequence[str], proc: subprocess.Popen[bytes], out: Any, err: Any
) -> subprocess.CompletedProcess[str]:
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read().decode(errors="replace"))
    return subprocess.CompletedProcess(list(cmd), proc.returncode, texts[0], texts[1])


@contextlib.contextmanager
def hygiene() -> Iterator[None]:
    """Restore ``os.environ``; tear down a live process group (``finalize()`` of none drains)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        import rankwise.distributed as rd
        from rankwise.distributed.config import restore_gloo_interface

        if rd.is_initialized():  # else finalize() would still drain gloo's threads: ~0.4 s
            rd.finalize()
        restore_gloo_interface()  # what finalize() undoes even without a group
        os.environ.clear()
        os.environ.update(saved)
