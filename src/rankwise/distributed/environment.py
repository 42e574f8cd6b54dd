"""Who this process is: the one place that tells torchrun, SLURM, MPI and plain variables apart.

:func:`detect` reads a mapping of environment variables (``os.environ`` by default) and returns
an :class:`Environment`: rank, world size, local rank, master address and port, and which
variables decided them. Precedence, first match wins:

1. **torchrun / torchelastic** (``TORCHELASTIC_RUN_ID`` with ``RANK``): the launcher sets every
   variable itself, and inside a SLURM or MPI allocation it is what started this process.
2. **plain variables** (``RANK`` and ``WORLD_SIZE``): set by hand or by another launcher; they
   win over SLURM / MPI variables, which an allocation sets for its shell too.
3. **SLURM** (``SLURM_PROCID``, ``SLURM_NTASKS`` and ``SLURM_STEP_ID``: a task ``srun`` started,
   also inside ``salloc``). A batch or ``salloc`` shell has no ``SLURM_STEP_ID`` and is not a
   task; when its ``SLURM_NTASKS`` is above 1 a warning says to start the script with ``srun``.
4. **Open MPI** (``OMPI_COMM_WORLD_RANK`` / ``_SIZE`` / ``_LOCAL_RANK``).
5. **MPICH / Intel MPI** (``PMI_RANK`` / ``PMI_SIZE``, ``MPI_LOCALRANKID``).
6. **none**: a bare ``python train.py``, a world of one without a process group.

``LOCAL_RANK`` is never guessed as the global rank when the job may span machines.

>>> env = detect({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
...               "SLURM_STEP_ID": "0", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "gpu-[01-04]",
...               "SLURM_JOB_ID": "4242"})
>>> env.kind, env.rank, env.local_rank, env.master_addr, env.master_port
('slurm', 5, 1, 'gpu-01', 19242)
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import socket
import warnings
import zlib
from collections.abc import Collection, Mapping

from rankwise.distributed.contract import LAUNCHED
from rankwise.distributed.errors import DistributedConfigError, RankwiseWarning

# A master port derived from the SLURM job id lands in [_SLURM_PORT_BASE, + _SLURM_PORT_SPAN):
# unprivileged, and below Linux's ephemeral range (32768+) where the OS picks ports for others.
_SLURM_PORT_BASE = 15000
_SLURM_PORT_SPAN = 15000
# The variables that mark a task srun started: a batch script or salloc shell has the first two
# (and may have a job name of anything) but not SLURM_STEP_ID, which only a job step sets.
_SLURM_TASK_VARS = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID")


@dataclasses.dataclass(frozen=True)
class Environment:
    """What :func:`detect` found. ``None`` fields were not given by the environment."""

    kind: str  # "torchelastic" | "plain" | "slurm" | "openmpi" | "mpich" | "none"
    rank: int = 0
    world_size: int = 1
    local_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    decided_by: tuple[str, ...] = ()  # the variables that identified the environment
    notes: tuple[str, ...] = ()  # how derived values came about (for `rankwise env`)

    @property
    def launched(self) -> bool:
        """True when a launcher (not a bare ``python train.py``) started this process."""
        return self.kind != "none"


def detect(
    environ: Mapping[str, str] | None = None, this_host: Collection[str] | None = None
) -> Environment:
    """Identify the environment; see the module docstring for the precedence.

    ``this_host`` (names and addresses of this machine) is looked up when needed and exists
    so detection stays a pure function in tests.
    """
    env = os.environ if environ is None else environ
    if _has(env, "TORCHELASTIC_RUN_ID") and _has(env, "RANK"):
        return _torchelastic(env)
    if _has(env, "RANK") or _has(env, "WORLD_SIZE"):
        return _plain(env, this_host)
    if all(_has(env, var) for var in _SLURM_TASK_VARS):
        return _slurm(env)
    if _has(env, "OMPI_COMM_WORLD_RANK"):
        return _mpi(
            env,
            "openmpi",
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        )
    if _has(env, "PMI_RANK"):
        return _mpi(env, "mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    # Still read the master, so a bad MASTER_PORT is reported even before a launcher is used.
    return Environment(
        "none",
        master_addr=env.get("MASTER_ADDR") or None,
        master_port=_optional_int(env, "MASTER_PORT"),
        notes=_warn_unstarted_slurm_tasks(env),
    )


def _warn_unstarted_slurm_tasks(env: Mapping[str, str]) -> tuple[str, ...]:
    """Warn when a SLURM allocation asks for several tasks but srun did not start this one.

    Then every copy of the script would train alone, as a world of one.
    """
    ntasks = _optional_int(env, "SLURM_NTASKS")
    if ntasks is None or ntasks <= 1:
        return ()
    note = (
        f"SLURM_NTASKS={ntasks} but SLURM_STEP_ID is unset: this process is the allocation's "
        "shell (sbatch / salloc), not a task srun started, so it runs as a world of one"
    )
    warnings.warn(
        f"{note}. Start the script with `srun python train.py` (one task per rank) or with "
        "`rankwise launch`, or ask for --ntasks=1 if one process is meant.",
        RankwiseWarning,
        stacklevel=3,
    )
    return (note,)


def _torchelastic(env: Mapping[str, str]) -> Environment:
    decided = ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    return Environment(
        "torchelastic",
        rank=_int(env, "RANK"),
        world_size=_required_int(env, "WORLD_SIZE", "RANK"),
        local_rank=_required_int(env, "LOCAL_RANK", "RANK"),
        master_addr=env.get("MASTER_ADDR") or None,
        master_port=_optional_int(env, "MASTER_PORT"),
        decided_by=decided,
    )


def _plain(env: Mapping[str, str], this_host: Collection[str] | None) -> Environment:
    if not _has(env, "WORLD_SIZE"):
        raise DistributedConfigError(
            f"RANK is set ({env['RANK']}) but WORLD_SIZE is not; set WORLD_SIZE to the "
            "total number of processes, or unset RANK for a single-process run."
        )
    world = _int(env, "WORLD_SIZE")
    if not _has(env, "RANK"):
        if world > 1:  # every process would be rank 0, and the second would find the port taken
            raise DistributedConfigError(
                f"WORLD_SIZE is set ({world}) but RANK is not; give each process its RANK "
                "(0..WORLD_SIZE-1), or start them with `rankwise launch`."
            )
        rank = 0
    else:
        rank = _int(env, "RANK")
    addr = env.get("MASTER_ADDR") or None
    notes: tuple[str, ...] = ()
    local = _optional_int(env, "LOCAL_RANK")
    if local is None and world > 1:
        if addr is not None and not is_this_host(addr, this_host):
            raise DistributedConfigError(
                f"LOCAL_RANK is not set and MASTER_ADDR={addr} is another machine, so the job "
                f"may span machines and rank {rank} says nothing about the device index on "
                "this one. Set LOCAL_RANK (0..processes on this machine - 1) for every "
                "process, or start them with torchrun / `rankwise launch`, which set it."
            )
        local = rank
        notes = ("LOCAL_RANK unset on a single machine: local rank = RANK",)
    return Environment(
        "plain",
        rank=rank,
        world_size=world,
        local_rank=local,
        master_addr=addr,
        master_port=_optional_int(env, "MASTER_PORT"),
        decided_by=tuple(v for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if _has(env, v)),
        notes=notes,
    )


def _slurm(env: Mapping[str, str]) -> Environment:
    notes = []
    addr = env.get("MASTER_ADDR") or None
    if addr is None:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist:
            raise DistributedConfigError(
                "SLURM_PROCID is set but neither MASTER_ADDR nor SLURM_JOB_NODELIST is; run "
                "the script with srun inside an allocation, or set MASTER_ADDR."
            )
        addr = expand_nodelist(nodelist)[0]
        notes.append(f"MASTER_ADDR = first host of SLURM_JOB_NODELIST={nodelist}")
    port = _optional_int(env, "MASTER_PORT")
    if port is None:
        if not _has(env, "SLURM_JOB_ID"):
            raise DistributedConfigError(
                "SLURM_PROCID is set but neither MASTER_PORT nor SLURM_JOB_ID is; set "
                "MASTER_PORT to a port free on the first node (e.g. 29500)."
            )
        port = slurm_master_port(env["SLURM_JOB_ID"])
        notes.append(f"MASTER_PORT derived from SLURM_JOB_ID={env['SLURM_JOB_ID']}")
    return Environment(
        "slurm",
        rank=_int(env, "SLURM_PROCID"),
        world_size=_int(env, "SLURM_NTASKS"),
        local_rank=_required_int(env, "SLURM_LOCALID", "SLURM_PROCID"),
        master_addr=addr,
        master_port=port,
        decided_by=(*_SLURM_TASK_VARS, "SLURM_LOCALID"),
        notes=tuple(notes),
    )


def _mpi(
    env: Mapping[str, str], kind: str, rank_var: str, size_var: str, local_var: str, nlocal: str
) -> Environment:
    rank, world = _int(env, rank_var), _required_int(env, size_var, rank_var)
    local = _optional_int(env, local_var)
    notes = []
    one_node = _optional_int(env, nlocal) == world
    if local is None:
        if not one_node:
            raise DistributedConfigError(
                f"{rank_var} is set but {local_var} is not, and nothing says all {world} "
                f"ranks share this machine ({nlocal} unset or smaller); set LOCAL_RANK for "
                "every process (its device index on its machine), or use an MPI that exports "
                f"{local_var}."
            )
        local = rank
        notes.append(f"{local_var} unset, {nlocal}={world}: local rank = rank")
    addr = env.get("MASTER_ADDR") or None
    if addr is None:
        if not one_node:
            raise DistributedConfigError(
                f"MPI ({rank_var}) does not say which host runs rank 0, and the job may span "
                "machines; set MASTER_ADDR to rank 0's host (and MASTER_PORT to a free port "
                "there), e.g. with mpirun -x MASTER_ADDR=node01 -x MASTER_PORT=29500."
            )
        addr = "127.0.0.1"
        notes.append(f"MASTER_ADDR unset, all ranks on one machine ({nlocal}): 127.0.0.1")
    return Environment(
        kind,
        rank=rank,
        world_size=world,
        local_rank=local,
        master_addr=addr,
        master_port=_optional_int(env, "MASTER_PORT"),
        decided_by=tuple(v for v in (rank_var, size_var, local_var) if _has(env, v)),
        notes=tuple(notes),
    )


def slurm_master_port(job_id: str) -> int:
    """A port for the job's rendezvous, the same on every task: derived from the job id.

    Consecutive jobs get consecutive ports, so jobs started together do not collide.

    >>> slurm_master_port("123456"), slurm_master_port("123457")
    (18456, 18457)
    """
    key = int(job_id) if job_id.strip().isdigit() else zlib.crc32(job_id.encode())
    return _SLURM_PORT_BASE + key % _SLURM_PORT_SPAN


_BRACKETS = re.compile(r"\[([^\[\]]*)\]")


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM host list (``SLURM_JOB_NODELIST``) into host names, in order.

    >>> expand_nodelist("node[5-7,12]")
    ['node5', 'node6', 'node7', 'node12']
    >>> expand_nodelist("a1,b[2-3],gpu-[08-10]")
    ['a1', 'b2', 'b3', 'gpu-08', 'gpu-09', 'gpu-10']
    """
    hosts = [h for item in _split_top_level(nodelist) for h in _expand_item(item, nodelist)]
    if not hosts:
        raise DistributedConfigError(
            f"SLURM_JOB_NODELIST={nodelist!r} names no host; expected e.g. 'node[1-4]'."
        )
    return hosts


def _split_top_level(nodelist: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise _bad_nodelist(nodelist)
        if char == "," and depth == 0:
            items.append(nodelist[start:i])
            start = i + 1
    if depth != 0:
        raise _bad_nodelist(nodelist)
    items.append(nodelist[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_item(item: str, nodelist: str) -> list[str]:
    match = _BRACKETS.search(item)
    if match is None:
        if "[" in item or "]" in item:
            raise _bad_nodelist(nodelist)
        return [item]
    head, tail = item[: match.start()], item[match.end() :]
    return [
        f"{head}{middle}{rest}"
        for middle in _expand_range_list(match.group(1), nodelist)
        for rest in _expand_item(tail, nodelist)
    ]


def _expand_range_list(ranges: str, nodelist: str) -> list[str]:
    out = []
    for part in ranges.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise _bad_nodelist(nodelist)
        if not high:
            out.append(low)
            continue
        if int(high) < int(low):
            raise _bad_nodelist(nodelist)
        width = len(low) if low.startswith("0") else 0  # zero-padded: "01-03" keeps the width
        out += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return out


def _bad_nodelist(nodelist: str) -> DistributedConfigError:
    return DistributedConfigError(
        f"SLURM_JOB_NODELIST={nodelist!r} is not a SLURM host list; expected names and "
        "bracketed ranges such as 'node[5-9,12]' or 'a1,b[2-3]'. Set MASTER_ADDR to skip it."
    )


def is_this_host(addr: str, this_host: Collection[str] | None = None) -> bool:
    """Whether ``addr`` names this machine: a loopback address, or one of its names/addresses."""
    with_scope = addr.strip().strip("[]")
    try:
        if ipaddress.ip_address(with_scope).is_loopback:
            return True
    except ValueError:
        if with_scope.lower() == "localhost":
            return True
    names = local_names() if this_host is None else this_host
    return with_scope.lower() in {n.lower() for n in names}


def local_names() -> set[str]:
    """Names and addresses of this machine, as far as it knows them without a network call."""
    names = {socket.gethostname(), socket.getfqdn()}
    try:
        _, aliases, addresses = socket.gethostbyname_ex(socket.gethostname())
        names.update(aliases, addresses)
    except OSError:
        pass
    return names


def _has(env: Mapping[str, str], var: str) -> bool:
    return bool(env.get(var, "").strip())


def parse_int(var: str, raw: str) -> int:
    """Read environment variable ``var``'s value ``raw`` as an integer, or say how to fix it.

    The one integer parser for environment variables (``config`` uses it too).

    >>> parse_int("RANK", " 3 ")
    3
    """
    try:
        return int(raw.strip())
    except ValueError:
        raise DistributedConfigError(
            f"{var}={raw!r} is not an integer; set {var} to a whole number (e.g. {var}=0)."
        ) from None


def parse_float(var: str, raw: str) -> float:
    """Read environment variable ``var``'s value ``raw`` as a number, or say how to fix it.

    >>> parse_float("RANKWISE_STALE_S", "0.5")
    0.5
    """
    try:
        return float(raw.strip())
    except ValueError:
        raise DistributedConfigError(
            f"{var}={raw!r} is not a number; set {var} to a number such as {var}=2."
        ) from None


def _int(env: Mapping[str, str], var: str) -> int:
    return parse_int(var, env[var])


def _optional_int(env: Mapping[str, str], var: str) -> int | None:
    return _int(env, var) if _has(env, var) else None


def _required_int(env: Mapping[str, str], var: str, because: str) -> int:
    if not _has(env, var):
        raise DistributedConfigError(
            f"{because} is set but {var} is not; the launcher must set both (set {var} by "
            "hand, or start the processes with the launcher that sets it)."
        )
    return _int(env, var)


def aws_region(env: Mapping[str, str] | None = None) -> str | None:
    """The region of ``AWS_REGION`` when ``AWS_DEFAULT_REGION`` is unset: botocore reads only
    the latter, while the AWS CLI v2, the other SDKs and most users' shells set the former.
    (Object-storage checkpoints; the one AWS variable rankwise reads itself.)

    >>> aws_region({"AWS_REGION": "eu-west-1"}), aws_region({"AWS_DEFAULT_REGION": "x"})
    ('eu-west-1', None)
    """
    env = os.environ if env is None else env
    if env.get("AWS_DEFAULT_REGION"):
        return None
    return env.get("AWS_REGION") or None


# Set by ``rankwise launch`` (both ways it runs a job) in every process it starts.
LAUNCHED_VAR = LAUNCHED


def under_rankwise_launch(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``rankwise launch`` started this process (it sets ``RANKWISE_LAUNCHED=1``).

    >>> under_rankwise_launch({"RANKWISE_LAUNCHED": "1"}), under_rankwise_launch({})
    (True, False)
    """
    env = os.environ if env is None else env
    return env.get(LAUNCHED_VAR) == "1"


def threads_per_process(
    nproc: int, env: Mapping[str, str] | None = None, cores: int | None = None
) -> tuple[str, bool]:
    """The OpenMP threads each of ``nproc`` processes on one machine runs with, and whether
    the user chose them: ``OMP_NUM_THREADS`` where set, else this machine's cores (those this
    process may run on) shared out, at least 1 each.

    >>> threads_per_process(3, {}, cores=16), threads_per_process(4, {}, cores=2)
    (('5', False), ('1', False))
    >>> threads_per_process(2, {"OMP_NUM_THREADS": "8"}, cores=2)
    ('8', True)
    """
    env = os.environ if env is None else env
    if env.get("OMP_NUM_THREADS"):
        return env["OMP_NUM_THREADS"], True
    if cores is None:
        affinity = getattr(os, "sched_getaffinity", None)
        cores = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    return str(max(1, cores // max(1, nproc))), False


CHECKPOINT_KEY = "RANKWISE_CHECKPOINT_KEY"


def checkpoint_key(env: Mapping[str, str] | None = None) -> str | None:
    """The checkpoint key of ``RANKWISE_CHECKPOINT_KEY`` (None when unset; the empty string
    when set empty, which ``rankwise.train.checkpoint`` refuses): the secret checkpoint
    manifests are signed with when the config's ``checkpoint_key`` is None.

    >>> checkpoint_key({"RANKWISE_CHECKPOINT_KEY": "s3cret"}), checkpoint_key({})
    ('s3cret', None)
    """
    env = os.environ if env is None else env
    return env.get(CHECKPOINT_KEY)


#: The standard variables an S3 client reads itself (botocore and obstore alike).
AWS_CLIENT_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
)


def aws_client_variables(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Those of :data:`AWS_CLIENT_VARS` that are set, for the storage layer's choice of S3
    client (obstore only where it would authenticate as botocore does); the clients read them
    again themselves.

    >>> aws_client_variables({"AWS_REGION": "eu-west-1", "HOME": "/root"})
    {'AWS_REGION': 'eu-west-1'}
    """
    env = os.environ if env is None else env
    return {name: env[name] for name in AWS_CLIENT_VARS if name in env}
