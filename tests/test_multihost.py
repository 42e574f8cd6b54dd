"""A real two-host run (issue 10): two network namespaces joined by a veth pair, one
``rankwise launch --nnodes 2`` agent per "host" meeting over c10d rendezvous, training
through the trainer (tests/scripts/fault_worker.py). Each namespace has its own interfaces,
routes and loopback, so anything that announces ``127.0.0.1`` or a hostname that resolves to
it (``vm -> 127.0.0.1`` in /etc/hosts here) instead of the veth address fails, as it would
between two machines. The filesystem is shared, as a cluster's shared checkpoint folder is.

Checked: both hosts finish with the parameters of a single-machine run of the same global
batch, every sample once per epoch (the audit log); then the same with the rank on one host
SIGKILLed mid-epoch and recovered by ``--max-restarts``. Skipped only where ``ip netns add``
is refused for lack of permission (the skip reason quotes the error).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fault_runs import WORKER, exactly_once
from rankwise.testing import child_env

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
    """One agent per namespace; each host's (exit code, ``None`` if it hung; log).

    Nothing outlives the call: an agent still running at the deadline is killed with its
    session, and everything left in either namespace (the ranks run in sessions of their own).
    """
    master = hosts[0]
    logs, procs = [], []
    try:
        for host in hosts:
            cmd = ["ip", "netns", "exec", host.netns, sys.executable, "-m", "rankwise.cli"]
            cmd += ["launch", "--nnodes", "2", "--nproc-per-node", "1"]
            cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{master.addr}:{RDZV_PORT}"]
            cmd += ["--rdzv-id", f"multihost-{out.name}", "--max-restarts", str(restarts)]
            cmd += [str(WORKER), str(out), *worker_args]
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
        for proc in procs:
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
    with test_faults.py)."""
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


def test_two_hosts_train_to_the_single_machine_result(hosts, reference, tmp_path):
    out = tmp_path / "run"
    params = finished(launch_two_hosts(hosts, out), out)
    assert exactly_once(out, attempts=1) == [0]
    assert_equal(params, reference)


def test_rank_killed_on_one_host_recovers_on_both(hosts, reference, tmp_path):
    # The rank 1 process (on whichever host c10d numbered second) dies inside step 8 of 12
    # in epoch 0; the newest checkpoint is step 6. Both agents re-rendezvous and restart.
    out = tmp_path / "run"
    results = launch_two_hosts(hosts, out, "--kill-rank", "1", "--kill-step", "8", restarts=2)
    assert (out / "killed-rank1").exists()
    params = finished(results, out)
    assert exactly_once(out, attempts=2) == [0, 6]
    assert_equal(params, reference)
