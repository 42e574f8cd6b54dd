"""A real two-host run (issues 10 and 16): two network namespaces joined by a veth pair, one
``rankwise launch --nnodes 2`` agent per "host" meeting over c10d rendezvous, training
through the trainer (tests/scripts/fault_worker.py). Each namespace has its own interfaces,
routes and loopback, so anything that announces ``127.0.0.1`` or a hostname that resolves to
it (``vm -> 127.0.0.1`` in /etc/hosts here) instead of the veth address fails, as it would
between two machines. The filesystem is shared, as a cluster's shared checkpoint folder is.

Checked: both hosts finish with the parameters of a single-machine run of the same global
batch, every sample once per epoch (the audit log); then the same with the rank on one host
SIGKILLed mid-epoch and recovered by ``--max-restarts``. Under ``--on-failure continue``
(tests/scripts/continue_worker.py, 2 hosts x 2 ranks): a rank SIGKILLed on host 1 leaves host
0's ranks in their processes while host 1 restarts it and it rejoins, and with the store apart (``rankwise store``) losing host 0's
launcher and its ranks leaves host 1 training; both end within 1e-4 of a one-process run of
the same global batch, every sample exactly once. Skipped only where ``ip netns add``
is refused for lack of permission (the skip reason quotes the error).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

from helpers.fault_runs import EPOCHS, NUM_SAMPLES, WORKER, exactly_once
from rankwise.testing import assert_exactly_once, child_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RDZV_PORT = 29400  # each namespace has ports of its own: no job outside can hold it
LAUNCH_SECONDS = 300
_PERMISSION_ERRORS = ("Operation not permitted", "Permission denied")


@dataclasses.dataclass(frozen=True)
class Host:
    netns: str
    veth: str
    addr: str


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _must(*args: str) -> None:
    result = _ip(*args)
    assert result.returncode == 0, f"ip {' '.join(args)}: {result.stderr.strip()}"


def _kill_namespace_processes(netns: str) -> None:
    """SIGKILL whatever still runs in ``netns`` (agents, and ranks in sessions of their own)."""
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        pids = _ip("netns", "pids", netns).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)


def _pair_addresses(pid: int) -> tuple[str, str]:
    """A private /30 per pid (10.P.Q.R): parallel test runs never share a subnet.

    >>> _pair_addresses(4194303)
    ('10.255.255.253', '10.255.255.254')
    """
    base = (10 << 24) | ((pid & 0x3FFFFF) << 2)  # pids are below 2**22 on Linux
    return str(ipaddress.IPv4Address(base + 1)), str(ipaddress.IPv4Address(base + 2))


@pytest.fixture(scope="module")
def hosts() -> Iterator[tuple[Host, Host]]:
    pid = os.getpid()
    addr_a, addr_b = _pair_addresses(pid)
    a = Host(f"rwns{pid}a", f"rw{pid}a", addr_a)
    b = Host(f"rwns{pid}b", f"rw{pid}b", addr_b)
    for netns in (a.netns, b.netns):  # left by a killed run whose pid this one reuses
        _ip("netns", "del", netns)
    created = _ip("netns", "add", a.netns)
    if created.returncode != 0:
        error = created.stderr.strip()
        if any(text in error for text in _PERMISSION_ERRORS):
            pytest.skip(f"network namespaces are not permitted here: `ip netns add` said {error!r}")
        pytest.fail(f"ip netns add {a.netns} failed: {error}")
    made = [a.netns]
    try:
        _must("netns", "add", b.netns)
        made.append(b.netns)
        _must("link", "add", a.veth, "type", "veth", "peer", "name", b.veth)
        for host in (a, b):
            _must("link", "set", host.veth, "netns", host.netns)
            _must("-n", host.netns, "addr", "add", f"{host.addr}/30", "dev", host.veth)
            _must("-n", host.netns, "link", "set", host.veth, "up")
            _must("-n", host.netns, "link", "set", "lo", "up")
        yield a, b
    finally:
        for netns in made:
            _kill_namespace_processes(netns)
            _ip("netns", "del", netns)  # also removes both veth ends
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            _ip("link", "del", a.veth)  # if the pair never reached a namespace


def launch_two_hosts(
    hosts: tuple[Host, Host], out: Path, *worker_args: str, restarts: int = 0
) -> list[tuple[int | None, str]]:
    """One agent per namespace over c10d rendezvous; each host's (exit code, ``None`` if it
    hung; log)."""
    master = hosts[0]
    cmds = []
    for host in hosts:
        cmd = [*_agent(host), "--nnodes", "2", "--nproc-per-node", "1"]
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{master.addr}:{RDZV_PORT}"]
        cmd += ["--rdzv-id", f"multihost-{out.name}", "--max-restarts", str(restarts)]
        cmds.append([*cmd, str(WORKER), str(out), *worker_args])
    return run_agents(hosts, out, cmds)


def _agent(host: Host) -> list[str]:
    return ["ip", "netns", "exec", host.netns, sys.executable, "-m", "rankwise.cli", "launch"]


def run_agents(
    hosts: tuple[Host, Host],
    out: Path,
    cmds: list[list[str]],
    background: Sequence[tuple[Host, list[str]]] = (),
) -> list[tuple[int | None, str]]:
    """Run ``cmds[i]`` (an agent) on host i; each host's (exit code, ``None`` if it hung; log).

    ``background`` commands (e.g. a ``rankwise store``) start first and are killed at the end.
    Nothing outlives the call: an agent still running at the deadline is killed with its
    session, and everything left in either namespace (the ranks run in sessions of their own).
    """
    logs, procs, helpers = [], [], []
    try:
        for i, (host, cmd) in enumerate(background):
            ip = ["ip", "netns", "exec", host.netns, sys.executable, "-m", "rankwise.cli"]
            with (out.parent / f"{out.name}-background{i}.log").open("w") as sink:
                helpers.append(
                    subprocess.Popen(
                        [*ip, *cmd], env=child_env(), stdout=sink, stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )  # fmt: skip
        for host, cmd in zip(hosts, cmds, strict=True):
            log = out.parent / f"{out.name}-{host.netns}.log"
            logs.append(log)
            with log.open("w") as sink:
                procs.append(
                    subprocess.Popen(
                        cmd,
                        env=child_env(),
                        stdout=sink,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + LAUNCH_SECONDS
        codes: list[int | None] = []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=max(deadline - time.monotonic(), 1)))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        for proc in [*procs, *helpers]:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        for host in hosts:
            _kill_namespace_processes(host.netns)
    return [(code, log.read_text()) for code, log in zip(codes, logs, strict=True)]


def finished(results: list[tuple[int | None, str]], out: Path) -> dict[str, torch.Tensor]:
    for host, (code, log) in enumerate(results):
        assert code is not None, f"host {host} hung past {LAUNCH_SECONDS} s:\n{log[-5000:]}"
        assert code == 0, f"host {host} exited {code}:\n{log[-5000:]}"
    return torch.load(out / "final.pt")


@pytest.fixture
def reference(fault_reference: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same job (2 ranks of batch 8) on one machine (tests/conftest.py: one launch, shared
    with test_train_faults.py)."""
    return fault_reference


def assert_equal(params: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert params.keys() == ref.keys()
    for name in ref:
        assert torch.equal(params[name], ref[name]), name


def _in_namespace(host: Host, code: str) -> str:
    cmd = ["ip", "netns", "exec", host.netns, sys.executable, "-c", code]
    result = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


def test_each_host_names_itself_by_its_veth_address_and_interface(hosts):
    # What the launcher and init() derive on each "host" from the routing table alone; torch's
    # defaults give the hostname here, which resolves to 127.0.0.1 in every namespace.
    a, b = hosts
    code = (
        "from rankwise.cli import build_parser; from rankwise.launch import apply_defaults; "
        "from rankwise.distributed.interfaces import interface_towards; "
        "args = apply_defaults(build_parser().parse_args(['launch', '--nnodes=2', "
        f"'--rdzv-backend=c10d', '--rdzv-endpoint={a.addr}:{RDZV_PORT}', 't.py'])); "
        f"print(args.local_addr, args.rdzv_conf or '-', interface_towards('{a.addr}'))"
    )
    assert _in_namespace(a, code) == f"{a.addr} is_host=1 {a.veth}"
    assert _in_namespace(b, code) == f"{b.addr} - {b.veth}"


def test_two_hosts_train_to_the_single_machine_result_through_a_rank_killed_on_one(
    hosts, reference, tmp_path
):
    # The rank 1 process (on whichever host c10d numbered second) dies inside step 8 of 12
    # in epoch 0; the newest checkpoint is step 6. Both agents re-rendezvous and restart.
    # One launch shows both: the two hosts' run (its first attempt across both, its second
    # to the end) ends bit-identical to the single machine's, and the kill recovers on both.
    out = tmp_path / "run"
    results = launch_two_hosts(hosts, out, "--kill-rank", "1", "--kill-step", "8", restarts=2)
    assert (out / "killed-rank1").exists()
    params = finished(results, out)
    assert exactly_once(out, attempts=2) == [0, 6]
    assert_equal(params, reference)


# -- --on-failure continue across the two hosts (issue 16) --------------------------------------

CONTINUE_WORKER = WORKER.parent / "continue_worker.py"
STORE_PORT = 29600
NPROC = 2  # per host: slots 0, 1 on host 0 and 2, 3 on host 1; 4 x 6 = the global batch 24


def exactly_once_continue(out: Path, attempts: int) -> list[int]:
    return assert_exactly_once(out / "audit", attempts, NUM_SAMPLES, EPOCHS)


def launch_continue(
    hosts: tuple[Host, Host], out: Path, *worker_args: str, store: bool = False, restarts: int = 0
) -> list[tuple[int | None, str]]:
    """``--on-failure continue`` on both hosts: node 0 hosts the store at its veth address, or
    (``store=True``) a ``rankwise store`` in host 0's namespace, apart from its launcher."""
    a = hosts[0]
    where = ["--master-addr", a.addr, "--master-port", str(RDZV_PORT)]
    if store:
        where = ["--store-endpoint", f"{a.addr}:{STORE_PORT}"]
    token = out.parent / f"{out.name}.token"  # the job's secret: one file for both "hosts"
    token.touch(mode=0o600)
    token.write_text(secrets.token_hex(32))
    where += ["--job-token-file", str(token)]
    cmds = [
        [*_agent(host), "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node",
         str(NPROC), *where, "--max-restarts", str(restarts), "--on-failure", "continue",
         str(CONTINUE_WORKER), str(out),
         "--batch-size", "6", *worker_args]
        for node, host in enumerate(hosts)
    ]  # fmt: skip
    # rankwise store listens on loopback unless told: here on host 0's address, for host 1
    serve = ["store", "--host", a.addr, "--port", str(STORE_PORT), "--nnodes", "2"]
    background = [(a, serve)] if store else []
    return run_agents(hosts, out, cmds, background)


def pids(out: Path, slot: int) -> list[str]:
    return (out / f"pids-{slot}").read_text().split()


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_continue_a_rank_killed_on_host_1_leaves_host_0_running(
    hosts, continue_reference, tmp_path
):
    # Slot 3 (host 1) is SIGKILLed in step 5: slots 0-2 go on as 3 x 8; host 1's launcher
    # restarts slot 3, which rejoins across the hosts after step 7 (the worker holds the
    # members there until it asks), and steps 8-16 run on 4 x 6 again.
    out = tmp_path / "run"
    args = ("--kill-slot", "3", "--kill-step", "5", "--await-joiner-step", "7")
    results = launch_continue(hosts, out, *args, restarts=1)
    params = finished(results, out)
    # Host 0's ranks (slots 0 and 1) and host 1's survivor kept their processes.
    assert [len(pids(out, slot)) for slot in range(4)] == [1, 1, 1, 2]
    assert "slot 3 exited with signal SIGKILL; restarting it (1/1)" in results[1][1]
    assert "rankwise launch: slot" not in results[0][1]  # host 0's launcher restarted nothing
    assert (out / "final-world").read_text().strip() == "4"
    assert [int(s) for s in (out / "rejoined-3").read_text().split()] == list(range(8, 17))
    assert exactly_once_continue(out, attempts=3) == [0, 5, 7]
    assert max_diff(params, continue_reference) < 1e-4


def test_continue_with_the_store_apart_survives_losing_host_0(hosts, continue_reference, tmp_path):
    # Slot 0 SIGKILLs its process group in step 5: host 0's launcher and both its ranks. The
    # store runs apart (`rankwise store`), so host 1's two ranks regroup and finish on 2 x 12.
    out = tmp_path / "run"
    args = ("--kill-slot", "0", "--kill-step", "5", "--kill-group")
    results = launch_continue(hosts, out, *args, store=True)
    assert results[0][0] == -signal.SIGKILL, results[0][1][-3000:]
    code, log = results[1]
    assert code == 0, log[-5000:]
    assert "lost the membership store" not in log  # it lives apart from host 0
    assert [len(pids(out, slot)) for slot in (2, 3)] == [1, 1]
    assert (out / "final-world").read_text().strip() == "2"
    assert exactly_once_continue(out, attempts=2) == [0, 5]
    assert max_diff(torch.load(out / "final.pt"), continue_reference) < 1e-4
