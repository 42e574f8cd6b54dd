"""Who is still there: regrouping the survivors of a lost rank without restarting them.

One concept, the membership protocol on the job's store: generations, arrivals, and the
admission of joiners (challenge and proof), which decide together who is in, and the bounded
entry into each generation's group; past 600 lines since every value is signed and
re-asserted against a store client (issue 30) and every wait, gloo's set-up included, is
bounded by what it watches.

Under ``rankwise launch --on-failure continue`` the launcher hosts one ``TCPStore`` for the
whole job (so any rank may die and the store lives on) and gives every process a *slot* (its
first rank). Membership moves in *generations*: generation 0 is the launched world; each
regroup writes generation ``g+1`` under its own keys and builds a fresh gloo group on
``PrefixStore("gen/<g+1>/pg", store)``, so nothing of the broken group is ever read again.
The store's keys (``current``, ``gen/<g>/members``, ``dead/<s>``, ...) and what each holds
are listed once, in :mod:`rankwise.distributed.contract` (:class:`~rankwise.distributed.contract.Keys`
spells them for both the members and the launcher).

Every value but the join request's (``waiting``, ``join/<s>``, ``proof/<s>/<i>``) is signed
with the job's secret (:mod:`rankwise.distributed.signing`) and checked where it is read: a
value anyone else wrote, or garbage, is ignored with one warning naming its key, never a
crash. The store itself is not authenticated, so nothing is decided from an unsigned value:
a request only asks for a challenge, and only the proof over that challenge lets it in.

Who is still there is decided by the leader alone and read by everyone, so survivors always
agree: it waits until every member of the old generation has arrived, is marked dead by the
launcher (``dead/<s>`` at or past ``member/<s>``: the launcher polls its children every 0.1 s,
so a SIGKILLed rank is known gone at once), or has a heartbeat that stood still for ``stale_s``
(a SIGSTOPped process bumps nothing, and is still running for the launcher). So a dead rank
costs the regroup about 0.1 s, a frozen one ``stale_s`` after the collective timeout, and a
growing world no wait at all.

Who may join: a restarted process proves the job's secret (``RANKWISE_JOB_TOKEN``, which its
launcher made or read from ``--job-token-file``; never written to the store). For each request
a member sets a fresh random challenge (``challenge/<s>/<i>``, signed, naming the generation it
was set in); the joiner answers with an HMAC over the job's id, its slot, its incarnation, that
generation and the challenge; the leader of the generation that lets it in checks the answer
against the challenge of its own generation and deletes both. A request whose incarnation is
at or below the slot's newest member (``member/<s>``) is a replay: refused. A wrong answer is
refused too, taken off the list, and the job goes on (:meth:`Membership.joiners`).

Generation 0 forms the same way: its leader waits for every slot to arrive, or to be marked
dead by the launcher (a rank that crashed in its set-up), up to the rendezvous timeout; a slot
that was not there then (its process crashed, or was too slow) comes back as any joiner.

A restarted slot first runs alone (:attr:`Membership.pending`: a world of one, so the
script's set-up needs nobody, and it is not the master: ``rd.is_joining()``) and asks to come
in with :meth:`Membership.join` once it is ready to train; the live members let it in at a
step boundary they agree on (``regroup(grow=True)``), and a live peer sends it the training
state. Only live joiners are let in (not marked dead by the launcher), and every member
waits for each joiner to reach the new group (``gen/<g>/ready/<s>``) while watching its dead
mark and its heartbeat, so a joiner lost on the way in costs a recovery
(:class:`JoinerLostError`, a lost peer), not the collective timeout.

Teardown never waits for the broken group: see :func:`rankwise.distributed.retire.retire_groups`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from rankwise.distributed.config import MemberConfig
from rankwise.distributed.contract import Keys
from rankwise.distributed.errors import DistributedConnectionError, PeerLostError, first_line
from rankwise.distributed.finish import mark_finished
from rankwise.distributed.retire import retire_groups
from rankwise.distributed.signing import SignedStore, parse_count, parse_slots

__all__ = [
    "GroupSetupError",
    "JoinerLostError",
    "Membership",
    "RegroupError",
    "RemovedError",
    "check_min_nproc",
    "mark_dead",
    "parse_members",
]


class RegroupError(RuntimeError):
    """The survivors cannot go on (too few left, the store host gone); the message says why."""


class RemovedError(RegroupError):
    """This process was left out of the new generation (it was frozen or too late)."""


class JoinerLostError(PeerLostError):
    """A joiner let into the new generation died or froze before it reached the group: the
    members recover as from any lost peer (:func:`rankwise.distributed.classify`)."""


class GroupSetupError(PeerLostError):
    """A generation's gloo group did not form within ``RANKWISE_SETUP_TIMEOUT_S``: a member
    or joiner was lost inside its set-up, where nobody watches heartbeats. The members
    regroup without it, as from any lost peer."""


def set_group_timeout(timeout: timedelta) -> None:
    """Give the default group's gloo backend ``timeout`` for every collective from now on
    (what torch's ``_set_pg_timeout`` does, also where ``TORCH_DISTRIBUTED_DEBUG=DETAIL``
    wraps the backend, which that function skips), and check that it took."""
    import torch

    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    gloo = getattr(backend, "wrapped_pg", backend)  # DETAIL's _ProcessGroupWrapper
    gloo._set_default_timeout(timeout)
    if gloo.options._timeout != timeout:
        raise RuntimeError(
            f"could not give the gloo group its collective timeout ({timeout}): its backend "
            f"({type(backend).__name__}) kept {gloo.options._timeout}; this torch "
            f"({torch.__version__}) changed how a group's timeout is set. Unset "
            "TORCH_DISTRIBUTED_DEBUG, or use the torch version the constraints pin."
        )


def check_min_nproc(members: list[int], min_nproc: int) -> None:
    """Refuse a generation of fewer than ``--min-nproc`` members (``members``: their slots)."""
    if len(members) < min_nproc:
        raise RegroupError(
            f"only {len(members)} rank(s) left (slots {members}) and --min-nproc is "
            f"{min_nproc}: the job stops. Raise --max-restarts so lost ranks come back, or "
            "lower --min-nproc."
        )


def mark_dead(store: SignedStore, slot: int, incarnation: int) -> None:
    """The launcher saw ``incarnation`` of ``slot`` exit: a regroup's leader counts it gone at
    once instead of waiting ``stale_s`` for its heartbeat to stand still (``store``: the job's
    store, signed with the job's secret)."""
    store.set(Keys.dead(slot), str(incarnation))


def join_proof(secret: str, job: str, slot: int, incarnation: int, gen: int, nonce: str) -> str:
    """A joiner's answer to the challenge ``nonce`` (set in generation ``gen``): an HMAC-SHA256
    with the job's secret over everything the answer is good for, and nothing else."""
    message = f"rankwise-join-v1\0{job}\0{slot}\0{incarnation}\0{gen}\0{nonce}".encode()
    return hmac.new(bytes.fromhex(secret), message, hashlib.sha256).hexdigest()


def _parse_challenge(text: str) -> tuple[int, str] | None:
    gen, _, nonce = text.partition(":")
    if parse_count(gen) is None or len(nonce) != 32 or not _is_hex(nonce):
        return None
    return int(gen), nonce


def _parse_proof(text: str) -> tuple[int, str, str] | None:
    head, _, mac = text.rpartition(":")
    challenge = _parse_challenge(head)
    if challenge is None or len(mac) != 64 or not _is_hex(mac):
        return None
    return (*challenge, mac)


def parse_members(text: str) -> tuple[list[int], list[int], dict[int, int]] | None:
    """``"0,1,2;2;1"``: the members, the slots let in, and the incarnation of each let in."""
    members, semi, rest = text.partition(";")
    joined, _, incs = rest.partition(";")
    got, let_in, restarts = parse_slots(members), parse_slots(joined), parse_slots(incs)
    if not semi or got is None or let_in is None or not set(let_in) <= set(got):
        return None
    if restarts is None or len(restarts) not in (0, len(let_in)):
        return None
    return got, let_in, dict(zip(let_in, restarts, strict=False))


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


class Membership:
    """This process's place in the job's generations; builds each generation's gloo group.

    Under the launcher, :func:`rankwise.distributed.init` builds it (``rd.membership()``)::

        m = Membership(MemberConfig(slot=1, world_size=3, host="127.0.0.1", port=29500))
        m.start()    # generation 0 (or, after a restart, wait to be let in)
        m.regroup()  # after a failed collective: the survivors' new group
    """

    def __init__(self, cfg: MemberConfig, timeout_s: float = 60.0) -> None:
        self.cfg = cfg
        self.timeout_s = timeout_s
        self.generation = -1
        self.members: list[int] = []
        self.joined: list[int] = []  # the slots the current generation let in
        self._joined_incs: dict[int, int] = {}  # and the incarnation of each
        self.history: dict[int, list[int]] = {}  # generation -> members, those this one entered
        # A restarted slot runs alone until join(), and bumps no heartbeat meanwhile: hb/<slot>
        # is its lost predecessor's, which the survivors' leader must see stand still.
        self.pending = cfg.incarnation > 0
        self.store = self._connect()
        self.signed = SignedStore(self.store, cfg.job_token, cfg.job_id)
        self._beats = SignedStore(self._connect(), cfg.job_token, cfg.job_id)  # its own line
        self._answered = ""  # the last challenge this joiner answered
        self._ready = ""  # the ready mark of the group this joiner is entering now
        # The set-ups that failed in a row (GroupSetupError): their members, the time they
        # were given, what torch said
        self._failed_setups: list[tuple[list[int], float, str]] = []
        self._published: tuple[int, str] | None = None  # the newest member list it wrote
        self._finished = False  # this rank's training finished (record_finished)
        self._refused: set[tuple[int, int]] = set()  # (slot, incarnation) refused and said
        self._stop = threading.Event()
        threading.Thread(target=self._heartbeat, name="rankwise-heartbeat", daemon=True).start()

    # -- queries --------------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.members.index(self.cfg.slot)

    @property
    def world_size(self) -> int:
        return len(self.members)

    def joiners(self) -> list[int]:
        """Slots of restarted processes waiting to come in that proved the job's secret over
        a fresh challenge and are alive as far as the launcher knows (a joiner that died or
        gave up while waiting is marked dead: never let in). A member calling it sets the
        challenge of a request that has none for this generation yet (it is let in at a later
        boundary, once answered). A wrong answer or a replayed request is refused here and
        taken off the list."""
        ready, refused = [], []
        for s in self._listed():
            verdict = self._judge(s)
            if verdict == "ready":
                ready.append(s)
            elif verdict == "refused":
                refused.append(s)
        if refused:
            self._take_off_waiting(refused)
        return ready

    def _listed(self) -> list[int]:
        waiting = self._read(self.signed.plain, Keys.WAITING, parse_slots, "not a list of slots")
        return sorted(set(waiting or []))

    def _request(self, slot: int) -> int | None:
        """The incarnation of ``slot`` that asks to join (None: no readable request)."""
        return self._read(self.signed.plain, Keys.join(slot), parse_count, "not a restart count")

    def _joiner_dead(self, slot: int, inc: int | None = None) -> bool:
        """Whether the launcher saw the incarnation of ``slot`` that asked to join exit
        (``inc``: the one let in; else the one the unsigned request names)."""
        dead = self._int(Keys.dead(slot))
        inc = self._request(slot) if inc is None else inc
        # An unreadable request (a store client's garbage) says nothing: not dead.
        return dead is not None and inc is not None and dead >= inc

    def _judge(self, slot: int) -> str:
        """``ready``, ``refused``, ``dead`` or ``asked`` (challenged, no answer yet)."""
        inc = self._request(slot)
        if inc is None:
            return "asked"
        entered = self._int(Keys.member(slot))
        if entered is not None and inc <= entered:
            self._refuse(slot, inc, f"restart {inc} of slot {slot} is not newer than the one "
                         f"that came in before (restart {entered}): a replayed request")  # fmt: skip
            return "refused"
        if self._joiner_dead(slot):
            return "dead"
        key = Keys.challenge(slot, inc)
        challenge = self._read(self.signed.get, key)
        parsed = None if challenge is None else _parse_challenge(challenge)
        if parsed is None or parsed[0] != self.generation:
            fresh = f"{self.generation}:{secrets.token_hex(16)}"
            if parsed is None:  # the first member to set one wins
                self._call(self.signed.claim, key, fresh)
            else:  # set in an older generation: a fresh one for this generation
                self._call(self.signed.set, key, fresh)
            return "asked"
        gen, nonce = parsed
        answer = self._read(
            self.signed.plain, Keys.proof(slot, inc), _parse_proof, "not an answer to a challenge"
        )  # garbage there is ignored (warned): the joiner's own answer replaces it
        if answer is None:
            return "asked"
        if answer[:2] != (gen, nonce):
            return "asked"  # an answer to an older challenge: the joiner answers this one next
        expected = join_proof(self.cfg.job_token, self.cfg.job_id, slot, inc, gen, nonce)
        if not hmac.compare_digest(answer[2], expected):
            self._refuse(slot, inc, "it does not prove the job's secret")
            return "refused"
        return "ready"

    def _refuse(self, slot: int, inc: int, why: str) -> None:
        self._call(self.signed.set, Keys.refused(slot, inc), why)
        if (slot, inc) in self._refused:
            return  # said once: a store client asking again and again floods no log
        self._refused.add((slot, inc))
        print(
            f"rankwise: refused a request to join as slot {slot} (restart {inc}): {why} "
            "(RANKWISE_JOB_TOKEN, from the launcher or --job-token-file). The job goes on "
            "without it. A rank of this job's own needs the same --job-token-file as the other "
            "nodes.",
            file=sys.stderr,
            flush=True,
        )

    def stop(self, why: str) -> None:
        """The members stop the job (an error every rank raises): a joiner waiting now, or
        started later, gives up at once naming ``why`` instead of waiting to be let in."""
        with contextlib.suppress(Exception):  # the store host is gone: nobody joins anyway
            self.signed.set(Keys.STOPPED, why)

    def _take_off_waiting(self, slots: list[int]) -> None:
        self._edit_waiting(lambda listed: [s for s in listed if s not in slots])

    def _edit_waiting(self, edit: Callable[[list[int]], list[int]]) -> None:
        """Rewrite the waiting list with ``edit`` (compare_set in a loop: one may have been
        added since); garbage there counts as an empty list and is replaced."""
        for _ in range(100):
            raw = self._read(self.signed.raw, Keys.WAITING)
            text = "" if raw is None else raw.decode(errors="replace")
            listed = parse_slots(text) if raw is not None else []
            new = ",".join(map(str, edit(listed or [])))
            expected: Any = "" if raw is None else raw  # torch takes bytes too
            if self._call(self.store.compare_set, Keys.WAITING, expected, new) == new.encode():
                return

    # -- generations ----------------------------------------------------------------------------

    def start(self) -> None:
        """Generation 0 for a first start (from whoever arrives: see the module doc); a
        restarted slot, or one that came after generation 0 formed, runs alone until
        :meth:`join`."""
        if self.cfg.incarnation == 0 and self._int(Keys.CURRENT) is None:
            self.arrive()
            if self._leads(0):
                self._lead_first()
            members = self._read_members(0)
            if self.cfg.slot in members:
                check_min_nproc(members, self.cfg.min_nproc)
                self._form_first(members)
                return
        self.pending, self.members = True, [self.cfg.slot]
        dist.init_process_group(
            "gloo", store=dist.HashStore(), rank=0, world_size=1,
            timeout=timedelta(seconds=self.cfg.collective_timeout_s),
        )  # fmt: skip

    def _form_first(self, members: list[int]) -> None:
        """Enter generation 0; where a member was lost in its set-up (nobody has trained
        yet: nothing to recover), the others form the next generation without it, until a
        group stands (or :meth:`_enter` finds the same members failing again: then gloo
        cannot connect them, a :class:`RegroupError`)."""
        try:
            self._enter(0, members)
            return
        except GroupSetupError as exc:
            failed = exc
        while True:  # each failure either shrinks the members or ends in RegroupError
            print(f"rankwise: {failed}", file=sys.stderr, flush=True)
            try:
                self.regroup()
                return
            except GroupSetupError as exc:
                failed = exc

    def join(self) -> None:
        """A restarted slot: ask to come in and wait until the live members let it in."""
        if dist.is_initialized():
            retire_groups()  # the world of one
        self._request_join()
        self.pending = False

    def regroup(self, grow: bool = False) -> None:
        """Build the next generation from whoever is still there (plus waiting joiners).

        Every live member calls it (after a failed collective, or at an agreed step to let
        joiners in); the first to arrive decides who is in.
        """
        nxt = self.generation + 1
        if dist.is_initialized():  # first: closing it wakes the peers still blocked in it
            retire_groups()
        self.arrive()
        if self._leads(nxt):
            self._lead(nxt, expect_all=grow)
        members = self._wait_members(nxt)
        check_min_nproc(members, self.cfg.min_nproc)
        self._enter(nxt, members)

    def arrive(self) -> None:
        """Alive and on the way into the next generation: said before slow work (a full
        ``gc.collect()`` starves the heartbeat thread), so the leader never counts it gone."""
        key = Keys.arrive(self.generation + 1, self.cfg.slot)
        self._call(self.signed.set, key, "1")

    def record_finished(self) -> None:
        """Record in the store that this rank's training finished (``fit/finished``, which the
        launcher looks for before it counts an exit 0 as the job's end); the heartbeat writes
        it again until the process ends, so that a store client deleting it cannot make the
        launcher take a finished rank for one that left early."""
        self._finished = True
        self._call(mark_finished, self.signed)

    def close(self) -> None:
        self._stop.set()

    # -- internals ------------------------------------------------------------------------------

    def _leads(self, gen: int) -> bool:
        """Whether this process leads generation ``gen`` (the first to claim it)."""
        key = Keys.leader(gen)
        return self._call(self.signed.claim, key, str(self.cfg.slot)) == str(self.cfg.slot)

    def _lead_first(self) -> None:
        """Generation 0: every slot that arrives within the rendezvous timeout, not waiting
        for one the launcher saw exit (it crashed before it got here). A process not started
        yet has no heartbeat to judge: only its dead mark or the timeout count it out."""
        slots = range(self.cfg.world_size)
        deadline = time.monotonic() + self.timeout_s
        while True:
            arrived = [s for s in slots if s == self.cfg.slot or self._flag(Keys.arrive(0, s))]
            dead = [s for s in slots if s not in arrived and self._int(Keys.dead(s)) is not None]
            if len(arrived) + len(dead) == self.cfg.world_size or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self._publish(0, arrived, [], [])

    def _publish(
        self, gen: int, members: list[int], joined: list[int], incs: list[int]
    ) -> list[int]:
        """Write generation ``gen``'s members (the first leader's list stays, should a second
        one have claimed the lead after a deleted claim) and the current generation; the
        slots let in where this list is the one that stays (else none)."""
        value = ";".join(",".join(map(str, part)) for part in (members, joined, incs))
        kept = self._call(self.signed.claim, Keys.members(gen), value)
        self._call(self.signed.set, Keys.CURRENT, str(gen))
        if kept is not None:  # and again by the heartbeat, should a client delete it
            self._published = (gen, kept)
        return joined if kept == value else []

    def _lead(self, nxt: int, expect_all: bool) -> None:
        old = self.members
        # Joiners come in only where the caller asked to grow, at a step boundary it chose:
        # the survivors of a failure have their own recovery to run first.
        waiting = self.joiners() if expect_all else []
        requests = {s: self._request(s) for s in waiting}
        for s in waiting:  # a joiner arrives by its request
            self._call(self.signed.set, Keys.arrive(nxt, s), "1")
        seen: dict[int, tuple[int | None, float]] = {}
        deadline = time.monotonic() + self.timeout_s
        while True:
            arrived = [  # the leader itself is here, whatever a store client did to its mark
                s for s in old if s == self.cfg.slot or self._flag(Keys.arrive(nxt, s))
            ]
            missing = [s for s in old if s not in arrived]
            now = time.monotonic()
            for s in missing:
                beat = self._int(Keys.heartbeat(s))
                if s not in seen or (beat is not None and seen[s][0] != beat):
                    seen[s] = (beat, now)
            gone = [
                s for s in missing if now - seen[s][1] >= self.cfg.stale_s or self._marked_dead(s)
            ]
            if len(gone) == len(missing) or now > deadline:
                break
            time.sleep(0.05)
        members = sorted(set(arrived) | set(waiting))
        # Used: the challenges and their answers go (a replay of them proves nothing later).
        # (A request a store client deleted since it was judged names no incarnation: it has
        # no keys of its own to delete or set, and its joiner finds its way in by the list.)
        for s, inc in requests.items():
            if inc is not None:
                self.signed.delete(Keys.proof(s, inc))
                self.signed.delete(Keys.challenge(s, inc))
        incs = [requests[s] or 0 for s in waiting]  # every one let in was read: "ready"
        admitted = self._publish(nxt, members, waiting, incs)
        for s in admitted:
            if (inc := requests[s]) is not None:
                self._call(self.signed.set, Keys.admit(s, inc), str(nxt))
        if expect_all:  # take them (and the dead) off the list
            leaving = set(waiting) | {s for s in self._listed() if self._joiner_dead(s)}
            if leaving:
                self._take_off_waiting(sorted(leaving))

    def _marked_dead(self, slot: int) -> bool:
        """Whether the launcher saw the newest incarnation of ``slot`` that entered a
        generation exit (``dead/<slot>`` at or past ``member/<slot>``)."""
        dead = self._int(Keys.dead(slot))
        return dead is not None and dead >= (self._int(Keys.member(slot)) or 0)

    def _read_members(self, gen: int) -> list[int]:
        """Generation ``gen``'s members once its leader wrote them (up to the timeout); also
        sets :attr:`joined`. Meanwhile this process says again that it arrived, should its
        mark have been deleted."""
        key = Keys.members(gen)
        deadline = time.monotonic() + self.timeout_s
        while True:
            value = self._read(self.signed.get, key)
            parsed = None if value is None else parse_members(value)
            if value is not None and parsed is None:
                self.signed.ignore(key, f"not a member list: {value[:40]!r}")
            if parsed is not None:
                self.joined, self._joined_incs = parsed[1], parsed[2]
                return parsed[0]
            if time.monotonic() > deadline:
                waited = f"none within {self.timeout_s:.0f} s"
                raise self._lost(waited, f"waiting for the member list of generation {gen}")
            if gen == self.generation + 1 and not self._flag(Keys.arrive(gen, self.cfg.slot)):
                self.arrive()
            time.sleep(0.05)

    def _wait_members(self, gen: int) -> list[int]:
        members = self._read_members(gen)
        if self.cfg.slot not in members:
            raise RemovedError(
                f"slot {self.cfg.slot} was left out of generation {gen} (members {members}): "
                "it did not arrive in time (frozen or stalled); the launcher replaces it."
            )
        return members

    def _request_join(self) -> None:
        """Ask to come in, answer the members' challenges, enter once let in."""
        gen = self._await_admission()
        self._enter(gen, self._wait_members(gen))

    def ask(self) -> None:
        """Put this incarnation's request on the waiting list (the members then challenge it)."""
        slot, inc = self.cfg.slot, self.cfg.incarnation
        self.signed.delete(Keys.proof(slot, inc))  # whatever a stranger left there before
        self._call(self.store.set, Keys.join(slot), str(inc))  # before the list: read first
        self._edit_waiting(lambda listed: sorted({*listed, slot}))

    def _await_admission(self) -> int:
        """Ask, and wait until a member lets this incarnation in: the generation."""
        self.ask()
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            gen = self.poll_admission()
            if gen is not None:
                return gen
            time.sleep(0.05)
        raise RegroupError(
            f"slot {self.cfg.slot} (restart {self.cfg.incarnation}) waited {self.timeout_s:.0f}s "
            "and no running rank let it in; the survivors may have finished or stopped, or "
            "refused it (the members then say so): its RANKWISE_JOB_TOKEN must be the job's "
            "(the same --job-token-file on every node)."
        )

    def poll_admission(self) -> int | None:
        """One look of a waiting joiner: answer a new challenge; the generation it was let
        into (None: not yet). Raises :class:`RegroupError` where it never will be."""
        slot, inc = self.cfg.slot, self.cfg.incarnation
        if (why := self._read(self.signed.get, Keys.STOPPED)) is not None:
            raise RegroupError(
                f"slot {slot} (restart {inc}) will not join: the running ranks stopped the "
                f"job ({why})"
            )
        if self._read(self.signed.get, Keys.refused(slot, inc)) is not None:
            raise RegroupError(
                f"slot {slot} (restart {inc}) was refused by the running job: its proof of "
                "the job's secret did not match. Every node's launcher needs the same "
                "--job-token-file."
            )
        admitted = self._int(Keys.admit(slot, inc))
        if admitted is not None:
            return admitted
        if self._answered:  # let in by the generation after its challenge's, admit mark or not
            after = int(self._answered.partition(":")[0]) + 1
            listed = self._read(self.signed.get, Keys.members(after))
            entry = None if listed is None else parse_members(listed)
            if entry is not None and slot in entry[1]:
                return after
        # The challenge is answered unchecked (a joiner given the wrong secret could not check
        # it, and should hear it was refused): an answer to a challenge a stranger set is good
        # for that challenge only, which no member ever set or accepts.
        raw = self._read(self.signed.raw, Keys.challenge(slot, inc))
        text = "" if raw is None else raw.decode(errors="replace").rpartition("|")[0]
        parsed = _parse_challenge(text)
        proof = Keys.proof(slot, inc)
        if parsed is not None and (
            text != self._answered or not self._read(self.signed.raw, proof)
        ):
            mac = join_proof(self.cfg.job_token, self.cfg.job_id, slot, inc, *parsed)
            self._call(self.store.set, proof, f"{text}:{mac}")  # again where it was deleted
            self._answered = text
        self._still_asking()
        if (gone := self._nobody_running()) is not None:
            raise RegroupError(
                f"slot {slot} (restart {inc}) cannot join: every rank of generation "
                f"{gone} has exited (finished, or failed with the errors above), so nobody "
                "is left to let it in or hand it the training state. Fix what ended them "
                "and relaunch; with checkpoints, resume='auto' goes on from the last one."
            )
        return None

    def _still_asking(self) -> None:
        """The request again where a store client deleted or changed it (the members take
        it off the list only when they let it in, or refuse it: then this one knows)."""
        slot, inc = self.cfg.slot, self.cfg.incarnation
        if self._request(slot) != inc:
            self._call(self.store.set, Keys.join(slot), str(inc))
        if slot not in self._listed():
            self._edit_waiting(lambda listed: sorted({*listed, slot}))

    def _nobody_running(self) -> int | None:
        """The newest generation, where the launcher saw every one of its members exit (none
        left to let a joiner in); None while one of them runs, or before generation 0."""
        gen = self._int(Keys.CURRENT)
        if gen is None:
            return None
        value = self._read(self.signed.get, Keys.members(gen))
        parsed = None if value is None else parse_members(value)
        members = parsed[0] if parsed else []
        return gen if members and all(self._marked_dead(s) for s in members) else None

    def _enter(self, gen: int, members: list[int]) -> None:
        """Leave the old default group behind (never destroyed) and build generation ``gen``'s."""
        self.generation, self.members = gen, members
        self.history[gen] = members
        self._call(self.signed.set, Keys.member(self.cfg.slot), str(self.cfg.incarnation))
        if self.cfg.slot in self.joined:
            self._ready = Keys.ready(gen, self.cfg.slot)  # and again by the heartbeat
            self._call(self.signed.set, self._ready, "1")
        self._await_joiners(gen)
        # Gloo's rendezvous waits for every member under the group's own timeout, and inside
        # it nobody watches heartbeats or dead marks: a member or joiner lost there (killed
        # after its ready mark) would hold the others for the whole collective timeout. So
        # the group forms under the set-up timeout and gets the collective one once it stands.
        collective = self.cfg.collective_timeout_s
        # The same members failing again were all there: once more under twice the time (a
        # loaded machine), then the network is named rather than regrouping on.
        same = [(given, said) for failed, given, said in self._failed_setups if failed == members]
        again = len(same)
        setup = min(collective, self.cfg.setup_timeout_s * 2**again)
        if dist.get_debug_level() == dist.DebugLevel.DETAIL:  # its wrapper's own checks keep
            setup = collective  # the timeout the group is built with: no set-up bound then
        if again >= 2:
            tried, said = same[-1]
            raise RegroupError(
                f"generation {gen}'s group (slots {members}) did not form twice, within "
                f"{tried:g} s the second time, although every member came back for "
                "it: gloo cannot connect them. Check the network between the ranks "
                "(GLOO_SOCKET_IFNAME names the interface), or raise RANKWISE_SETUP_TIMEOUT_S "
                f"for a world of thousands of ranks. The last attempt: {said}"
            )
        try:
            dist.init_process_group(
                "gloo",
                store=dist.PrefixStore(Keys.group(gen), self.store),
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(seconds=setup),
            )
        except RuntimeError as exc:  # torch's DistError, gloo's own (a lost peer's) errors
            self._call(self.store.check, [Keys.CURRENT])  # the store itself gone: say that
            said = first_line(exc)
            self._failed_setups.append((list(members), setup, said))
            raise GroupSetupError(
                f"generation {gen}'s group (slots {members}) did not form within {setup:g} s "
                "(RANKWISE_SETUP_TIMEOUT_S): a member was lost in its set-up, so the others "
                f"regroup without it (a joiner exits, and is restarted). torch said: {said}"
            ) from exc
        set_group_timeout(timedelta(seconds=collective))
        self._ready, self._failed_setups = "", []

    def _await_joiners(self, gen: int) -> None:
        """Before building generation ``gen``'s group, which waits for every member up to the
        collective timeout: each joiner it let in has reached it, or is marked dead, or its
        heartbeat stood still for ``stale_s`` (then :class:`JoinerLostError`)."""
        seen: dict[int, tuple[int | None, float]] = {}
        deadline = time.monotonic() + self.timeout_s
        for s in self.joined:
            while not self._flag(Keys.ready(gen, s)):
                now = time.monotonic()
                beat = self._int(Keys.joinbeat(s))
                if s not in seen or (beat is not None and seen[s][0] != beat):
                    seen[s] = (beat, now)
                dead = self._joiner_dead(s, self._joined_incs.get(s))
                if dead or now - seen[s][1] >= self.cfg.stale_s or now > deadline:
                    raise JoinerLostError(
                        f"slot {s}, let into generation {gen}, died or stalled before it "
                        f"reached the group (its heartbeat stood still for {self.cfg.stale_s:g} s, "
                        "or the launcher saw it exit): the members recover without it."
                    )
                time.sleep(0.02)

    def _heartbeat(self) -> None:
        count = 0
        while not self._stop.wait(0.2):
            count += 1
            # hb/<slot> is the lost predecessor's while this one waits: a joiner beats apart
            key = Keys.joinbeat(self.cfg.slot) if self.pending else Keys.heartbeat(self.cfg.slot)
            try:
                self._beats.set(key, str(count))
                if not self.pending and self.generation >= 0:  # in case a client deleted it
                    self._beats.set(Keys.member(self.cfg.slot), str(self.cfg.incarnation))
                if ready := self._ready:  # a joiner on its way into a group: the same
                    self._beats.set(ready, "1")
                if published := self._published:  # the newest list this one led: the same
                    self._beats.set(Keys.members(published[0]), published[1])
                if self._finished:  # training finished: the launcher's mark, kept until exit
                    mark_finished(self._beats)
            except Exception:  # the store host is gone: the main thread finds out and says so
                return

    def _connect(self) -> dist.TCPStore:
        try:
            return dist.TCPStore(
                self.cfg.host,
                self.cfg.port,
                is_master=False,
                timeout=timedelta(seconds=self.timeout_s),
                wait_for_workers=False,
            )
        except Exception as exc:
            raise self._lost(exc, "connecting") from exc

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the store; a failure of the store itself is a lost store."""
        try:
            return fn(*args)
        except Exception as exc:
            raise self._lost(exc, f"{getattr(fn, '__name__', 'using')} {args[0]!r}") from exc

    _read = _call

    def _int(self, key: str) -> int | None:
        """``key``'s signed whole number (None: not set, or ignored with a warning)."""
        return self._read(self.signed.get_int, key)

    def _flag(self, key: str) -> bool:
        """Whether ``key`` holds a signed value."""
        return bool(self._read(self.signed.has, key))

    def _lost(self, exc: BaseException | str, doing: str) -> DistributedConnectionError:
        return DistributedConnectionError(
            f"the membership store at {self.cfg.host}:{self.cfg.port} (hosted by `rankwise "
            f"launch`) failed while {doing}: {exc}. The launcher (the store host) is gone or "
            "unreachable, so the survivors cannot agree on who is left: the job stops. Restart "
            "it; with checkpoints, resume='auto' picks up from the last one. So that losing a "
            "node's launcher (node 0's included) stops only that node, host the store apart: "
            "`rankwise store --host ITS_ADDRESS --port P --nnodes N` on a machine of its own, and --store-endpoint "
            "HOST:P for every `rankwise launch`."
        )
