"""docs/troubleshooting.md's rows for what ``rankwise launch --on-failure continue`` refuses
before starting anything (rankwise.launch.supervisor.check_continue_args), each provoked in this
process. tests/troubleshooting/test_troubleshooting.py checks that these rows and triggers pair up."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from helpers.troubleshooting_table import check_row, raised
from rankwise.launch import check_continue_args


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
}


@pytest.mark.parametrize("row_id", sorted(TRIGGERS))
def test_documented_message_is_the_one_raised(row_id: str) -> None:
    check_row(row_id, TRIGGERS[row_id])
