"""Every variable rankwise reads is checked by the process itself too, under plain ``python``
where no launcher checked it (issue 30: ``RANKWISE_ON_FAILURE=sometimes`` ran on): ``rd.init()``
refuses it with one error naming the variable."""

from __future__ import annotations

import pytest

import rankwise.distributed as rd
from helpers.bad_variables import BAD
from rankwise.distributed import DistributedConfigError
from rankwise.distributed.config import check_variables


@pytest.mark.parametrize("var", sorted(BAD))
def test_init_under_plain_python_refuses_every_bad_variable(monkeypatch, var) -> None:
    monkeypatch.setenv(var, BAD[var])
    with pytest.raises(DistributedConfigError, match=var):
        rd.init()
    assert not rd.is_initialized()


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"RANKWISE_ON_FAILURE": "restart", "RANKWISE_STALE_S": "0.5"},
        {"RANKWISE_JOIN_CHECK_EVERY": "0", "DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": "4000"},
        {"RANKWISE_ON_FAILURE": "continue", "RANKWISE_SLOT": "1", "WORLD_SIZE": "2",
         "MASTER_PORT": "29500", "RANKWISE_INCARNATION": "1", "RANKWISE_JOB_TOKEN": "ab" * 16},
    ],
)  # fmt: skip
def test_good_values_pass_in_a_process_and_in_the_launcher(env) -> None:
    check_variables(env)
    launcher_env = {k: v for k, v in env.items() if k not in ("RANKWISE_SLOT",
                    "RANKWISE_INCARNATION", "RANKWISE_JOB_TOKEN")}  # fmt: skip
    check_variables(launcher_env, launching=env.get("RANKWISE_ON_FAILURE", "continue"))
