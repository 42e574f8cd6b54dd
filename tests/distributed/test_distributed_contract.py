"""Continue mode's contract (rankwise.distributed.contract): what the launcher writes is what
each process reads. No processes: the launcher's environment goes through the member's own
reader (MemberConfig.from_environment) and its up-front check, and the store's keys are the
ones the protocol's attack tests enumerate."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from rankwise.distributed import contract
from rankwise.distributed.config import MemberConfig, check_variables
from rankwise.distributed.contract import Keys, every_key, member_environment

TOKEN, JOB = "ab" * 16, "cd" * 16


@st.composite
def _launches(draw: st.DrawFn) -> dict[str, int]:
    nnodes, nproc = draw(st.integers(1, 4)), draw(st.integers(1, 8))
    node = draw(st.integers(0, nnodes - 1))
    return {
        "nnodes": nnodes,
        "nproc": nproc,
        "node": node,
        "slot": node * nproc + draw(st.integers(0, nproc - 1)),
        "incarnation": draw(st.integers(0, 50)),
        "min_nproc": draw(st.integers(1, nnodes * nproc)),
        "restarts": draw(st.integers(0, 3)),
        "port": draw(st.integers(1, 65535)),
    }


@settings(max_examples=60, deadline=None)
@given(launch=_launches(), user_join=st.sampled_from(["", "0", "7"]))
def test_what_the_launcher_writes_each_process_reads_back(launch, user_join) -> None:
    inherited = {"PATH": "/bin", "RANKWISE_JOIN_CHECK_EVERY": user_join} if user_join else {}
    env = member_environment(inherited, host="10.0.0.1", job_token=TOKEN, job_id=JOB, **launch)
    check_variables(env)  # the process's own check of every variable passes
    cfg = MemberConfig.from_environment(env)
    assert cfg is not None
    assert (cfg.slot, cfg.incarnation) == (launch["slot"], launch["incarnation"])
    assert cfg.world_size == launch["nnodes"] * launch["nproc"]
    assert cfg.nnodes == launch["nnodes"]
    assert (cfg.host, cfg.port) == ("10.0.0.1", launch["port"])
    assert (cfg.min_nproc, cfg.job_token, cfg.job_id) == (launch["min_nproc"], TOKEN, JOB)
    # the user's value passes through; else every step, or never without restarts
    default = 1 if launch["restarts"] else 0
    assert cfg.join_check_every == (int(user_join) if user_join else default)
    local = launch["slot"] - launch["node"] * launch["nproc"]
    assert (env["RANK"], env["LOCAL_RANK"]) == (str(launch["slot"]), str(local))
    assert env.get("PATH") == inherited.get("PATH")  # the launcher's own environment goes on


def test_every_variable_a_member_reads_of_the_launcher_is_one_it_writes() -> None:
    env = member_environment(
        {}, slot=0, incarnation=0, node=0, nproc=2, nnodes=1, host="127.0.0.1", port=1,
        min_nproc=1, restarts=1, job_token=TOKEN, job_id=JOB,
    )  # fmt: skip
    written = set(env)
    assert set(contract.launcher_variables()) <= written
    assert set(contract.MEMBER_ENV_VARS.values()) - written == {
        contract.STALE_S,
        contract.SETUP_TIMEOUT_S,
        contract.COLLECTIVE_TIMEOUT_MS,  # the user's own, left unset
    }


def test_every_key_is_the_contracts_spelling_and_unique() -> None:
    keys = every_key(3, generations=2, incarnations=2, nnodes=2)
    assert len(keys) == len(set(keys))
    spelt = {
        Keys.members(1), Keys.leader(0), Keys.arrive(1, 2), Keys.ready(0, 1), Keys.join(2),
        Keys.challenge(1, 1), Keys.proof(0, 1), Keys.refused(2, 0), Keys.admit(1, 0),
        Keys.exit(2, 1), Keys.joinbeat(0), Keys.heartbeat(1), Keys.member(2), Keys.dead(0),
        Keys.launcher_done(1), Keys.launcher_heartbeat(0), Keys.launcher_claim(1),
        Keys.CURRENT, Keys.WAITING, Keys.STOPPED, Keys.FINISHED, Keys.LAUNCH_FINISHED,
        Keys.JOB_ID,
    }  # fmt: skip
    assert spelt <= set(keys)  # the attack tests reach every key the protocol uses
    # every key function of Keys is listed above (a new key joins every_key and this list)
    functions = {n for n, v in vars(Keys).items() if isinstance(v, staticmethod)} - {"group"}
    assert len(functions) == 17
    # the module doc's table names every kind of key
    for key in keys:
        kind = re.sub(r"/\d+", "/<>", key)
        shown = re.sub(r"<[a-z]>", "<>", contract.__doc__ or "")
        assert kind in shown, kind
