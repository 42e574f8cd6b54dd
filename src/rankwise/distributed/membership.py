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

A restarted slot first runs alone (:attr:`Membership.pending`: a world of one, so the
script's set-up needs nobody) and asks to come in with :meth:`Membership.join` once it is
ready to train; the live members let it in at a step boundary they agree on
(``regroup(grow=True)``), and a live peer sends it the training state.

Teardown never waits for the broken group: see :func:`rankwise.distributed.retire.retire_groups`.
"""

from __future__ import annotations

import hashlib
import hmac
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from rankwise.distributed.config import MemberConfig
from rankwise.distributed.errors import DistributedConnectionError
from rankwise.distributed.retire import retire_groups

__all__ = [
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
        """Slots of restarted processes waiting to come in (one store round trip when none
        waits); a request that does not prove the job's secret is refused here."""
        waiting = [int(s) for s in self._get("waiting", "").split(",") if s]
        refused = [s for s in waiting if not self._proven(s)]
        if refused:
            self._take_off_waiting(refused)
        return [s for s in waiting if s not in refused]

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
        """Generation 0 for a first start; a restarted slot runs alone until :meth:`join`."""
        if self.cfg.incarnation == 0 and not self._has("current"):
            self._enter(0, list(range(self.cfg.world_size)))
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
        joined = self._get(f"gen/{nxt}/joined", "")
        self.joined = [int(s) for s in joined.split(",") if s]
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
        if waiting:
            self._take_off_waiting(waiting)
        self.store.set("current", str(nxt))

    def _marked_dead(self, slot: int) -> bool:
        """Whether the launcher saw the newest incarnation of ``slot`` that entered a
        generation exit (``dead/<slot>`` at or past ``member/<slot>``)."""
        dead = self._get(f"dead/{slot}", "")
        return bool(dead) and int(dead) >= int(self._get(f"member/{slot}", "0"))

    def _wait_members(self, gen: int) -> list[int]:
        key = f"gen/{gen}/members"
        try:
            self.store.wait([key], timedelta(seconds=self.timeout_s))
        except Exception as exc:
            raise self._lost(exc, f"the member list of generation {gen}") from exc
        members = [int(s) for s in self.store.get(key).decode().split(",") if s]
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
            if self._has(f"refused/{slot}/{inc}"):
                raise RegroupError(
                    f"slot {slot} (restart {inc}) was refused by the running job: its proof of "
                    "the job's secret did not match. Every node's launcher needs the same "
                    "--job-token-file."
                )
            if self._has(admit):
                gen = int(self._get(admit, "0"))
                self.joined = [int(s) for s in self._get(f"gen/{gen}/joined", "").split(",") if s]
                self._enter(gen, self._wait_members(gen))
                return
            time.sleep(0.05)
        raise RegroupError(
            f"slot {self.cfg.slot} (restart {self.cfg.incarnation}) waited {self.timeout_s:.0f}s "
            "and no running rank let it in; the survivors may have finished or stopped."
        )

    def _enter(self, gen: int, members: list[int]) -> None:
        """Leave the old default group behind (never destroyed) and build generation ``gen``'s."""
        self.generation, self.members = gen, members
        self.history[gen] = members
        self.store.set(f"member/{self.cfg.slot}", str(self.cfg.incarnation))  # see _marked_dead
        prefix = dist.PrefixStore(f"gen/{gen}/pg", self.store)
        dist.init_process_group(
            "gloo",
            store=prefix,
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=self.cfg.collective_timeout_s),
        )

    def _heartbeat(self) -> None:
        key = f"hb/{self.cfg.slot}"
        while not self._stop.wait(0.2):
            if self.pending:
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
