"""Shared fixtures: every test runs with its environment restored and no process group left."""

# ruff: noqa: E402  (bytecode writing is turned on before the imports below)

from __future__ import annotations

import os
import sys

# The suite starts hundreds of Python processes (ranks, launchers, examples). Where bytecode
# writing is off (PYTHONDONTWRITEBYTECODE, set in some CI images), each would compile every
# module it imports from source, rankwise's and, after `pip install --no-compile`, torch's: on
# for this session and its children, before anything heavy is imported.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import durations
from helpers.fault_runs import WORKER, exactly_once
from helpers.paths import SCRIPTS
from helpers.shared import made_once
from rankwise.testing import assert_exactly_once, child_env, hygiene, run_isolated, run_script
from rankwise.testing.s3server import S3_KEY, S3_SECRET, S3Server, start_server

CONTINUE_WORKER = SCRIPTS / "continue_worker.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first (tests/durations.json; see tests/helpers/durations.py): xdist's
    ``--dist loadfile`` hands out files in this order (``--no-loadscope-reorder``: by default
    it puts the files with the most tests first, which left the long launches, few tests
    each, to run alone at the end). A file's tests keep their order."""
    seconds = durations.recorded()
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(item.nodeid.split("::")[0], i)

    def key(item: pytest.Item) -> tuple[float, int]:
        file = item.nodeid.split("::")[0]
        return (-seconds.get(file, 0.0), first[file])

    items.sort(key=key)


@pytest.fixture(autouse=True)
def _hygiene() -> Iterator[None]:
    with hygiene():
        yield


@pytest.fixture(scope="session")
def fault_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fault worker's uninterrupted run on one machine (2 ranks of batch 8): the parameters
    that test_train_faults.py's recoveries and test_launch_multihost.py's two hosts must end
    with. One launch for both modules, whichever xdist worker runs them (helpers/shared.py)."""
    import torch

    def launch(out: Path) -> None:
        result = run_script(WORKER, 2, script_args=[str(out)], timeout=300)
        assert result.returncode == 0, result.stderr[-4000:]
        assert exactly_once(out, attempts=1) == [0]

    out = made_once(tmp_path_factory, "fault-reference", launch)
    return dict(torch.load(out / "final.pt"))


@pytest.fixture(scope="session")
def continue_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """tests/scripts/continue_worker.py's uninterrupted run in one plain process with the
    whole global batch (24): the k-th global batch holds the same samples whatever the world
    size, so 2 x 12, 3 x 8 and 4 x 6 land within float rounding of it (test_train_continue.py,
    test_launch_multihost.py). No launcher, no process group; once per run (helpers/shared.py)."""
    import torch

    def train(out: Path) -> None:
        cmd = [sys.executable, str(CONTINUE_WORKER), str(out), "--batch-size", "24"]
        result = run_isolated(cmd, env=child_env(), timeout=300)
        assert result.returncode == 0, result.stderr[-4000:]
        assert assert_exactly_once(out / "audit", 1, 192, 2) == [0]  # 192 samples, 2 epochs

    out = made_once(tmp_path_factory, "continue-reference", train)
    return dict(torch.load(out / "final.pt"))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3 server (SeaweedFS ``weed mini``) on free ports for this test process, with one
    identity (:data:`S3_KEY`, :data:`S3_SECRET`); stopped by its process group at the end."""
    server = start_server(tmp_path_factory.mktemp("s3server"), credentials=(S3_KEY, S3_SECRET))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """``s3://BUCKET`` of a fresh bucket on :func:`s3_server`, with the ``AWS_*`` variables
    set to reach it, as a user's environment would."""
    import uuid

    import s3fs

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    bucket = f"rankwise-{uuid.uuid4().hex[:16]}"
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
    return f"s3://{bucket}"


@pytest.fixture(params=["folder", "memory", "s3"])
def store_root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a test's store lives, once per backend: a local folder, ``memory://`` and the real
    S3 server (:func:`s3_bucket`): the tests of the one store interface run on each."""
    import uuid

    if request.param == "folder":
        return str(tmp_path / "store")
    if request.param == "memory":
        return f"memory://rankwise-{uuid.uuid4().hex[:16]}"
    return str(request.getfixturevalue("s3_bucket"))


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a socket that accepts connections and never answers: a
    frozen store, for the read timeouts of the storage layer."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


# Helper scripts run under `rankwise launch`; they are not test modules (and parse argv on import).
collect_ignore = ["scripts"]
