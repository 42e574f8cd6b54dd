"""Which local address and interface reach a host: the parts testable on one machine.

The multi-host behaviour itself (a veth address and interface per network namespace) is
tested in tests/launch/test_launch_multihost.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from rankwise.distributed.config import (
    choose_gloo_interface,
    environment_variables,
    gloo_interface,
    restore_gloo_interface,
    set_gloo_interface,
    spans_hosts,
)
from rankwise.distributed.interfaces import (
    default_route_interface,
    hostname_is_usable,
    interface_of,
    interface_towards,
    is_local_address,
    is_loopback,
    resolve,
    route_source,
)
from rankwise.testing import child_env, run_distributed

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux ioctl")
UNRESOLVABLE = "no-such-host.invalid"  # RFC 2606: never resolves
ELSEWHERE = "203.0.113.7"  # RFC 5737 TEST-NET-3: never an address of this machine


def test_resolve_gives_an_address_or_none() -> None:
    assert resolve("127.0.0.1") == "127.0.0.1"
    assert resolve("localhost") is not None
    assert resolve(UNRESOLVABLE) is None


def test_route_to_this_machine_starts_at_the_same_address() -> None:
    assert route_source("127.0.0.1") == "127.0.0.1"
    assert route_source(UNRESOLVABLE) is None


@linux_only
def test_interface_of_an_address() -> None:
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of(ELSEWHERE) is None


def test_local_addresses_are_the_ones_this_machine_can_listen_on() -> None:
    assert is_local_address("127.0.0.1")
    assert not is_local_address(ELSEWHERE)
    assert not is_local_address(UNRESOLVABLE)


def test_a_one_machine_master_keeps_torchs_default() -> None:
    assert interface_towards("127.0.0.1") is None
    assert interface_towards("localhost") is None
    assert interface_towards(UNRESOLVABLE) is None


@linux_only
def test_a_remote_master_is_reached_through_a_real_interface() -> None:
    source = route_source(ELSEWHERE)
    if source is None:
        pytest.skip("this machine has no route beyond itself")
    name = interface_towards(ELSEWHERE)
    assert name is not None and name != "lo"
    assert interface_of(source) == name


def _gloo_would_bind_loopback() -> bool:
    return not hostname_is_usable()


def test_init_sets_gloo_interface_only_when_the_user_did_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    choose_gloo_interface("127.0.0.1", 2)  # one machine: torch's default stays
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    if sys.platform.startswith("linux") and route_source(ELSEWHERE) is not None:
        monkeypatch.setattr(socket, "gethostname", lambda: "no-such-host.invalid")
        assert choose_gloo_interface(ELSEWHERE, 2) == interface_towards(ELSEWHERE)
        assert os.environ["GLOO_SOCKET_IFNAME"] == interface_towards(ELSEWHERE)
        restore_gloo_interface()
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "mine0")
    assert choose_gloo_interface(ELSEWHERE, 2) is None
    assert os.environ["GLOO_SOCKET_IFNAME"] == "mine0"


def test_a_usable_hostname_keeps_gloos_own_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    # On a multi-NIC host gloo's default (the hostname's address, e.g. on InfiniBand) may be a
    # faster fabric than the one MASTER_ADDR is on: rankwise only steps in where it would fail.
    own = route_source(ELSEWHERE)
    if own is None or is_loopback(own):
        pytest.skip("this machine has no address beyond loopback")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(socket, "gethostname", lambda: own)  # a name resolving to it
    assert hostname_is_usable()
    assert choose_gloo_interface(ELSEWHERE, 2) is None
    assert "GLOO_SOCKET_IFNAME" not in os.environ


def test_rankwise_choice_is_not_reported_as_the_users_and_is_undone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    set_gloo_interface("eth9")
    assert os.environ["GLOO_SOCKET_IFNAME"] == "eth9"  # what gloo reads
    assert gloo_interface() is None and environment_variables()["GLOO_SOCKET_IFNAME"] is None
    restore_gloo_interface()
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    set_gloo_interface("eth9")
    os.environ["GLOO_SOCKET_IFNAME"] = "ib0"  # the user's, set meanwhile: theirs to keep
    assert environment_variables()["GLOO_SOCKET_IFNAME"] == "ib0"
    restore_gloo_interface()
    assert os.environ["GLOO_SOCKET_IFNAME"] == "ib0"


def _interface_during_and_after() -> tuple[str | None, str | None, str | None]:
    import rankwise.distributed as rd

    rd.init()
    during = os.environ.get("GLOO_SOCKET_IFNAME")
    reported = environment_variables()["GLOO_SOCKET_IFNAME"]
    rd.barrier()
    rd.finalize()
    return during, reported, os.environ.get("GLOO_SOCKET_IFNAME")


@pytest.mark.timeout(120)
def test_init_chooses_gloos_interface_only_until_finalize() -> None:
    # The reviewer's case: MASTER_ADDR is this machine's own address on a real NIC, the
    # hostname maps to loopback; after finalize() nothing is left for a later init() towards
    # another master, for child processes, or for `rankwise env`.
    own = route_source(ELSEWHERE)
    if own is None or is_loopback(own) or not _gloo_would_bind_loopback():
        pytest.skip("needs a non-loopback address and a hostname gloo cannot use")
    expected = interface_of(own)
    results = run_distributed(
        _interface_during_and_after, 2, env={"MASTER_ADDR": own}, init_group=False, timeout=90
    )
    assert results == [(expected, None, None)] * 2


@linux_only
def test_a_master_named_by_its_own_loopback_hostname_in_a_multi_host_job() -> None:
    # SLURM's MASTER_ADDR=$(scontrol show hostnames | head -1): on node 0 that name maps to
    # 127.0.1.1, yet the peers on other nodes reach it through the default route's interface.
    if default_route_interface() is None:
        pytest.skip("this machine has no default route")
    assert interface_towards("127.0.0.1", spans_hosts=True) == default_route_interface()
    assert interface_towards("127.0.0.1", spans_hosts=False) is None  # one machine


def test_a_job_spans_hosts_when_the_launcher_says_so() -> None:
    assert spans_hosts(8, {"LOCAL_WORLD_SIZE": "4"})
    assert not spans_hosts(4, {"LOCAL_WORLD_SIZE": "4"})
    assert spans_hosts(4, {"OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    assert spans_hosts(4, {"MPI_LOCALNRANKS": "1"})
    assert spans_hosts(4, {"SLURM_NNODES": "2"}) and not spans_hosts(4, {"SLURM_NNODES": "1"})
    assert spans_hosts(4, {"SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "2"})
    assert not spans_hosts(4, {"SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "1"})
    assert not spans_hosts(4, {})  # nothing says: assume one machine


def test_init_with_a_loopback_hostname_master_spanning_hosts_binds_the_default_route(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not sys.platform.startswith("linux") or default_route_interface() is None:
        pytest.skip("needs Linux and a default route")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")  # maps to loopback
    assert choose_gloo_interface("localhost", 4) == default_route_interface()
    restore_gloo_interface()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # all four here: one machine
    assert choose_gloo_interface("localhost", 4) is None


def test_the_package_imports_without_fcntl() -> None:
    # Windows has no fcntl: importing rankwise.distributed must not need it.
    code = (
        "import sys; sys.modules['fcntl'] = None; import rankwise.distributed; "
        "from rankwise.distributed.interfaces import interface_of; "
        "print(interface_of('127.0.0.1'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "None"
