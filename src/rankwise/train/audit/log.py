"""An opt-in audit log of the samples each rank consumed, and the exactly-once check on it.

:class:`AuditLog` is a trainer callback: every attempt of a run (a launch, a restart under
``--max-restarts``, a relaunch on another world size, a regroup under ``--on-failure
continue``) writes one JSONL file per rank, ``audit-{attempt}-rank{r}.jsonl``, with one line
per micro-batch::

    {"epoch": 0, "step": 7, "ids": [12, 40, ...], "time": 1700000000.1}

``step`` is the optimizer step the micro-batch contributes to (1-based), so a checkpoint
saved at step ``S`` holds exactly the micro-batches with ``step <= S``. A micro-batch that
ends the epoch with the sampler's padding (the global order wrapped to a multiple of the
world size, torch's rule) says so: ``"pad": p``, its last ``p`` ids repeat the start of the
epoch's order and are not counted as samples.

The first line records where the attempt started (``start_step``, the step it resumed from),
who wrote the file (its ``rank``, ``world_size`` and ``pid``; under ``rankwise launch
--on-failure continue`` its ``slot``, its rank in the launched world kept across regroups,
``incarnation``, 0 then 1 after its first restart, and membership ``generation``) and what
the run trains: ``data_size`` (the ids are in ``[0, data_size)``), ``held_out`` (the ids
never trained: a ``validation_split`` hold-out) and ``epochs``, so ``rankwise audit DIR``
gives its verdict without being told the data set. Then come the micro-batches, the
checkpoints (``{"checkpoint_step": S, "path": ...}``, written only by a rank that wrote the
checkpoint, once its write landed: also the write a SIGTERM or an exception drained) and the
end of fit (``{"end_step": S, ...}``), each with its wall ``time``. Lines are flushed one by
one, so a SIGKILL loses at most the line being written. ``rankwise audit DIR`` summarises a
folder and checks it (:mod:`rankwise.train.audit.timeline` draws it). Files written before the
header carried ``data_size`` stay readable: their check needs ``--samples N``.

:func:`read_audit` puts the attempts back in order and keeps the *committed* micro-batches:
a micro-batch of step ``s`` is committed unless a later attempt started from a step before
``s`` (a resume from an earlier checkpoint, or survivors going on from the last completed
step, rolled it back). :meth:`AuditReport.violations` then checks each sample was trained on
exactly once per epoch, the held-out ones never, and that the ranks of each attempt trained
in lockstep (as many micro-batches each in every committed step).

>>> import tempfile, torch
>>> from rankwise.train import DistributedTrainer, DistributedTrainingConfig
>>> folder = tempfile.mkdtemp()
>>> net = torch.nn.Linear(4, 2)
>>> trainer = DistributedTrainer(net, torch.nn.CrossEntropyLoss(),
...     torch.optim.SGD(net.parameters(), lr=0.1), callbacks=[AuditLog(folder)])
>>> cfg = DistributedTrainingConfig(epochs=2, batch_size=4, verbose=False, checkpoint_dir=None,
...     validation_split=0.25)
>>> _ = trainer.fit(torch.randn(16, 4), torch.randint(0, 2, (16,)), cfg)
>>> report = read_audit(folder)
>>> report.data_size, len(report.held_out), report.violations()
(16, 4, [])
"""

from __future__ import annotations

import collections
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import rankwise.distributed as rd

__all__ = ["AuditLog", "AuditReport", "read_audit", "read_audit_files"]


class AuditLog:
    """Record, per rank and per attempt, the dataset indices of every micro-batch.

    ``AuditLog(directory)`` as one of the trainer's ``callbacks``; the directory must be shared
    by all ranks and all attempts of the run (and hold nothing else named ``audit-*``). Needs
    a trainer-built sampler (arrays or a Dataset): with a user's DataLoader the ids are
    unknown and :meth:`on_fit_start` raises.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.attempt: str | None = None
        self._file: IO[str] | None = None
        # on_checkpoint_written may run on the SIGTERM guard's helper thread
        self._lock = threading.Lock()
        self._written: set[str] = set()  # checkpoints recorded (a drain may report one again)

    def on_fit_start(self, trainer: Any) -> None:
        from rankwise.train.data import id_space

        space = id_space(trainer.train_source)
        if space is None:
            raise ValueError(
                "AuditLog needs the sample ids, which the trainer knows only when it builds "
                "the sampler: pass arrays or a Dataset to fit(), not a DataLoader."
            )
        self.close()
        # the fit's roles (trainer.roles); a trainer of another kind: this process's
        roles = getattr(trainer, "roles", None) or rd.Roles.for_this_process()
        if roles.joining:
            return  # a restarted process: its attempt starts when it joins (on_regroup)
        # Rank 0 names the attempt (nanoseconds since the epoch: later attempts sort later);
        # every rank writes its file under that name.
        attempt = str(rd.broadcast_plain(f"{time.time_ns():020d}"))
        who = roles.member()  # who this is across regroups and restarts (the timeline's rows)
        size, held_out = space
        self.open_attempt(
            attempt,
            rank=rd.get_rank(),
            world_size=rd.get_world_size(),
            start_step=trainer.global_step,
            data_size=size,
            held_out=held_out.tolist(),
            epochs=trainer.config.epochs,
            member=who,
        )

    def on_regroup(self, trainer: Any) -> None:
        """The survivors of a lost rank go on from the last completed step (``rankwise launch
        --on-failure continue``): a new attempt from there, so the lost step's records of the
        old attempt are rolled back by :func:`read_audit` as a resume's are."""
        self.on_fit_start(trainer)

    def before_backward(self, trainer: Any, epoch: int, step: int, sample_ids: Any) -> None:
        # Before the backward sends the micro-batch's gradient: a rank lost between that and
        # an after-batch hook (--on-failure continue goes on from that step) left its record.
        # One lost before the gradient was sent took the step with it: the survivors resume
        # before it, and read_audit rolls the record back.
        ids = [] if sample_ids is None else [int(i) for i in sample_ids]
        # the live sampler: under --on-failure continue a regroup re-splits the data into a
        # new one (the state's), the trainer's train_source keeps the first
        pad = padding(trainer.state.sampler, len(ids))
        self.record_batch(epoch, step + 1, ids, pad)

    def on_checkpoint_written(self, trainer: Any, path: Any) -> None:
        """This rank wrote the checkpoint ``path`` and the write landed (a background one is
        known at the next save, the end of fit, or a drain on an exception or SIGTERM). The
        step it holds is in its name (``ckpt-e1-s8.pt``)."""
        self.record_checkpoint(path, trainer.global_step)

    def on_fit_end(self, trainer: Any, history: Any) -> None:
        self.record_end(trainer.global_step)
        self.close()

    # -- the records (the callbacks above write through these) --------------------------------

    def open_attempt(
        self,
        attempt: str,
        *,
        rank: int,
        world_size: int,
        start_step: int,
        data_size: int,
        held_out: list[int],
        epochs: int,
        member: tuple[int, int, int] | None = None,
        pid: int | None = None,
        at: float | None = None,
    ) -> None:
        """Start this rank's file of ``attempt`` (a name that sorts after the earlier
        attempts'): its first line, the header. ``member``: ``(slot, incarnation,
        generation)`` under ``--on-failure continue``; ``at``: the wall time (default now)."""
        self.close()
        self.attempt = attempt
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"audit-{attempt}-rank{rank}.jsonl"
        self._file = open(self.directory / name, "a", encoding="utf-8")  # noqa: SIM115
        head: dict[str, Any] = {
            "start_step": start_step,
            "rank": rank,
            "world_size": world_size,
            "time": time.time() if at is None else at,
            "pid": os.getpid() if pid is None else pid,
            "data_size": data_size,
            "held_out": list(held_out),
            "epochs": epochs,
        }
        if member is not None:
            head |= dict(zip(("slot", "incarnation", "generation"), member, strict=True))
        self._write(head)

    def record_batch(
        self, epoch: int, step: int, ids: list[int], pad: int = 0, at: float | None = None
    ) -> None:
        """A micro-batch of optimizer step ``step`` (1-based): its ``ids``, the last ``pad``
        of which are the sampler's padding."""
        record: dict[str, Any] = {"epoch": epoch, "step": step, "ids": ids}
        if pad:
            record["pad"] = pad
        self._write({**record, "time": time.time() if at is None else at})

    def record_checkpoint(self, path: Any, step: int, at: float | None = None) -> None:
        """The checkpoint ``path`` (written by this rank, landed) holds step ``step``, unless
        its name says another (``-s<step>``); recorded once whoever reports it again."""
        name = Path(str(path).rstrip("/")).name
        held = re.search(r"-s(\d+)\D*$", name)
        with self._lock:
            if name in self._written:
                return
            self._written.add(name)
        step = int(held.group(1)) if held else step
        self._write(
            {"checkpoint_step": step, "path": name, "time": time.time() if at is None else at}
        )

    def record_end(self, step: int, at: float | None = None) -> None:
        """The end of fit, at step ``step``."""
        self._write({"end_step": step, "time": time.time() if at is None else at})

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _write(self, record: dict[str, Any]) -> None:
        with self._lock:
            if self._file is None:
                return
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()  # a SIGKILL must not take buffered lines with it


def padding(sampler: Any, n: int) -> int:
    """How many of this rank's next ``n`` ids are the sampler's padding: with its cursor at
    ``c`` (the micro-batch not yet advanced past), rank ``r`` of ``R`` takes positions
    ``c + r + R k`` (even shares, and :class:`~rankwise.data.shares.GlobalBatchShares`'s
    uneven ones alike); those at or past the data set's size wrap to the order's start."""
    if sampler is None or not hasattr(sampler, "consumed"):
        return 0
    size = len(sampler.dataset)
    first = sampler.consumed + sampler.rank
    if n <= 0 or first + sampler.num_replicas * (n - 1) < size:
        return 0
    real = max(0, -(-(size - first) // sampler.num_replicas))  # positions below size
    return n - min(real, n)


@dataclass
class Attempt:
    """One attempt's records: where it started, its micro-batches, its checkpoints, and what
    its header says of the data (None: a header from before it said so)."""

    name: str
    start_step: int
    world_size: int
    started: float
    batches: list[dict[str, Any]] = field(default_factory=list)  # each with its "rank"
    checkpoints: list[int] = field(default_factory=list)
    finished: bool = False
    ranks: set[int] = field(default_factory=set)  # the ranks that wrote a file
    data_size: int | None = None
    held_out: tuple[int, ...] = ()
    epochs: int | None = None

    @property
    def last_step(self) -> int:
        return max((b["step"] for b in self.batches), default=self.start_step)


@dataclass
class AuditReport:
    """The attempts in order and the committed sample counts: ``counts[epoch][id]`` (the
    sampler's padding apart: ``padded[epoch][id]``), and what the headers say of the data."""

    attempts: list[Attempt]
    counts: dict[int, collections.Counter[int]]
    rolled_back: int  # micro-batches discarded because a resume went back past them
    padded: dict[int, collections.Counter[int]] = field(default_factory=dict)
    data_size: int | None = None  # from the headers (None: not recorded)
    held_out: tuple[int, ...] = ()
    epochs: int | None = None
    # (attempt index, step, {rank: micro-batches}) where the ranks did not keep in step
    uneven_steps: list[tuple[int, int, dict[int, int]]] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)  # headers that differ

    def violations(self, num_samples: int | None = None, epochs: int | None = None) -> list[str]:
        """Every breach of "each id of ``[0, num_samples)`` but the held-out ones trained
        exactly once per epoch" (empty: none). ``num_samples`` defaults to the recorded
        ``data_size``; ``epochs`` (default: the recorded ``epochs``, else the epochs the
        records hold) also requires that many epochs to be present. Also a breach: a
        held-out id trained, padding trained twice, ranks of an attempt out of step."""
        size = self.data_size if num_samples is None else num_samples
        if size is None:
            raise ValueError(
                "these audit records do not say the data set's size (written before the "
                "header recorded it): pass num_samples (rankwise audit DIR --samples N)."
            )
        epochs = self.epochs if epochs is None else epochs
        held = set(self.held_out)
        problems = list(self.disagreements)
        expected = range(epochs) if epochs is not None else sorted(self.counts)
        for epoch in expected:
            counts = self.counts.get(epoch, collections.Counter())
            missing = [i for i in range(size) if counts[i] == 0 and i not in held]
            repeated = {i: c for i, c in counts.items() if c > 1}
            foreign = sorted(i for i in counts if not 0 <= i < size)
            trained_held = sorted(i for i in counts if i in held)
            for label, what in (("missing", missing), ("repeated", repeated)):
                if what:
                    problems.append(f"epoch {epoch}: {len(what)} ids {label}: {_head(what)}")
            if foreign:
                problems.append(f"epoch {epoch}: ids out of range: {_head(foreign)}")
            if trained_held:
                problems.append(f"epoch {epoch}: held-out ids trained: {_head(trained_held)}")
            pad = self.padded.get(epoch, collections.Counter())
            twice = {i: c for i, c in pad.items() if c > 1}
            if twice and pad.total() <= size - len(held):  # else the padding wraps more than once
                problems.append(f"epoch {epoch}: padding trained again: {_head(twice)}")
        for attempt, step, per_rank in self.uneven_steps:
            name = self.attempts[attempt].name
            problems.append(
                f"attempt {attempt} ({name}) step {step}: the ranks trained different numbers "
                f"of micro-batches (rank: count {per_rank}): one was replayed or skipped"
            )
        return problems


def _head(items: Any, n: int = 10) -> str:
    listed = list(items.items() if isinstance(items, dict) else items)
    return str(listed[:n]) + (" ..." if len(listed) > n else "")


def read_audit_files(directory: str | os.PathLike[str]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Every rank's file of every attempt in ``directory`` as ``(attempt name, records)``, in
    name order (attempts in the order they started); a torn last line (a kill mid-write) is
    dropped, a file without its first line is skipped."""
    found = []
    for path in sorted(Path(directory).glob("audit-*-rank*.jsonl")):
        with open(path, encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.endswith("\n")]  # drop a torn line
        if lines and "start_step" in lines[0]:
            found.append((path.name.split("-")[1], lines))
    return found


def commit_limits(starts: list[int]) -> list[int | None]:
    """For attempts starting at ``starts`` (in order), the last step of each that stays
    committed: the earliest step any later attempt started from (None: the last attempt).

    >>> commit_limits([0, 10, 8])   # a regroup at step 10, then a resume from step 8
    [8, 8, None]
    """
    limits: list[int | None] = []
    later: int | None = None
    for start in reversed(starts):
        limits.append(later)
        later = start if later is None else min(later, start)
    return limits[::-1]


def read_audit(directory: str | os.PathLike[str]) -> AuditReport:
    """Read every attempt's files in ``directory``; keep the committed micro-batches."""
    attempts: dict[str, Attempt] = {}
    for name, lines in read_audit_files(directory):
        head = lines[0]
        attempt = attempts.setdefault(
            name, Attempt(name, head["start_step"], head["world_size"], head["time"])
        )
        attempt.ranks.add(head["rank"])
        if "data_size" in head:
            attempt.data_size = head["data_size"]
            attempt.held_out = tuple(head.get("held_out", ()))
            attempt.epochs = head.get("epochs")
        for record in lines[1:]:
            if "ids" in record:
                attempt.batches.append({**record, "rank": head["rank"]})
            elif "checkpoint_step" in record:
                attempt.checkpoints.append(record["checkpoint_step"])
            elif "end_step" in record:
                attempt.finished = True
    ordered = [attempts[k] for k in sorted(attempts)]
    counts: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    padded: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    rolled_back = 0
    uneven: list[tuple[int, int, dict[int, int]]] = []
    limits = commit_limits([a.start_step for a in ordered])
    for i, (attempt, limit) in enumerate(zip(ordered, limits, strict=True)):
        per_step: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
        for batch in attempt.batches:
            if limit is not None and batch["step"] > limit:
                rolled_back += 1
                continue
            ids, pad = batch["ids"], batch.get("pad", 0)
            counts[batch["epoch"]].update(ids[: len(ids) - pad])
            padded[batch["epoch"]].update(ids[len(ids) - pad :])
            per_step[batch["step"]][batch["rank"]] += 1
        for step, by_rank in sorted(per_step.items()):
            if len(set(by_rank[r] for r in attempt.ranks)) > 1:
                uneven.append((i, step, {r: by_rank[r] for r in sorted(attempt.ranks)}))
    described = [a for a in ordered if a.data_size is not None]
    report = AuditReport(ordered, dict(counts), rolled_back, dict(padded), uneven_steps=uneven)
    if described:
        last = described[-1]
        report.data_size, report.held_out, report.epochs = (
            last.data_size,
            last.held_out,
            last.epochs,
        )
        for other in described[:-1]:
            if (other.data_size, other.held_out) != (last.data_size, last.held_out):
                report.disagreements.append(
                    f"attempt {other.name} trained another data set than attempt {last.name} "
                    f"({other.data_size} ids, {len(other.held_out)} held out, against "
                    f"{last.data_size} and {len(last.held_out)})"
                )
    return report
