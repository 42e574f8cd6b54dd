"""Which local address and network interface reach another host (for multi-host jobs).

torch's defaults find "this machine" through its hostname: torchrun announces
``socket.getfqdn()`` as ``MASTER_ADDR``, its c10d rendezvous hosts the store only if the
endpoint matches the hostname's addresses, and gloo binds to the hostname's address (falling
back to the loopback one). That breaks across hosts whenever the hostname resolves to a
loopback address (Debian's ``127.0.1.1``, containers' ``127.0.0.1``) or to another NIC than
the one the peers reach: the peers are told to connect to ``127.0.0.1``, i.e. to themselves.

The kernel's routing table knows better: the source address it picks to reach the master is
the one the master can reach back, and the interface that holds it is the one gloo must use.
These helpers ask it (a UDP ``connect`` sends nothing) and never touch the environment.
"""

from __future__ import annotations

import array
import errno
import ipaddress
import socket
import struct

_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def resolve(host: str) -> str | None:
    """``host``'s IPv4 address (a name is looked up), or ``None`` if it does not resolve.

    >>> resolve("127.0.0.1")
    '127.0.0.1'
    """
    try:
        return str(socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    except (OSError, UnicodeError, IndexError):
        return None


def is_loopback(address: str) -> bool:
    """Whether an IP address is a loopback one (``127.0.0.0/8``, ``::1``).

    >>> is_loopback("127.0.1.1"), is_loopback("10.0.0.2")
    (True, False)
    """
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def route_source(host: str) -> str | None:
    """The local IPv4 address this machine sends from to reach ``host``, or ``None``.

    For ``host`` on this machine it is that address itself. ``None`` when ``host`` does not
    resolve or no route leads there.
    """
    address = resolve(host)
    if address is None:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, 9))  # UDP: picks the route and source, sends nothing
        except OSError:
            return None
        return str(probe.getsockname()[0])


def interface_of(address: str) -> str | None:
    """The name of the network interface that holds IPv4 ``address`` here, or ``None``.

    ``None`` also where the Linux ioctl it asks is missing (Windows has no ``fcntl``).
    """
    try:
        import fcntl  # imported here: a module-level import breaks the package on Windows
    except ImportError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = array.array("B", struct.pack("256s", name.encode()[:15]))
            try:
                fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on this one (or not Linux)
                continue
            if socket.inet_ntoa(request[20:24].tobytes()) == address:
                return name
    return None


def is_local_address(host: str) -> bool:
    """Whether ``host`` resolves to an address of this machine (one it can listen on)."""
    address = resolve(host)
    if address is None:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return False
            raise
    return True


def interface_towards(host: str, spans_hosts: bool = False) -> str | None:
    """The interface gloo should bind to for a job whose master is ``host``.

    A master that resolves to loopback is this machine's own name (SLURM's first node, whose
    ``/etc/hosts`` maps it to ``127.0.1.1``): in a job that ``spans_hosts`` the peers reach it
    through the default route's interface. ``None`` when torch's default is right or nothing
    better is known: a loopback master in a one-machine job, a master that does not resolve
    or is reached through the loopback device.
    """
    address = resolve(host)
    if address is None:
        return None
    if is_loopback(address):
        return default_route_interface() if spans_hosts else None
    source = route_source(address)
    if source is None or is_loopback(source):
        return None
    name = interface_of(source)
    return None if name is None or name == "lo" else name


def default_route_interface() -> str | None:
    """The interface of this machine's default IPv4 route (Linux), or ``None``."""
    try:
        with open("/proc/net/route") as table:
            rows = [line.split() for line in table.readlines()[1:]]
    except OSError:  # not Linux
        return None
    # Columns: Iface Destination Gateway Flags RefCnt Use Metric Mask ...; lowest metric wins.
    defaults = [row for row in rows if len(row) > 7 and row[1] == row[7] == "00000000"]
    defaults.sort(key=lambda row: int(row[6]))
    return defaults[0][0] if defaults and defaults[0][0] != "lo" else None


def hostname_is_usable() -> bool:
    """Whether gloo's default address, the hostname's, reaches this machine from others.

    gloo binds to the address ``gethostname()`` resolves to, or to the loopback one when that
    is not an address of this machine: either way a loopback bind that peers cannot reach.
    """
    address = resolve(socket.gethostname())
    return address is not None and not is_loopback(address) and is_local_address(address)
