"""Continue mode's contract: every name the launcher and its processes share, in one place.

Under ``rankwise launch --on-failure continue`` three roles meet (docs/architecture.md): the
launcher (:mod:`rankwise.launch.supervisor`, :mod:`rankwise.launch.jobstore`), each process's
member (:mod:`rankwise.distributed.membership`) and the trainer's recovery
(:mod:`rankwise.train.continuing`). They talk through two channels only, and both are named
here, once, for both sides to import (as torchft keeps its names at the top of one module):

**The environment** the launcher gives each process (:func:`member_environment` writes it;
:class:`rankwise.distributed.config.MemberConfig` reads and checks it, field by field through
:data:`MEMBER_ENV_VARS`)::

    RANKWISE_ON_FAILURE        "continue" (the mode; "restart" or unset: torchrun's)
    RANKWISE_SLOT              the process's rank in the launched world, kept across restarts
    RANKWISE_INCARNATION       0 for a slot's first start, n for its n-th restart
    RANKWISE_MIN_NPROC         --min-nproc
    RANKWISE_JOB_TOKEN         the job's secret, hex (the processes' environment only)
    RANKWISE_JOB_ID            the job's id, hex (from the store's auth/job)
    RANKWISE_JOIN_CHECK_EVERY  steps between looks for joiners (the user's, else 1; 0 without
                               restarts)
    RANKWISE_STALE_S           the user's: a heartbeat still this long means its rank is gone
    RANKWISE_SETUP_TIMEOUT_S   the user's: how long a generation's group may take to form
    DISTRIBUTED_COLLECTIVE_TIMEOUT_MS  the user's: each collective's bound
    RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT  torchrun's
                               names, with torchrun's meaning (MASTER_*: the job's store)
    RANKWISE_LAUNCHED          "1": Ctrl-C ends the process quietly (:mod:`.interrupt`)

**The job's store** (one ``TCPStore``, hosted by node 0's launcher or ``rankwise store``),
whose keys :class:`Keys` spells::

    current            -> g, the newest generation with a member list
    gen/<g>/members    -> "0,2;2;1"    (slots, in new-rank order: slot 2 is rank 1 now; then
                                        the slots generation g let in, who need the state;
                                        then the incarnation of each let in)
    gen/<g>/leader     -> "0"          (the first survivor to arrive; it writes members)
    gen/<g>/arrive/<s> -> "1"          (slot s is alive and wants into generation g)
    gen/<g>/ready/<s>  -> "1"          (joiner s is entering generation g's group now)
    gen/<g>/pg/...     gloo's own rendezvous of generation g's group (a PrefixStore)
    waiting            -> "2"          (restarted slots asking to come back; unsigned)
    join/<s>           -> "<incarnation>" (the incarnation of slot s that waits; unsigned)
    challenge/<s>/<i>  -> "<g>:<nonce>" (a fresh random challenge a member set for that request)
    proof/<s>/<i>      -> "<g>:<nonce>:<hmac>" (the joiner's answer; unsigned)
    refused/<s>/<i>    -> "<why>"      (a join request that did not prove the secret)
    admit/<s>/<i>      -> "<g>"        (the leader let that incarnation into generation g)
    joinbeat/<s>       -> a counter a waiting joiner's heartbeat thread writes every 0.2 s
    hb/<s>             -> a counter each member's heartbeat thread writes every 0.2 s
    member/<s>         -> "<incarnation>" (the newest incarnation of slot s to enter a generation)
    stopped            -> "<why>"      (the members stopped the job: a joiner gives up at once)
    dead/<s>           -> "<incarnation>" (the launcher saw that incarnation of slot s exit)
    exit/<s>/<i>       -> "ended with <exit>" or :data:`LEFT_OUT` (how the launcher saw it end)
    fit/finished       -> "1"          (a rank's fit completed: :mod:`.finish`)
    launch/finished    -> "1"          (a launcher saw training finish: on every node then)
    launch/done/<n>    -> "<code>"     (node n's launcher has ended its processes; its exit code)
    launch/hb/<n>      -> a counter node n's launcher writes every second
    launch/node/<n>    -> "<id>"       (the launcher that claimed --node-rank n; unsigned)
    auth/job           -> hex          (the job's id: the store's host sets it, the first one
                                        stays; every signed value and join proof names it)

Every value but a joiner's own (``waiting``, ``join/<s>``, ``proof/<s>/<i>``) and the two
claims (``launch/node/<n>``, ``auth/job``) is signed with the job's secret
(:mod:`.signing`) and checked where it is read. What each key means to the protocol is
:mod:`.membership`'s (generations, admission) and :mod:`rankwise.launch.jobstore`'s (the
launchers' own) to say; :func:`every_key` lists them all for the tests that attack them.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "COLLECTIVE_TIMEOUT_MS",
    "INCARNATION",
    "JOB_ID",
    "JOB_TOKEN",
    "JOIN_CHECK_EVERY",
    "LAUNCHED",
    "LEFT_OUT",
    "MEMBER_ENV_VARS",
    "MEMBER_TUNABLE",
    "MIN_NPROC",
    "ON_FAILURE",
    "SETUP_TIMEOUT_S",
    "SLOT",
    "STALE_S",
    "Keys",
    "every_key",
    "launcher_variables",
    "member_environment",
    "rankwise_variables",
]

# -- the environment ---------------------------------------------------------------------------

ON_FAILURE = "RANKWISE_ON_FAILURE"
SLOT = "RANKWISE_SLOT"
INCARNATION = "RANKWISE_INCARNATION"
MIN_NPROC = "RANKWISE_MIN_NPROC"
STALE_S = "RANKWISE_STALE_S"
SETUP_TIMEOUT_S = "RANKWISE_SETUP_TIMEOUT_S"
JOIN_CHECK_EVERY = "RANKWISE_JOIN_CHECK_EVERY"
JOB_TOKEN = "RANKWISE_JOB_TOKEN"
JOB_ID = "RANKWISE_JOB_ID"
COLLECTIVE_TIMEOUT_MS = "DISTRIBUTED_COLLECTIVE_TIMEOUT_MS"
# torchrun's names, with torchrun's meaning (the launcher sets them as torchrun's agent would)
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
GROUP_RANK = "GROUP_RANK"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
# Any rankwise launcher sets it (torchrun's front too): Ctrl-C ends the ranks quietly.
LAUNCHED = "RANKWISE_LAUNCHED"

# Where each MemberConfig field comes from; MEMBER_TUNABLE are the user's, the rest the launcher's.
MEMBER_ENV_VARS = {
    "slot": SLOT,
    "world_size": WORLD_SIZE,
    "host": MASTER_ADDR,
    "port": MASTER_PORT,
    "incarnation": INCARNATION,
    "min_nproc": MIN_NPROC,
    "collective_timeout_s": COLLECTIVE_TIMEOUT_MS,
    "stale_s": STALE_S,
    "setup_timeout_s": SETUP_TIMEOUT_S,
    "join_check_every": JOIN_CHECK_EVERY,
    "job_token": JOB_TOKEN,
    "job_id": JOB_ID,
    "local_world_size": LOCAL_WORLD_SIZE,
}

# The MemberConfig fields a user may set (the other variables are `rankwise launch`'s own).
MEMBER_TUNABLE = ("collective_timeout_s", "stale_s", "setup_timeout_s", "join_check_every")


def launcher_variables() -> tuple[str, ...]:
    """The ``RANKWISE_*`` variables ``rankwise launch --on-failure continue`` sets for each
    process (never the user).

    >>> launcher_variables()[:2]
    ('RANKWISE_SLOT', 'RANKWISE_INCARNATION')
    """
    return tuple(
        var for field, var in MEMBER_ENV_VARS.items()
        if var.startswith("RANKWISE_") and field not in MEMBER_TUNABLE
    )  # fmt: skip


def rankwise_variables() -> tuple[str, ...]:
    """Every ``RANKWISE_*`` variable of continue mode that rankwise reads
    (:func:`rankwise.distributed.config.check_variables` checks them all).

    >>> "RANKWISE_ON_FAILURE" in rankwise_variables()
    True
    """
    return (ON_FAILURE, *(v for v in MEMBER_ENV_VARS.values() if v.startswith("RANKWISE_")))


def member_environment(
    inherited: Mapping[str, str],
    *,
    slot: int,
    incarnation: int,
    node: int,
    nproc: int,
    nnodes: int,
    host: str,
    port: int,
    min_nproc: int,
    restarts: int,
    job_token: str,
    job_id: str,
) -> dict[str, str]:
    """The environment of ``incarnation`` of ``slot``, a process of ``node`` (``nproc`` per
    node, ``nnodes`` nodes): ``inherited`` (the launcher's own) with the contract's variables
    set. ``host``/``port``: the job's store. A ``RANKWISE_JOIN_CHECK_EVERY`` the user gave
    passes through, unread here (the process's ``MemberConfig`` checks it); else 1, or 0 where
    ``restarts`` is 0 (nobody can come back, so the members never look for joiners).

    >>> env = member_environment({}, slot=3, incarnation=1, node=1, nproc=2, nnodes=2,
    ...     host="10.0.0.1", port=29500, min_nproc=1, restarts=0, job_token="ab", job_id="cd")
    >>> env["RANK"], env["LOCAL_RANK"], env["RANKWISE_SLOT"], env["RANKWISE_JOIN_CHECK_EVERY"]
    ('3', '1', '3', '0')
    """
    env = {
        **inherited,
        WORLD_SIZE: str(nnodes * nproc),
        LOCAL_WORLD_SIZE: str(nproc),
        GROUP_RANK: str(node),
        MASTER_ADDR: host,
        MASTER_PORT: str(port),
        ON_FAILURE: "continue",
        MIN_NPROC: str(min_nproc),
        JOB_TOKEN: job_token,  # the processes' own environment only, never the store
        JOB_ID: job_id,
        LAUNCHED: "1",
        RANK: str(slot),
        LOCAL_RANK: str(slot - node * nproc),
        SLOT: str(slot),
        INCARNATION: str(incarnation),
    }
    if not inherited.get(JOIN_CHECK_EVERY):
        env[JOIN_CHECK_EVERY] = "1" if restarts else "0"
    return env


# -- the store ---------------------------------------------------------------------------------

#: What the launcher records as the exit of a start it ended itself because a generation left
#: it out (``exit/<slot>/<incarnation>``); the survivors' "a peer was lost" line says it.
LEFT_OUT = "stopped answering (frozen or stalled: left out of a generation, its launcher ended it)"


class Keys:
    """The job store's keys (the table in the module doc), each spelt once.

    >>> Keys.members(2), Keys.challenge(1, 3), Keys.launcher_done(0)
    ('gen/2/members', 'challenge/1/3', 'launch/done/0')
    """

    CURRENT = "current"
    WAITING = "waiting"
    STOPPED = "stopped"
    FINISHED = "fit/finished"
    LAUNCH_FINISHED = "launch/finished"
    JOB_ID = "auth/job"

    @staticmethod
    def members(gen: int) -> str:
        return f"gen/{gen}/members"

    @staticmethod
    def leader(gen: int) -> str:
        return f"gen/{gen}/leader"

    @staticmethod
    def arrive(gen: int, slot: int) -> str:
        return f"gen/{gen}/arrive/{slot}"

    @staticmethod
    def ready(gen: int, slot: int) -> str:
        return f"gen/{gen}/ready/{slot}"

    @staticmethod
    def group(gen: int) -> str:
        """The prefix of generation ``gen``'s gloo group (a ``PrefixStore``)."""
        return f"gen/{gen}/pg"

    @staticmethod
    def join(slot: int) -> str:
        return f"join/{slot}"

    @staticmethod
    def challenge(slot: int, incarnation: int) -> str:
        return f"challenge/{slot}/{incarnation}"

    @staticmethod
    def proof(slot: int, incarnation: int) -> str:
        return f"proof/{slot}/{incarnation}"

    @staticmethod
    def refused(slot: int, incarnation: int) -> str:
        return f"refused/{slot}/{incarnation}"

    @staticmethod
    def admit(slot: int, incarnation: int) -> str:
        return f"admit/{slot}/{incarnation}"

    @staticmethod
    def exit(slot: int, incarnation: int) -> str:
        return f"exit/{slot}/{incarnation}"

    @staticmethod
    def joinbeat(slot: int) -> str:
        return f"joinbeat/{slot}"

    @staticmethod
    def heartbeat(slot: int) -> str:
        return f"hb/{slot}"

    @staticmethod
    def member(slot: int) -> str:
        return f"member/{slot}"

    @staticmethod
    def dead(slot: int) -> str:
        return f"dead/{slot}"

    @staticmethod
    def launcher_done(node: int) -> str:
        return f"launch/done/{node}"

    @staticmethod
    def launcher_heartbeat(node: int) -> str:
        return f"launch/hb/{node}"

    @staticmethod
    def launcher_claim(node: int) -> str:
        return f"launch/node/{node}"


def every_key(
    world: int, generations: int = 6, incarnations: int = 3, nnodes: int = 1
) -> list[str]:
    """Every key the membership protocol and the launchers use, for a job of ``world`` slots
    (generations ``0..generations-1``, incarnations ``0..incarnations-1``). Gloo's own
    rendezvous keys under ``gen/<g>/pg/`` are left out (see docs/continue.md, threat model).

    >>> len(every_key(1, generations=1, incarnations=1))
    23
    """
    k = Keys
    keys = [k.CURRENT, k.WAITING, k.STOPPED, k.JOB_ID, k.LAUNCH_FINISHED, k.FINISHED]
    for g in range(generations):
        keys += [k.members(g), k.leader(g)]
        keys += [key(g, s) for s in range(world) for key in (k.arrive, k.ready)]
    for s in range(world):
        keys += [k.join(s), k.joinbeat(s), k.heartbeat(s), k.member(s), k.dead(s)]
        for i in range(incarnations):
            keys += [key(s, i) for key in (k.challenge, k.proof, k.refused, k.admit, k.exit)]
    for n in range(nnodes):
        keys += [k.launcher_done(n), k.launcher_heartbeat(n), k.launcher_claim(n)]
    return keys
