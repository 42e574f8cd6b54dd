"""Membership under ``--on-failure continue`` (rankwise.distributed.membership): survivors of a
SIGKILLed or SIGSTOPped rank keep their processes, agree on who is left and all-reduce in a
new gloo group; the refusals name their fix. The test process hosts the store, as the
launcher does."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from helpers.paths import SCRIPTS
from rankwise.distributed import DistributedConfigError
from rankwise.distributed.config import MemberConfig, on_failure_mode
from rankwise.distributed.membership import Membership, RegroupError, mark_dead
from rankwise.distributed.signing import SignedStore
from rankwise.testing import child_env, free_port

WORKER = SCRIPTS / "member_worker.py"


def test_mode_defaults_to_restart_and_refuses_continue_without_the_store():
    assert on_failure_mode({}) == "restart"
    assert MemberConfig.from_environment({}) is None
    with pytest.raises(DistributedConfigError, match="rankwise launch --nproc-per-node N"):
        on_failure_mode({"RANKWISE_ON_FAILURE": "continue", "TORCHELASTIC_RUN_ID": "x"})
    with pytest.raises(DistributedConfigError, match="'restart' or 'continue'"):
        on_failure_mode({"RANKWISE_ON_FAILURE": "carry-on"})


LAUNCHED = {
    "RANKWISE_ON_FAILURE": "continue", "RANKWISE_SLOT": "2", "WORLD_SIZE": "3",
    "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
}  # fmt: skip


def test_member_config_reads_the_launchers_variables():
    cfg = MemberConfig.from_environment({
        **LAUNCHED, "RANKWISE_INCARNATION": "1", "RANKWISE_MIN_NPROC": "2",
        "RANKWISE_STALE_S": "0.5", "RANKWISE_JOIN_CHECK_EVERY": "0",
        "DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": "60000", "RANKWISE_SETUP_TIMEOUT_S": "12.5",
    })  # fmt: skip
    assert cfg == MemberConfig(
        slot=2, world_size=3, host="10.0.0.1", port=29500, incarnation=1, min_nproc=2,
        collective_timeout_s=60.0, stale_s=0.5, setup_timeout_s=12.5, join_check_every=0,
    )  # fmt: skip
    defaults = MemberConfig.from_environment(LAUNCHED)
    assert defaults is not None
    assert (defaults.stale_s, defaults.setup_timeout_s, defaults.join_check_every) == (2.0, 30, 1)


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"RANKWISE_STALE_S": "0"}, "RANKWISE_STALE_S=0.0 is refused: the stale time must be > 0"),
        ({"RANKWISE_STALE_S": "soon"}, "RANKWISE_STALE_S='soon' is not a number"),
        ({"RANKWISE_SETUP_TIMEOUT_S": "0"}, "RANKWISE_SETUP_TIMEOUT_S=0.0 is refused: a "
         "generation's group needs more than 0 seconds"),
        ({"RANKWISE_JOIN_CHECK_EVERY": "-1"}, "RANKWISE_JOIN_CHECK_EVERY=-1 is refused"),
        ({"RANKWISE_JOIN_CHECK_EVERY": "often"}, "RANKWISE_JOIN_CHECK_EVERY='often' is not an"),
        ({"RANKWISE_SLOT": "3"}, "RANKWISE_SLOT=3 is refused: a slot is a rank of the launched "
         "world, 0..2"),
        ({"RANKWISE_MIN_NPROC": "4"}, "RANKWISE_MIN_NPROC=4 is refused: --min-nproc must be in"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is refused: a port is in 1..65535"),
        ({"DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": "0"}, "DISTRIBUTED_COLLECTIVE_TIMEOUT_MS=0 is "),
        ({"WORLD_SIZE": ""}, "WORLD_SIZE is not set, and RANKWISE_ON_FAILURE=continue needs it"),
        ({"RANKWISE_JOB_ID": "not-hex"}, "RANKWISE_JOB_ID='not-hex' is refused: the job's id is"),
    ],
)  # fmt: skip
def test_member_config_refuses_bad_variables(variables: dict[str, str], message: str):
    with pytest.raises(DistributedConfigError) as refused:
        MemberConfig.from_environment({**LAUNCHED, **variables})
    assert str(refused.value).startswith(message)


def read(out: Path, slot: int) -> list[dict]:
    path = out / f"slot{slot}.json"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def start(
    out: Path, world: int, port: int, extra: dict[str, str] | None = None,
    rounds: int = 1, own: dict[int, dict[str, str]] | None = None,
) -> list:  # fmt: skip
    """``world`` member_worker processes; ``own``: a slot's own extra variables."""
    procs = []
    for slot in range(world):
        env = child_env({
            "RANKWISE_ON_FAILURE": "continue", "RANKWISE_SLOT": str(slot),
            "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            **(extra or {}), **(own or {}).get(slot, {}),
        })  # fmt: skip
        command = [sys.executable, str(WORKER), str(out), str(rounds)]
        with open(out / f"slot{slot}.stderr", "w") as stderr:
            procs.append(subprocess.Popen(command, env=env, stderr=stderr))
    return procs


def host_store(port: int) -> dist.TCPStore:
    """The job's store, as `rankwise launch --on-failure continue` hosts it."""
    return dist.TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )


def signed(store: dist.TCPStore) -> SignedStore:
    """The store as the job's own processes write it (no secret given: an empty key)."""
    return SignedStore(store, "", "")


def members_of(store: dist.TCPStore, gen: int) -> str | None:
    """Generation ``gen``'s member list as its leader wrote it (``"0,1"``)."""
    value = signed(store).get(f"gen/{gen}/members")
    return None if value is None else value.partition(";")[0]


def reap(procs: list) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def wait_for(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_survivors_keep_their_pids_and_all_reduce_in_a_new_group(tmp_path, how):
    port = free_port()
    store = host_store(port)
    # A frozen rank is only noticed by the collective timeout: keep it short.
    extra = {"DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": "3000"} if how == "stop" else {}
    procs = start(tmp_path, 3, port, extra)
    try:
        wait_for(lambda: all(read(tmp_path, s) for s in range(3)), 120)
        first = [read(tmp_path, s)[0] for s in range(3)]
        assert [r["sum"] for r in first] == [6.0] * 3  # slots 0+1+2, plus one each
        os.kill(procs[2].pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        lost = time.time()
        for p in procs[:2]:
            assert p.wait(timeout=120) == 0
        for slot in (0, 1):
            before, after = read(tmp_path, slot)
            assert after["pid"] == before["pid"] == procs[slot].pid  # the same process
            assert (after["gen"], after["rank"], after["world"]) == (1, slot, 2)
            assert after["sum"] == 3.0  # slots 0 and 1 only
            limit = 30 if how == "kill" else 40  # generous: 2 shared cores
            assert after["noticed"] - lost < limit
        assert members_of(store, 1) == "0,1"
    finally:
        reap(procs)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["KILL", "STOP"])
@pytest.mark.parametrize("gen", [0, 1])
def test_a_member_lost_in_a_groups_set_up_costs_the_set_up_timeout_not_the_collectives(
    tmp_path, gen, how
):
    # The property: a member lost inside a generation's gloo set-up (after the member list
    # and its ready mark, where nobody watches heartbeats or dead marks) holds the others for
    # RANKWISE_SETUP_TIMEOUT_S (3 s here), never the collective timeout (60 s here; before,
    # the group was built under it: the survivors sat in the rendezvous for all of it). In
    # generation 0 (slot 2 lost there) the survivors form generation 1 without it; in a
    # regroup (slot 2 killed, then slot 1 lost in generation 1's set-up) the survivor goes on
    # alone in generation 2. A SIGSTOPped member is gone by its heartbeat, a killed one too.
    port = free_port()
    store = host_store(port)
    lost = 2 if gen == 0 else 1
    procs = start(
        tmp_path, 3, port,
        {"RANKWISE_SETUP_TIMEOUT_S": "3", "DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": "60000"},
        rounds=0 if gen == 0 else 1, own={lost: {"SETUP_FAULT": f"{gen}:{how}"}},
    )  # fmt: skip
    survivors = [0, 1] if gen == 0 else [0]
    try:
        if gen == 1:
            wait_for(lambda: all(read(tmp_path, s) for s in range(3)), 120)
            procs[2].kill()
        for slot in survivors:
            assert procs[slot].wait(timeout=120) == 0
        fault = float((tmp_path / f"fault-{lost}").read_text())
        for slot in survivors:
            last = read(tmp_path, slot)[-1]
            assert last["pid"] == procs[slot].pid  # the same process went on
            assert (last["gen"], last["world"]) == (gen + 1, len(survivors))
            assert last["sum"] == sum(s + 1 for s in survivors)
            done = last.get("regrouped", os.stat(tmp_path / f"slot{slot}.json").st_mtime)
            assert done - fault < 30, done - fault  # the set-up's 3 s, not the collective's 60
        assert members_of(store, gen + 1) == ",".join(map(str, survivors))
    finally:
        reap(procs)


@pytest.mark.timeout(180)
def test_a_first_group_that_cannot_form_with_everyone_alive_names_the_network(tmp_path):
    # Slot 1 is alive (its heartbeat beats) but reaches every set-up 1 s past four times the
    # 2 s set-up timeout: slot 0 gives generation 0 up, regroups, finds slot 1 there again,
    # tries once more under twice the time (4 s; a loaded machine), and then stops naming the
    # network and the setting instead of regrouping on (nobody was lost).
    port = free_port()
    store = host_store(port)  # noqa: F841 (hosted while the test runs)
    extra = {"RANKWISE_SETUP_TIMEOUT_S": "2", "DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": "60000"}
    procs = start(tmp_path, 2, port, extra, rounds=0, own={1: {"SETUP_FAULT": "0:SLOW"}})
    try:
        assert procs[0].wait(timeout=150) != 0
        error = (tmp_path / "slot0.stderr").read_text()
        assert ("RegroupError: generation 2's group (slots [0, 1]) did not form twice, within "
                "4 s the second time, although every member came back for it: gloo cannot "
                "connect them") in error  # fmt: skip
        assert "GLOO_SOCKET_IFNAME" in error and "RANKWISE_SETUP_TIMEOUT_S" in error
        assert error.count("did not form within") >= 2  # generations 0 and 1 were tried
        assert not read(tmp_path, 0)  # it never all-reduced
    finally:
        reap(procs)


@pytest.mark.parametrize("debug", ["OFF", "DETAIL"])  # DETAIL wraps gloo's backend
def test_a_group_gets_the_collective_timeout_once_it_stands(tmp_path, debug):
    # The other half: a generation built under the 3 s set-up timeout waits the whole
    # collective timeout (8 s here) in a collective, as the user asked (slot 1 all-reduces
    # nothing: it sleeps, then exits).
    port = free_port()
    store = host_store(port)  # noqa: F841 (hosted while the test runs)
    script = tmp_path / "wait.py"
    script.write_text(
        "import os, sys, time, torch, torch.distributed as dist\n"
        "from rankwise.distributed.config import MemberConfig\n"
        "from rankwise.distributed.membership import Membership\n"
        "m = Membership(MemberConfig.from_environment(), timeout_s=60)\n"
        "m.start()\n"
        "if dist.get_rank() == 1:\n"
        "    time.sleep(20)\n"
        "    os._exit(0)\n"
        "started = time.monotonic()\n"
        "try:\n"
        "    dist.all_reduce(torch.ones(1))\n"
        "except RuntimeError:\n"
        "    print(time.monotonic() - started)\n"
        "os._exit(0)\n"
    )
    env = {"RANKWISE_ON_FAILURE": "continue", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "RANKWISE_SETUP_TIMEOUT_S": "3",
           "DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": "8000", "TORCH_DISTRIBUTED_DEBUG": debug}  # fmt: skip
    procs = [
        subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                         env=child_env({**env, "RANKWISE_SLOT": str(slot)}))
        for slot in range(2)
    ]  # fmt: skip
    try:
        waited = float(procs[0].communicate(timeout=120)[0])
        assert 7.5 < waited < 19, waited  # the collective's 8 s, not the set-up's 3
    finally:
        reap(procs)


def test_init_refuses_continue_under_plain_torchrun(monkeypatch):
    import rankwise.distributed as rd

    for key, value in {
        "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "x",
        "RANKWISE_ON_FAILURE": "continue",
    }.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    with pytest.raises(DistributedConfigError, match="--on-failure continue"):
        rd.init()


@pytest.mark.timeout(180)
def test_a_rank_the_launcher_saw_die_is_gone_at_once(tmp_path):
    # A heartbeat would take 60 s to count as still: only the launcher's dead/<slot> mark
    # (mark_dead, which `rankwise launch` writes when it sees the process exit) can make the
    # survivors regroup sooner.
    port = free_port()
    store = host_store(port)
    procs = start(tmp_path, 3, port, {"RANKWISE_STALE_S": "60"})
    try:
        wait_for(lambda: all(read(tmp_path, s) for s in range(3)), 120)
        procs[2].kill()
        lost = time.time()
        procs[2].wait()
        mark_dead(signed(store), 2, 0)  # what the launcher does
        for p in procs[:2]:
            assert p.wait(timeout=120) == 0
        for slot in (0, 1):
            after = read(tmp_path, slot)[1]
            assert (after["gen"], after["world"], after["sum"]) == (1, 2, 3.0)
            assert after["regrouped"] - lost < 40  # well under the 60 s of the heartbeat
        assert members_of(store, 1) == "0,1"
    finally:
        reap(procs)


def test_a_dead_mark_of_an_older_incarnation_is_not_about_the_live_member(tmp_path):
    port = free_port()
    store = host_store(port)
    m = Membership(MemberConfig(slot=0, world_size=2, host="127.0.0.1", port=port), 10)
    # A TCPStore set awaits no reply: another client sees it a moment later.
    try:
        assert not m._marked_dead(1)
        signed(store).set("dead/1", "0")  # incarnation 0 of slot 1 exited, and was a member
        wait_for(lambda: m._marked_dead(1), 10)
        signed(store).set("member/1", "1")  # its restart joined: the old mark is not about it
        wait_for(lambda: m._int("member/1") == 1, 10)
        assert not m._marked_dead(1)
        mark_dead(signed(store), 1, 1)
        wait_for(lambda: m._marked_dead(1), 10)
    finally:
        m.close()


def test_an_arrived_member_is_never_counted_gone_whatever_its_heartbeat(tmp_path):
    # A survivor says it arrives before its slow unwrap (a full gc.collect holds the GIL, and
    # with it the heartbeat thread, for seconds on a loaded machine): the leader keeps it even
    # though its heartbeat stands still, and drops a member that neither arrived nor beats.
    port = free_port()
    store = host_store(port)
    cfg = MemberConfig(slot=0, world_size=3, host="127.0.0.1", port=port, stale_s=0.5)
    leader = Membership(cfg, 10)
    slow = Membership(dataclasses.replace(cfg, slot=1), 10)
    try:
        for m in (leader, slow):
            m.generation, m.members = 0, [0, 1, 2]
        slow.close()  # its heartbeat stands still from now on; slot 2 never beat at all
        slow.arrive()
        wait_for(lambda: leader._flag("gen/1/arrive/1"), 10)
        leader.arrive()
        leader._lead(1, expect_all=False)
        assert members_of(store, 1) == "0,1"
    finally:
        leader.close()


def test_a_joiner_stops_at_once_when_every_member_has_exited(tmp_path):
    # The survivors of a lost rank can all fail in turn (restarted as joiners themselves):
    # nobody is left to let a joiner in, and it says so instead of waiting out its timeout.
    port = free_port()
    store = host_store(port)
    cfg = MemberConfig(slot=0, world_size=2, host="127.0.0.1", port=port, incarnation=1)
    launcher = signed(store)
    launcher.set("gen/0/members", "0,1;")
    for slot in (0, 1):
        launcher.set(f"member/{slot}", "0")
    launcher.set("current", "0")
    mark_dead(launcher, 0, 0)
    joiner = Membership(cfg, 60)
    try:
        wait_for(lambda: joiner._flag("dead/0"), 10)  # a set reaches other clients a moment later
        started = time.monotonic()
        running = joiner._nobody_running()  # slot 1 still runs: it waits
        assert running is None
        mark_dead(launcher, 1, 0)
        with pytest.raises(RegroupError, match="every rank of generation 0 has exited"):
            joiner._request_join()
        assert time.monotonic() - started < 30  # not its 60 s timeout
    finally:
        joiner.close()
