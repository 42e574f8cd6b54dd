"""``rankwise launch --on-failure continue``: what it refuses before starting anything, and the
job store its launchers share (one node here; two hosts: tests/launch/test_launch_multihost.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
import torch.distributed as dist

from rankwise.distributed.signing import SignedStore
from rankwise.launch import JobStore, launch, parse_endpoint
from rankwise.testing import child_env


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--nnodes", "1:2"], "runs on a fixed number of nodes (got --nnodes 1:2)"),
        (["--nproc-per-node", "auto"], "needs a number for --nproc-per-node"),
        (["--min-nproc", "4"], "--min-nproc (4) must be between 1 and --nproc-per-node (3)."),
        (
            ["--nnodes", "2", "--node-rank", "0", "--master-port", "29500", "--min-nproc", "7"],
            "--min-nproc (7) must be between 1 and --nproc-per-node (3) x --nnodes (2) = 6.",
        ),
        (["--nnodes", "2", "--master-port", "29500"], "needs --node-rank between 0 and 1"),
        (["--nnodes", "2", "--node-rank", "2", "--master-port", "29500"], "(got 2)"),
        (["--node-rank", "1"], "on 1 node(s) needs --node-rank between 0 and 0"),
        (["--nnodes", "2", "--node-rank", "1"], "on 2 node(s) needs --master-port"),
        (["--store-endpoint", "10.0.0.5"], "--store-endpoint ('10.0.0.5') must be HOST:PORT"),
    ],
)
def test_refusals_name_the_fix(tmp_path, capsys, extra, message):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    argv = ["--nproc-per-node", "3", "--on-failure", "continue", *extra, str(script)]
    assert launch(argv) == 2
    assert message in capsys.readouterr().err


def test_a_store_endpoint_stands_for_the_master_port(tmp_path, capsys):
    # Refused for --min-nproc only: --nnodes 2 with --store-endpoint needs no --master-port.
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    argv = ["--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1", "--min-nproc", "3"]
    argv += ["--store-endpoint", "127.0.0.1:1", "--on-failure", "continue", str(script)]
    assert launch(argv) == 2
    err = capsys.readouterr().err
    assert "--min-nproc (3)" in err and "--master-port" not in err


def test_parse_endpoint():
    assert parse_endpoint("[::1]:29600") == ("::1", 29600)
    assert parse_endpoint("host:0") is None
    assert parse_endpoint(":29600") is None


def eventually(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_the_store_host_waits_for_every_node_and_a_lost_store_is_said_once(capsys):
    host = JobStore("127.0.0.1", 0, hosting=True, node=0, nnodes=2, stale_s=1.0)
    other = JobStore("127.0.0.1", host.port, hosting=False, node=1, nnodes=2)
    assert not other.finished() and host.done_nodes() == {}
    host.set("launch/done/0", "0")
    other.set("launch/finished", "1")
    eventually(host.finished)  # another connection's set: answered in its own time
    other.await_outcome()  # training finished elsewhere: returns at once
    other.close()  # node 1's launcher stops its heartbeat (killed) and never says done
    host.await_others()  # bounded by the heartbeat, then it says so
    assert "node(s) [1]: no heartbeat from their launcher for 1 s" in capsys.readouterr().err
    other.set("launch/done/1", "3")
    eventually(lambda h=host: h.done_nodes() == {0: 0, 1: 3})
    del host  # the store host goes away
    assert other.get("launch/finished") is None and other.lost
    err = capsys.readouterr().err
    assert err.count("lost the membership store at 127.0.0.1:") == 1
    assert "--store-endpoint HOST:P" in err


def test_rankwise_store_serves_until_every_node_is_done(tmp_path):
    probe = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = probe.port
    del probe  # a port that was free a moment ago
    cmd = [sys.executable, "-m", "rankwise.cli", "store", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--nnodes", "2"]
    proc = subprocess.Popen(cmd, env=child_env(), stderr=subprocess.PIPE, text=True)
    try:
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        launcher = SignedStore(client, "ab" * 16, "j")  # as a launcher writes (signed)
        launcher.set("launch/done/0", "0")
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.5)  # node 1 is not done yet
        client.set("launch/done/1", "0")  # not a launcher's value: the store waits on
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.5)
        launcher.set("launch/done/1", "0")
        assert proc.wait(timeout=60) == 0
        assert proc.stderr is not None
        err = proc.stderr.read()
        assert f"serving one job's membership store on 127.0.0.1:{port} for 2 node(s)" in err
    finally:
        proc.kill()
        proc.wait()


def test_rankwise_store_refuses_no_nodes(capsys):
    from rankwise.cli import main

    assert main(["store", "--port", "29600", "--nnodes", "0"]) == 2
    assert "--nnodes (0) must be >= 1." in capsys.readouterr().err
