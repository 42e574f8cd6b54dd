"""docs/troubleshooting.md's rows for what ``rankwise launch --on-failure continue`` refuses
before starting anything (rankwise.launch.supervisor.check_continue_args, the job's secret, a
node rank given twice) and the launch options either mode refuses (check_args), each provoked
in this process. tests/troubleshooting/test_troubleshooting.py checks that these rows and triggers pair up."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers.troubleshooting_table import check_row, raised
from rankwise.distributed.config import check_variables
from rankwise.launch import JobStore, check_args, check_continue_args
from rankwise.launch.supervisor import job_token


def _refused(**given: object) -> BaseException:
    args = {"nnodes": "1", "nproc_per_node": "3", "min_nproc": 1, "node_rank": None}
    args |= {"master_port": None, "store_endpoint": None, **given}
    return raised(check_continue_args, argparse.Namespace(**args))


TRIGGERS: dict[str, Callable[[], BaseException]] = {
    "continue-nnodes": lambda: _refused(nnodes="1:4"),
    "continue-nproc": lambda: _refused(nproc_per_node="auto"),
    "continue-min-nproc-range": lambda: _refused(
        nnodes="2", node_rank=0, master_port=29500, min_nproc=7
    ),
    "continue-store-endpoint": lambda: _refused(store_endpoint="10.0.0.5"),
    "continue-node-rank": lambda: _refused(nnodes="2", master_port=29500),
    "continue-master-port": lambda: _refused(nnodes="2", node_rank=1),
    "continue-job-token-needed": lambda: _refused(nnodes="2", node_rank=1, master_port=29500),
    "continue-torchrun-option": lambda: _refused(rdzv_backend="c10d"),
    "launch-max-restarts": lambda: raised(
        check_args, argparse.Namespace(nproc_per_node="2", nnodes="1", max_restarts=-1)
    ),
    "launch-continue-only": lambda: raised(
        check_args, argparse.Namespace(nproc_per_node="2", nnodes="1", min_nproc=2)
    ),
    "launch-master-port": lambda: raised(
        check_args, argparse.Namespace(nproc_per_node="2", nnodes="1", master_port=99999)
    ),
    "launch-node-rank": lambda: raised(
        check_args, argparse.Namespace(nproc_per_node="2", nnodes="2", node_rank=2)
    ),
    "continue-store-wait": lambda: _refused(store_wait_s=0.0),
    "launch-variable-owned": lambda: raised(
        check_variables, {"RANKWISE_SLOT": "1"}, launching="continue"
    ),
    "launch-variable-mode": lambda: raised(
        check_variables, {"RANKWISE_ON_FAILURE": "continue"}, launching="restart"
    ),
    "continue-node-rank-twice": lambda: _node_rank_twice(),
    "continue-job-token-missing": lambda: _token_file(None),
    "continue-job-token-private": lambda: _token_file(("0" * 64, 0o644)),
    "continue-job-token-format": lambda: _token_file(("not hex", 0o600)),
}


def _node_rank_twice() -> BaseException:
    host = JobStore("127.0.0.1", 0, hosting=True, node=0, nnodes=2)
    return raised(JobStore, "127.0.0.1", host.port, hosting=False, node=0, nnodes=2)


def _token_file(content: tuple[str, int] | None) -> BaseException:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "job.token"
        if content is not None:
            path.write_text(content[0])
            path.chmod(content[1])
        return raised(job_token, str(path), 1)


@pytest.mark.parametrize("row_id", sorted(TRIGGERS))
def test_documented_message_is_the_one_raised(row_id: str) -> None:
    check_row(row_id, TRIGGERS[row_id])
