"""Which local address and interface reach a host: the parts testable on one machine.

The multi-host behaviour itself (a veth address and interface per network namespace) is
tested in tests/test_multihost.py.
"""

from __future__ import annotations

import os
import sys

import pytest

from rankwise.distributed import group
from rankwise.distributed.interfaces import (
    interface_of,
    interface_towards,
    is_local_address,
    resolve,
    route_source,
)

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


def test_init_sets_gloo_interface_only_when_the_user_did_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    group._choose_gloo_interface("127.0.0.1")  # one machine: torch's default stays
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    if sys.platform.startswith("linux") and route_source(ELSEWHERE) is not None:
        group._choose_gloo_interface(ELSEWHERE)
        assert os.environ["GLOO_SOCKET_IFNAME"] == interface_towards(ELSEWHERE)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "mine0")
    group._choose_gloo_interface(ELSEWHERE)
    assert os.environ["GLOO_SOCKET_IFNAME"] == "mine0"
