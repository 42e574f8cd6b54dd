"""No one gets into a ``--on-failure continue`` job without its secret, and no store value
breaks it (issue 30): one process, a real ``TCPStore``, the real membership code, and a
stranger that knows only the store's port. A joiner's entry into gloo is left out (one
process holds one default group): ``_enter`` records the generation it was let into."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from rankwise.distributed.config import MemberConfig
from rankwise.distributed.membership import Membership, mark_dead
from rankwise.distributed.signing import NO_VALUE, SignedStore, read_raw
from rankwise.testing import free_port
from rankwise.testing.store_attacks import (
    StoreRecorder,
    VanishingStore,
    await_value,
    connect,
    protocol_keys,
    replay,
)

TOKEN, JOB = "ab" * 32, "cd" * 16


def host_store(port: int) -> dist.TCPStore:
    return dist.TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )


def member(
    port: int, slot: int, incarnation: int = 0, token: str = TOKEN, timeout_s: float = 60
) -> Membership:
    cfg = MemberConfig(
        slot=slot, world_size=3, host="127.0.0.1", port=port, incarnation=incarnation,
        job_token=token, job_id=JOB, stale_s=0.5,
    )  # fmt: skip
    m = Membership(cfg, timeout_s)
    m._enter = lambda gen, members: setattr(m, "entered", gen)  # type: ignore[method-assign]
    return m


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def regroup(leader: Membership, grow: bool) -> list[int]:
    """The leader builds its next generation (alone: the others' arrival is not waited for
    beyond their dead marks) and enters it."""
    nxt = leader.generation + 1
    for s in leader.members:  # the live members arrive (the leader's own connection writes)
        if not leader._marked_dead(s):
            leader.signed.set(f"gen/{nxt}/arrive/{s}", "1")
    leader._lead(nxt, expect_all=grow)
    members = leader._read_members(nxt)
    leader.generation, leader.members = nxt, members
    return members


def join(leader: Membership, joiner: Membership) -> int:
    """A legitimate join: the joiner asks and answers, the leader lets it in at a boundary."""
    thread = threading.Thread(target=joiner._request_join, daemon=True)
    thread.start()
    wait_for(lambda: joiner.cfg.slot in leader.joiners())
    regroup(leader, grow=True)
    thread.join(60)  # generous on a loaded machine; a joiner never let in still fails
    assert getattr(joiner, "entered", None) == leader.generation
    joiner.signed.set(f"member/{joiner.cfg.slot}", str(joiner.cfg.incarnation))  # as _enter
    return leader.generation


@pytest.mark.timeout(120)
def test_a_replayed_proof_never_admits_a_stranger() -> None:
    # Issue 30: slot 1 comes back once and dies again with no restarts left; a stranger who
    # recorded every value of the store meanwhile writes them back (dead and member marks as
    # before its restart, its join request, challenge and proof), deletes its admit mark and
    # asks again. Before: the leader re-read the stale proof and let it in.
    port = free_port()
    store = host_store(port)
    launcher = SignedStore(store, TOKEN, JOB)
    leader = member(port, 0)
    recorder = StoreRecorder("127.0.0.1", port, protocol_keys(2)).start()
    try:
        leader.generation, leader.members = 0, [0, 1]
        launcher.set("member/1", "0")
        mark_dead(launcher, 1, 0)
        assert regroup(leader, grow=False) == [0]
        joiner = member(port, 1, incarnation=1)
        join(leader, joiner)
        assert leader.members == [0, 1]
        joiner.close()
        mark_dead(launcher, 1, 1)  # dead again; no restart left
        wait_for(lambda: leader._marked_dead(1))
        assert regroup(leader, grow=False) == [0]
        recorded = recorder.stop()
        assert recorded.get("dead/1") and recorded.get("waiting")  # it saw the whole join
        stranger = connect("127.0.0.1", port)
        replay(stranger, recorded, slot=1, incarnation=1)
        wait_for(lambda: 1 in leader._listed())
        for _ in range(10):  # boundaries: the leader looks for joiners at each
            assert leader.joiners() == []
            time.sleep(0.05)
        assert regroup(leader, grow=True) == [0]
        assert not stranger.check(["admit/1/1"])
    finally:
        recorder.stop()
        leader.close()


@pytest.mark.timeout(60)
def test_a_wrong_secret_is_refused_and_never_let_in(capsys) -> None:
    # A process given another secret (a node with another --job-token-file) answers the
    # challenge with a well-formed but wrong proof: refused, taken off the list, never let in.
    port = free_port()
    store = host_store(port)  # noqa: F841 (kept: the store lives as long as it)
    leader = member(port, 0)
    leader.generation, leader.members = 0, [0]
    wrong = member(port, 1, incarnation=1, token="ef" * 32, timeout_s=3)
    errors: list[BaseException] = []
    thread = threading.Thread(target=_capture, args=(wrong._request_join, errors), daemon=True)
    thread.start()
    try:
        wait_for(lambda: leader._listed() == [1])
        wait_for(lambda: not leader.joiners() and leader._listed() == [])  # refused, taken off
        assert regroup(leader, grow=True) == [0]
        thread.join(60)  # its refusal ends the thread
        assert getattr(wrong, "entered", None) is None
        assert errors and "its RANKWISE_JOB_TOKEN must be the job's" in str(errors[0])
    finally:
        leader.close()
        wrong.close()
    err = capsys.readouterr().err
    assert "refused a request to join as slot 1 (restart 1): it does not prove the job's" in err


def _capture(fn, errors: list[BaseException]) -> None:
    try:
        fn()
    except BaseException as exc:
        errors.append(exc)


# -- one write does no outsized damage ---------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("garbage", ["x", *NO_VALUE], ids=["x", "no-value-1", "no-value-2"])
def test_garbage_on_the_waiting_list_is_ignored_naming_the_key(capsys, garbage: str) -> None:
    # Issue 30: waiting="x" made every rank raise ValueError at its next boundary. And the
    # sentinels of read_raw's one-request read: a key holding one was read as absent, so the
    # waiting list's compare-and-set never matched and no joiner could ever be let in.
    port = free_port()
    store = host_store(port)
    leader = member(port, 0)
    leader.generation, leader.members = 0, [0]
    try:
        store.set("waiting", garbage)
        wait_for(lambda: leader.signed.raw("waiting") == garbage.encode())
        assert leader.joiners() == [] and leader.joiners() == []
        joiner = member(port, 2, incarnation=1)
        assert join(leader, joiner) == 1  # the garbage is replaced by the next request
    finally:
        leader.close()
    err = capsys.readouterr().err
    assert err.count("ignored the value of the store key 'waiting' (not a list of slots") == 1


class CheckThenGet(SignedStore):
    """The reads as they were (``check``, then ``get``): right on a store where no key
    vanishes, so what every reader must answer, read another way than ``read_raw``."""

    def raw(self, key: str) -> bytes | None:
        return self.store.get(key) if self.store.check([key]) else None


READS = {
    "raw": lambda s, k: s.raw(k),
    "get": lambda s, k: s.get(k),
    "get_int": lambda s, k: s.get_int(k),
    "get_slots": lambda s, k: s.get_slots(k),
    "has": lambda s, k: s.has(k),
    "plain": lambda s, k: s.plain(k, lambda text: text, "text"),
    "claim": lambda s, k: s.claim(k, "7"),
}


@pytest.mark.parametrize("read", sorted(READS))
@pytest.mark.parametrize("value", [None, "7", "0,2", "garbage"])
def test_no_read_of_the_store_waits_for_a_key_deleted_meanwhile(read: str, value) -> None:
    # A key deleted between a reader's check and its get held the reader (a member at a step
    # boundary, the launcher) for the store's whole timeout: SignedStore read check-then-get.
    # Every reader, on a key set (signed or not) or not, reads without a get that can wait.
    store = VanishingStore()
    signed = SignedStore(store, TOKEN, JOB)
    reference = CheckThenGet(dist.HashStore(), TOKEN, JOB)  # the same writes, keys kept
    for key, unsigned in [("signed", False), ("unsigned", True)]:
        if value is not None:
            for wrapped in (signed, reference):
                (wrapped.store if unsigned else wrapped).set(key, value)
        assert READS[read](signed, key) == READS[read](reference, key), (read, key, value)
    assert store.waits == []


@pytest.mark.parametrize("libuv", [True, False], ids=["libuv", "classic"])
def test_read_raw_on_a_real_store_never_creates_a_key_and_reads_its_sentinels(libuv: bool):
    # read_raw leans on TCPStore's compare_set of a missing key (both servers): the sentinel
    # comes back and the key stays missing; a key holding a sentinel reads as what it holds.
    store = dist.TCPStore(
        "127.0.0.1", free_port(), is_master=True, wait_for_workers=False,
        timeout=timedelta(seconds=30), use_libuv=libuv,
    )  # fmt: skip
    started = time.monotonic()
    assert read_raw(store, "nothing") is None and not store.check(["nothing"])
    assert time.monotonic() - started < 5  # not the 30 s a get of a missing key waits
    for value in [b"", b"v", *(sentinel.encode() for sentinel in NO_VALUE)]:
        store.set("k", value)
        assert read_raw(store, "k") == value
    signed = SignedStore(store, TOKEN, JOB)
    assert signed.claim("k", "mine") == "mine" and signed.get("k") == "mine"  # replaced


def test_a_reader_wakes_the_waiters_of_a_missing_key_and_await_value_is_not_fooled() -> None:
    # On torch's libuv server, read_raw's compare_set of a missing key wakes a client that
    # waits for the key; the key is still missing. So nobody waits for a protocol key: a test's
    # stranger that did (wait, then get) answered a challenge it never read (CI, loaded).
    # await_value polls instead and gives the value that is set later.
    port = free_port()
    server = dist.TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False,
        timeout=timedelta(seconds=30), use_libuv=True,
    )  # fmt: skip
    waiter, poller = connect("127.0.0.1", port), connect("127.0.0.1", port)
    woke: list[float] = []
    polled: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: (waiter.wait(["k"]), woke.append(time.monotonic()))),
        threading.Thread(target=lambda: polled.append(await_value(poller, "k", 30))),
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    assert read_raw(server, "k") is None  # a member's read of a key not set yet
    time.sleep(1.0)
    set_at = time.monotonic()
    server.set("k", "the challenge|mac")
    for thread in threads:
        thread.join(30)
    assert woke and woke[0] < set_at  # woken by the read, before the key was set
    assert polled == [b"the challenge|mac"]


# -- the protocol against a model, with a stranger on the store --------------------------------

SLOTS = (1, 2)  # slot 0 leads throughout; these die and come back
GARBAGE = st.one_of(
    st.binary(max_size=40),
    st.sampled_from(
        [b"x", b"99", b"-1", b"0,1,2", b"1,2;", b"9;9", b"1|" + b"0" * 64]
        + [sentinel.encode() for sentinel in NO_VALUE]
    ),
)


class AdmissionMachine(RuleBasedStateMachine):
    """Slots 1 and 2 die (the launcher's dead mark) and come back as new incarnations that
    prove the secret; a stranger replays anything it recorded, writes garbage to any
    protocol key and deletes keys. The leader's member list always equals the model's, no
    incarnation is let in that did not ask with the secret, and no value makes it raise."""

    def __init__(self) -> None:
        super().__init__()
        self.port = free_port()
        self.store = host_store(self.port)
        self.launcher = SignedStore(self.store, TOKEN, JOB)
        self.leader = member(self.port, 0)
        self.leader.generation, self.leader.members = 0, [0, *SLOTS]
        for s in SLOTS:
            self.launcher.set(f"member/{s}", "0")
        self.incarnation = dict.fromkeys(SLOTS, 0)
        self.alive = set(SLOTS)
        self.stranger = connect("127.0.0.1", self.port)
        self.recorder = StoreRecorder("127.0.0.1", self.port, protocol_keys(3, 12, 8))
        self.joiners: list[Membership] = []

    def teardown(self) -> None:
        for m in [self.leader, *self.joiners]:
            m.close()

    @initialize()
    def a_slot_came_back_once_and_died_again(self) -> None:
        # What the stranger replays: a whole join, recorded (issue 30's finding).
        self._kill(1)
        self._come_back(1)
        self._kill(1)

    @precondition(lambda self: self.alive)
    @rule(data=st.data())
    def kill(self, data: st.DataObject) -> None:
        self._kill(data.draw(st.sampled_from(sorted(self.alive))))

    def _kill(self, slot: int) -> None:
        mark_dead(self.launcher, slot, self.incarnation[slot])
        wait_for(lambda: self.leader._marked_dead(slot))
        self.alive.discard(slot)
        self.recorder.snapshot()
        assert regroup(self.leader, grow=False) == sorted({0} | self.alive)

    @precondition(lambda self: len(self.alive) < len(SLOTS))
    @rule(data=st.data())
    def come_back(self, data: st.DataObject) -> None:
        self._come_back(data.draw(st.sampled_from(sorted(set(SLOTS) - self.alive))))

    def _come_back(self, slot: int) -> None:
        self.incarnation[slot] += 1
        joiner = member(self.port, slot, incarnation=self.incarnation[slot])
        self.joiners.append(joiner)
        thread = threading.Thread(target=joiner._request_join, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while slot not in self.leader.joiners():  # snapshots: the stranger sees everything
            self.recorder.snapshot()
            assert time.monotonic() < deadline, "a legitimate joiner was not let in"
            time.sleep(0.02)
        self.recorder.snapshot()
        regroup(self.leader, grow=True)
        # Generous: on a loaded machine (CI runs three test processes on two cores) the
        # joiner's gloo set-up once took longer than 10 s; a joiner never let in still fails.
        thread.join(60)
        assert not thread.is_alive(), "the joiner let in did not enter within 60 s"
        assert getattr(joiner, "entered", None) == self.leader.generation
        joiner.signed.set(f"member/{slot}", str(self.incarnation[slot]))
        self.alive.add(slot)
        self.recorder.snapshot()

    @precondition(lambda self: len(self.alive) < len(SLOTS))
    @rule(data=st.data())
    def replay_a_dead_incarnation(self, data: st.DataObject) -> None:
        slot = data.draw(st.sampled_from(sorted(set(SLOTS) - self.alive)))
        newest = self.incarnation[slot]  # the one that came in last: its proof was seen
        inc = data.draw(st.sampled_from([newest, newest, *range(newest)]))
        roll_back = data.draw(st.booleans())
        replay(self.stranger, self.recorder.values, slot, inc, roll_back=roll_back)
        self._boundaries()
        self._restore(slot)

    @rule(key=st.sampled_from(protocol_keys(3, 4, 3)), value=GARBAGE, delete=st.booleans())
    def garbage(self, key: str, value: bytes, delete: bool) -> None:
        if delete:
            self.stranger.delete_key(key)
        else:
            self.stranger.set(key, value)
        self._boundaries()
        slot = next((s for s in SLOTS if key.endswith(f"/{s}")), None)
        if slot is not None:
            self._restore(slot)

    def _boundaries(self) -> None:
        """A few step boundaries and a grow: whatever the stranger did, nobody new comes in."""
        time.sleep(0.05)  # its writes land
        for _ in range(3):
            assert self.leader.joiners() == []  # no legitimate joiner waits now
            time.sleep(0.02)
        if not set(SLOTS) - self.alive:
            return
        before = set(self.leader.members)
        assert set(regroup(self.leader, grow=True)) == before

    def _restore(self, slot: int) -> None:
        """The launcher's and the members' own marks of ``slot`` as they were (the stranger
        may have deleted them: later kills need them)."""
        self.stranger.delete_key("waiting")
        self.launcher.set(f"member/{slot}", str(self.incarnation[slot]))
        if slot not in self.alive:
            mark_dead(self.launcher, slot, self.incarnation[slot])

    @invariant()
    def members_are_the_model(self) -> None:
        assert self.leader.members == sorted({0} | self.alive)


AdmissionMachine.TestCase.settings = settings(
    max_examples=8, stateful_step_count=8, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
test_admission_against_a_model = pytest.mark.timeout(300)(AdmissionMachine.TestCase)
