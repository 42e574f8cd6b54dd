"""Restarts across two torchrun agents (two "nodes" on this machine), on real processes.

A worker on one node fails on the first attempt. Its agent restarts it (its
TORCHELASTIC_RESTART_COUNT becomes 1) and the other agent restarts its healthy worker by
membership change (its count stays 0): the counts disagree across nodes, so no rendezvous key
may depend on them. The job must re-rendezvous and finish under plain torchrun (torch's
shared agent store) and under `rankwise launch` (a fresh store per round).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import SCRIPTS
from rankwise.testing import child_env, free_port

WORKER = SCRIPTS / "launch_worker.py"


def _agent(launcher: str, port: int, marker: Path) -> list[str]:
    head = {
        "torchrun": [sys.executable, "-m", "torch.distributed.run"],
        "rankwise": [sys.executable, "-m", "rankwise.cli", "launch"],
    }[launcher]
    return [
        *head, "--nnodes=2", "--nproc-per-node=1", "--max-restarts=1", "--monitor-interval=0.2",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=two-nodes",
        str(WORKER), f"--fail-once={marker}",
    ]  # fmt: skip


@pytest.mark.parametrize("launcher", ["torchrun", "rankwise"])
def test_two_nodes_restart_after_one_fails(launcher: str, tmp_path: Path) -> None:
    port = free_port()
    marker = tmp_path / "failed-once"
    env = child_env({"DISTRIBUTED_TIMEOUT_MS": "30000", "PYTHONUNBUFFERED": "1"})
    # Each agent in a session of its own, so a hung one is killed with its worker.
    agents = [
        subprocess.Popen(
            _agent(launcher, port, marker),
            env=env,
            text=True,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    outputs = []
    try:
        for agent in agents:
            out, err = agent.communicate(timeout=150)
            outputs.append((agent.returncode, out, err))
    except subprocess.TimeoutExpired:
        pytest.fail("the two-node job hung after the restart (killed at 150 s)")
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.communicate()
    logs = "\n".join(err for _, _, err in outputs)
    assert marker.exists(), "the planned failure never happened"
    assert [code for code, _, _ in outputs] == [0, 0], logs[-6000:]
    finished = "".join(out for _, out, _ in outputs)
    assert finished.count(": ok") == 2 and "rank 0/2" in finished and "rank 1/2" in finished
    assert "planned failure of rank 1 before init" in logs
