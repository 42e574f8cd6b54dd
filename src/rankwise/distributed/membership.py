"""Who is still there: regrouping the survivors of a lost rank without restarting them.

Under ``rankwise launch --on-failure continue`` the launcher hosts one ``TCPStore`` for the
whole job (so any rank may die and the store lives on) and gives every process a *slot* (its
first rank). Membership moves in *generations*: generation 0 is the launched world; each
regroup writes generation ``g+1`` under its own keys and builds a fresh gloo group on
``PrefixStore("gen/<g+1>/pg", store)``, so nothing of the broken group is ever read again::

    current            -> g, the newest generation with a member list
    gen/<g>/members    -> "0,2"        (slots, in new-rank order: slot 2 is rank 1 now)
    gen/<g>/leader     -> "0"          (the first survivor to arrive; it writes members)
    gen/<g>/arrive/<s> -> "1"          (slot s is alive and wants into generation g)
    waiting            -> "2"          (restarted slots asking to come back)
    join/<s>           -> "<incarnation>" (the incarnation of slot s that waits)
    proof/<s>/<inc>    -> hex HMAC-SHA256 of "<nonce>/<s>/<inc>" with the job's secret
    refused/<s>/<inc>  -> "1"          (a join request that did not prove the secret)
    joinbeat/<s>       -> a counter a waiting joiner's heartbeat thread bumps every 0.2 s
    gen/<g>/ready/<s>  -> "1"          (joiner s is entering generation g's group now)
    stopped            -> "<why>"      (the members stopped the job: a joiner gives up at once)
    admit/<s>/<inc>    -> "<g>"        (the leader let that incarnation into generation g)
    gen/<g>/joined     -> "2"          (the slots generation g let in: they need the state)
    hb/<s>             -> a counter each process's heartbeat thread bumps every 0.2 s
    member/<s>         -> "<incarnation>" (the newest incarnation of slot s to enter a generation)
    dead/<s>           -> "<incarnation>" (the launcher saw that incarnation of slot s exit)

Who is still there is decided by the leader alone and read by everyone, so survivors always
agree: it waits until every member of the old generation has arrived, is marked dead by the
launcher (``dead/<s>`` at or past ``member/<s>``: the launcher polls its children every 0.1 s,
so a SIGKILLed rank is known gone at once), or has a heartbeat that stood still for ``stale_s``
(a SIGSTOPped process bumps nothing, and is still running for the launcher). So a dead rank
costs the regroup about 0.1 s, a frozen one ``stale_s`` after the collective timeout, and a
growing world no wait at all.

Who may join: a restarted process proves the job's secret (``RANKWISE_JOB_TOKEN``, which its
launcher made or read from ``--job-token-file``; never written to the store) with an HMAC over
the store's ``auth/nonce`` and its slot and incarnation. A request without a valid proof is
refused and taken off the list, and the job goes on (:meth:`Membership.joiners`).

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
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from rankwise.distributed.config import MemberConfig
from rankwise.distributed.errors import DistributedConnectionError, PeerLostError
from rankwise.distributed.retire import retire_groups

__all__ = [
    "JoinerLostError",
    "Membership",
    "RegroupError",
    "RemovedError",
    "check_min_nproc",
    "mark_dead",
]


class RegroupError(RuntimeError):
    """The survivors cannot go on (too few left, the store host gone); the message says why."""


class RemovedError(RegroupError):
    """This process was left out of the new generation (it was frozen or too late)."""


class JoinerLostError(PeerLostError):
    """A joiner let into the new generation died or froze before it reached the group: the
    members recover as from any lost peer (:func:`rankwise.distributed.classify`)."""


def check_min_nproc(members: list[int], min_nproc: int) -> None:
    """Refuse a generation of fewer than ``--min-nproc`` members (``members``: their slots)."""
    if len(members) < min_nproc:
        raise RegroupError(
            f"only {len(members)} rank(s) left (slots {members}) and --min-nproc is "
            f"{min_nproc}: the job stops. Raise --max-restarts so lost ranks come back, or "
            "lower --min-nproc."
        )


def mark_dead(store: dist.Store, slot: int, incarnation: int) -> None:
    """The launcher saw ``incarnation`` of ``slot`` exit: a regroup's leader counts it gone at
    once instead of waiting ``stale_s`` for its heartbeat to stand still."""
    store.set(f"dead/{slot}", str(incarnation))


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
        self.history: dict[int, list[int]] = {}  # generation -> members, those this one entered
        # A restarted slot runs alone until join(), and bumps no heartbeat meanwhile: hb/<slot>
        # is its lost predecessor's, which the survivors' leader must see stand still.
        self.pending = cfg.incarnation > 0
        self.store = self._connect()
        self._beats = self._connect()  # the heartbeat thread's own connection
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
        """Slots of restarted processes waiting to come in, alive as far as the launcher knows
        (a joiner that died or gave up while waiting is marked dead: never let in). A request
        that does not prove the job's secret is refused here and taken off the list."""
        waiting = self._listed()
        refused = [s for s in waiting if not self._proven(s)]
        if refused:
            self._take_off_waiting(refused)
        return [s for s in waiting if s not in refused and not self._joiner_dead(s)]

    def _listed(self) -> list[int]:
        waiting = self._get("waiting", "")
        return sorted({int(s) for s in waiting.split(",") if s})

    def _joiner_dead(self, slot: int) -> bool:
        """Whether the launcher saw the incarnation of ``slot`` that asked to join exit."""
        dead = self._get(f"dead/{slot}", "")
        return bool(dead) and int(dead) >= int(self._get(f"join/{slot}", "0"))

    def stop(self, why: str) -> None:
        """The members stop the job (an error every rank raises): a joiner waiting now, or
        started later, gives up at once naming ``why`` instead of waiting to be let in."""
        with contextlib.suppress(Exception):  # the store host is gone: nobody joins anyway
            self.store.set("stopped", why)

    def _proof(self, slot: int, incarnation: int) -> str:
        nonce = self._get("auth/nonce", "")
        message = f"{nonce}/{slot}/{incarnation}".encode()
        return hmac.new(bytes.fromhex(self.cfg.job_token), message, hashlib.sha256).hexdigest()

    def _proven(self, slot: int) -> bool:
        """Whether slot's waiting request proves the job's secret (said and marked if not)."""
        if not self.cfg.job_token:  # no secret given to this job (a Membership built by hand)
            return True
        inc = self._get(f"join/{slot}", "")
        proof = self._get(f"proof/{slot}/{inc}", "")
        if inc.isdigit() and hmac.compare_digest(proof, self._proof(slot, int(inc))):
            return True
        self.store.set(f"refused/{slot}/{inc}", "1")
        print(
            f"rankwise: refused a request to join as slot {slot} (restart {inc or '?'}): it does "
            "not prove the job's secret (RANKWISE_JOB_TOKEN, from the launcher or "
            "--job-token-file). The job goes on without it. A rank of this job's own needs "
            "the same --job-token-file as the other nodes.",
            file=sys.stderr,
            flush=True,
        )
        return False

    def _take_off_waiting(self, slots: list[int]) -> None:
        while True:  # one may have been added since: compare_set in a loop
            listed = self._get("waiting", "")
            new = ",".join(x for x in listed.split(",") if x and int(x) not in slots)
            if self.store.compare_set("waiting", listed, new).decode() == new:
                return

    # -- generations ----------------------------------------------------------------------------

    def start(self) -> None:
        """Generation 0 for a first start (from whoever arrives: see the module doc); a
        restarted slot, or one that came after generation 0 formed, runs alone until
        :meth:`join`."""
        if self.cfg.incarnation == 0 and not self._has("current"):
            self.arrive()
            try:
                leads = self.store.compare_set("gen/0/leader", "", str(self.cfg.slot))
            except Exception as exc:
                raise self._lost(exc, "choosing the leader of generation 0") from exc
            if leads == str(self.cfg.slot).encode():
                self._lead_first()
            members = self._read_members(0)
            if self.cfg.slot in members:
                check_min_nproc(members, self.cfg.min_nproc)
                self._enter(0, members)
                return
        self.pending, self.members = True, [self.cfg.slot]
        dist.init_process_group(
            "gloo", store=dist.HashStore(), rank=0, world_size=1,
            timeout=timedelta(seconds=self.cfg.collective_timeout_s),
        )  # fmt: skip

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
        try:
            leads = self.store.compare_set(f"gen/{nxt}/leader", "", str(self.cfg.slot))
        except Exception as exc:
            raise self._lost(exc, f"choosing the leader of generation {nxt}") from exc
        if leads == str(self.cfg.slot).encode():
            self._lead(nxt, expect_all=grow)
        members = self._wait_members(nxt)
        check_min_nproc(members, self.cfg.min_nproc)
        self.joined = self._slots(f"gen/{nxt}/joined")
        self._enter(nxt, members)

    def arrive(self) -> None:
        """Alive and on the way into the next generation: said before slow work (a full
        ``gc.collect()`` starves the heartbeat thread), so the leader never counts it gone."""
        key = f"gen/{self.generation + 1}/arrive/{self.cfg.slot}"
        try:
            self.store.set(key, "1")
        except Exception as exc:
            raise self._lost(exc, f"writing {key!r}") from exc

    def close(self) -> None:
        self._stop.set()

    # -- internals ------------------------------------------------------------------------------

    def _lead_first(self) -> None:
        """Generation 0: every slot that arrives within the rendezvous timeout, not waiting
        for one the launcher saw exit (it crashed before it got here). A process not started
        yet has no heartbeat to judge: only its dead mark or the timeout count it out."""
        slots = range(self.cfg.world_size)
        deadline = time.monotonic() + self.timeout_s
        while True:
            arrived = [s for s in slots if self._has(f"gen/0/arrive/{s}")]
            dead = [s for s in slots if s not in arrived and self._has(f"dead/{s}")]
            if len(arrived) + len(dead) == self.cfg.world_size or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.store.set("gen/0/joined", "")
        self.store.set("gen/0/members", ",".join(map(str, arrived)))
        self.store.set("current", "0")

    def _lead(self, nxt: int, expect_all: bool) -> None:
        old = self.members
        # Joiners come in only where the caller asked to grow, at a step boundary it chose:
        # the survivors of a failure have their own recovery to run first.
        waiting = self.joiners() if expect_all else []
        for s in waiting:  # a joiner arrives by its request
            self.store.set(f"gen/{nxt}/arrive/{s}", "1")
        seen: dict[int, tuple[int, float]] = {}
        deadline = time.monotonic() + self.timeout_s
        while True:
            arrived = [s for s in old if self._has(f"gen/{nxt}/arrive/{s}")]
            missing = [s for s in old if s not in arrived]
            now = time.monotonic()
            for s in missing:
                beat = int(self._get(f"hb/{s}", "0"))
                if s not in seen or seen[s][0] != beat:
                    seen[s] = (beat, now)
            gone = [
                s for s in missing if now - seen[s][1] >= self.cfg.stale_s or self._marked_dead(s)
            ]
            if len(gone) == len(missing) or now > deadline:
                break
            time.sleep(0.05)
        members = sorted(set(arrived) | set(waiting))
        self.store.set(f"gen/{nxt}/joined", ",".join(map(str, waiting)))
        self.store.set(f"gen/{nxt}/members", ",".join(map(str, members)))
        for s in waiting:
            self.store.set(f"admit/{s}/{self._get(f'join/{s}', '0')}", str(nxt))
        if expect_all:  # take them (and the dead) off the list
            leaving = set(waiting) | {s for s in self._listed() if self._joiner_dead(s)}
            if leaving:
                self._take_off_waiting(sorted(leaving))
        self.store.set("current", str(nxt))

    def _marked_dead(self, slot: int) -> bool:
        """Whether the launcher saw the newest incarnation of ``slot`` that entered a
        generation exit (``dead/<slot>`` at or past ``member/<slot>``)."""
        dead = self._get(f"dead/{slot}", "")
        return bool(dead) and int(dead) >= int(self._get(f"member/{slot}", "0"))

    def _read_members(self, gen: int) -> list[int]:
        key = f"gen/{gen}/members"
        try:
            self.store.wait([key], timedelta(seconds=self.timeout_s))
        except Exception as exc:
            raise self._lost(exc, f"the member list of generation {gen}") from exc
        return self._slots(key)

    def _wait_members(self, gen: int) -> list[int]:
        members = self._read_members(gen)
        if self.cfg.slot not in members:
            raise RemovedError(
                f"slot {self.cfg.slot} was left out of generation {gen} (members {members}): "
                "it did not arrive in time (frozen or stalled); the launcher replaces it."
            )
        return members

    def _request_join(self) -> None:
        slot, inc = self.cfg.slot, self.cfg.incarnation
        if self.cfg.job_token:  # the proof before the request: the leader checks it at once
            self.store.set(f"proof/{slot}/{inc}", self._proof(slot, inc))
        self.store.set(f"join/{slot}", str(self.cfg.incarnation))  # before: the leader reads it
        # compare_set in a loop: an atomic append to the waiting list.
        while True:
            old = self._get("waiting", "")
            new = ",".join(filter(None, [old, str(slot)]))
            if self.store.compare_set("waiting", old, new).decode() == new:
                break
        admit = f"admit/{slot}/{self.cfg.incarnation}"
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self._has("stopped"):
                raise RegroupError(
                    f"slot {self.cfg.slot} (restart {self.cfg.incarnation}) will not join: the "
                    f"running ranks stopped the job ({self._get('stopped', '')})"
                )
            if self._has(f"refused/{slot}/{inc}"):
                raise RegroupError(
                    f"slot {slot} (restart {inc}) was refused by the running job: its proof of "
                    "the job's secret did not match. Every node's launcher needs the same "
                    "--job-token-file."
                )
            if self._has(admit):
                gen = int(self._get(admit, "0"))
                self.joined = self._slots(f"gen/{gen}/joined")
                self._enter(gen, self._wait_members(gen))
                return
            if (gone := self._nobody_running()) is not None:
                raise RegroupError(
                    f"slot {slot} (restart {inc}) cannot join: every rank of generation "
                    f"{gone} has exited (finished, or failed with the errors above), so nobody "
                    "is left to let it in or hand it the training state. Fix what ended them "
                    "and relaunch; with checkpoints, resume='auto' goes on from the last one."
                )
            time.sleep(0.05)
        raise RegroupError(
            f"slot {self.cfg.slot} (restart {self.cfg.incarnation}) waited {self.timeout_s:.0f}s "
            "and no running rank let it in; the survivors may have finished or stopped."
        )

    def _nobody_running(self) -> int | None:
        """The newest generation, where the launcher saw every one of its members exit (none
        left to let a joiner in); None while one of them runs, or before generation 0."""
        if not self._has("current"):
            return None
        gen = int(self._get("current", "0"))
        members = self._slots(f"gen/{gen}/members")
        return gen if members and all(self._marked_dead(s) for s in members) else None

    def _enter(self, gen: int, members: list[int]) -> None:
        """Leave the old default group behind (never destroyed) and build generation ``gen``'s."""
        self.generation, self.members = gen, members
        self.history[gen] = members
        self.store.set(f"member/{self.cfg.slot}", str(self.cfg.incarnation))  # see _marked_dead
        if self.cfg.slot in self.joined:
            self.store.set(f"gen/{gen}/ready/{self.cfg.slot}", "1")
        self._await_joiners(gen)
        prefix = dist.PrefixStore(f"gen/{gen}/pg", self.store)
        dist.init_process_group(
            "gloo",
            store=prefix,
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=self.cfg.collective_timeout_s),
        )

    def _await_joiners(self, gen: int) -> None:
        """Before building generation ``gen``'s group, which waits for every member up to the
        collective timeout: each joiner it let in has reached it, or is marked dead, or its
        heartbeat stood still for ``stale_s`` (then :class:`JoinerLostError`)."""
        seen: dict[int, tuple[str, float]] = {}
        deadline = time.monotonic() + self.timeout_s
        for s in self.joined:
            while not self._has(f"gen/{gen}/ready/{s}"):
                now = time.monotonic()
                beat = self._get(f"joinbeat/{s}", "")
                if s not in seen or seen[s][0] != beat:
                    seen[s] = (beat, now)
                if self._joiner_dead(s) or now - seen[s][1] >= self.cfg.stale_s or now > deadline:
                    raise JoinerLostError(
                        f"slot {s}, let into generation {gen}, died or stalled before it "
                        f"reached the group (its heartbeat stood still for {self.cfg.stale_s:g} s, "
                        "or the launcher saw it exit): the members recover without it."
                    )
                time.sleep(0.02)

    def _heartbeat(self) -> None:
        key = f"hb/{self.cfg.slot}"
        while not self._stop.wait(0.2):
            if self.pending:  # hb/<slot> is the lost predecessor's: a joiner beats apart
                try:
                    self._beats.add(f"joinbeat/{self.cfg.slot}", 1)
                except Exception:
                    return
                continue
            try:
                self._beats.add(key, 1)
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

    def _has(self, key: str) -> bool:
        try:
            return bool(self.store.check([key]))
        except Exception as exc:
            raise self._lost(exc, f"reading {key!r}") from exc

    def _get(self, key: str, default: str) -> str:
        return self.store.get(key).decode() if self._has(key) else default

    def _slots(self, key: str) -> list[int]:
        """A list of slots the store holds as ``"0,2"`` (empty where the key is not set)."""
        return [int(s) for s in self._get(key, "").split(",") if s]

    def _lost(self, exc: BaseException, doing: str) -> DistributedConnectionError:
        return DistributedConnectionError(
            f"the membership store at {self.cfg.host}:{self.cfg.port} (hosted by `rankwise "
            f"launch`) failed while {doing}: {exc}. The launcher (the store host) is gone or "
            "unreachable, so the survivors cannot agree on who is left: the job stops. Restart "
            "it; with checkpoints, resume='auto' picks up from the last one. So that losing a "
            "node's launcher (node 0's included) stops only that node, host the store apart: "
            "`rankwise store --port P --nnodes N` on a machine of its own, and --store-endpoint "
            "HOST:P for every `rankwise launch`."
        )
