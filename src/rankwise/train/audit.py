"""An opt-in audit log of the samples each rank consumed, and the exactly-once check on it.

:class:`AuditLog` is a trainer callback: every attempt of a run (a launch, a restart under
``--max-restarts``, a relaunch on another world size) writes one JSONL file per rank,
``audit-{attempt}-rank{r}.jsonl``, with one line per micro-batch::

    {"epoch": 0, "step": 7, "ids": [12, 40, ...], "time": 1700000000.1}

``step`` is the optimizer step the micro-batch contributes to (1-based), so a checkpoint
saved at step ``S`` holds exactly the micro-batches with ``step <= S``. The first line
records where the attempt started (the step it resumed from) and who wrote the file: its
``rank``, ``world_size`` and ``pid``, and under ``rankwise launch --on-failure continue`` its
``slot`` (its rank in the launched world, kept across regroups), ``incarnation`` (0, then 1
after its first restart) and membership ``generation``. Then come the micro-batches, the
checkpoints (``{"checkpoint_step": S, "path": ...}``, once the checkpoint of step ``S`` is
durable) and the end of fit (``{"end_step": S, ...}``), each with its wall ``time``. Lines
are flushed one by one, so a SIGKILL loses at most the line being written. ``rankwise audit DIR`` summarises a folder and checks it
(:mod:`rankwise.train.timeline` draws it).

:func:`read_audit` puts the attempts back in order and keeps the *committed* micro-batches:
those of an attempt at or before the step the next attempt resumed from, plus everything of
the last attempt; the rest were rolled back by the resume. :meth:`AuditReport.violations`
then checks each sample was trained on exactly once per epoch.

>>> import tempfile, torch
>>> from rankwise.train import DistributedTrainer, DistributedTrainingConfig
>>> folder = tempfile.mkdtemp()
>>> net = torch.nn.Linear(4, 2)
>>> trainer = DistributedTrainer(net, torch.nn.CrossEntropyLoss(),
...     torch.optim.SGD(net.parameters(), lr=0.1), callbacks=[AuditLog(folder)])
>>> cfg = DistributedTrainingConfig(epochs=2, batch_size=4, verbose=False, checkpoint_dir=None)
>>> _ = trainer.fit(torch.randn(16, 4), torch.randint(0, 2, (16,)), cfg)
>>> report = read_audit(folder)
>>> report.violations(16), report.counts[1][5]
([], 1)
"""

from __future__ import annotations

import collections
import json
import os
import re
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

    def on_fit_start(self, trainer: Any) -> None:
        if getattr(trainer.train_source, "sampler", None) is None:
            raise ValueError(
                "AuditLog needs the sample ids, which the trainer knows only when it builds "
                "the sampler: pass arrays or a Dataset to fit(), not a DataLoader."
            )
        self.close()
        member = rd.membership()
        if member is not None and member.pending:
            return  # a restarted process: its attempt starts when it joins (on_regroup)
        # Rank 0 names the attempt (nanoseconds since the epoch: later attempts sort later);
        # every rank writes its file under that name.
        self.attempt = str(rd.broadcast_plain(f"{time.time_ns():020d}"))
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"audit-{self.attempt}-rank{rd.get_rank()}.jsonl"
        self._file = open(self.directory / name, "a", encoding="utf-8")  # noqa: SIM115
        head: dict[str, Any] = {
            "start_step": trainer.global_step,
            "rank": rd.get_rank(),
            "world_size": rd.get_world_size(),
            "time": time.time(),
            "pid": os.getpid(),
        }
        if member is not None:  # who this is across regroups and restarts (the timeline's rows)
            head |= {
                "slot": member.cfg.slot,
                "incarnation": member.cfg.incarnation,
                "generation": member.generation,
            }
        self._write(head)

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
        self._write({"epoch": epoch, "step": step + 1, "ids": ids, "time": time.time()})

    def on_checkpoint_saved(self, trainer: Any, path: Any) -> None:
        # A background write is reported once durable: at the next save or the end of fit, when
        # the trainer is steps further on. The step it holds is in its name (ckpt-e1-s8.pt).
        name = Path(str(path)).name
        held = re.search(r"-s(\d+)\D*$", name)
        step = int(held.group(1)) if held else trainer.global_step
        self._write({"checkpoint_step": step, "path": name, "time": time.time()})

    def on_fit_end(self, trainer: Any, history: Any) -> None:
        self._write({"end_step": trainer.global_step, "time": time.time()})
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()  # a SIGKILL must not take buffered lines with it


@dataclass
class Attempt:
    """One attempt's records: where it started, its micro-batches, its checkpoints."""

    name: str
    start_step: int
    world_size: int
    started: float
    batches: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    finished: bool = False

    @property
    def last_step(self) -> int:
        return max((b["step"] for b in self.batches), default=self.start_step)


@dataclass
class AuditReport:
    """The attempts in order and the committed sample counts: ``counts[epoch][id]``."""

    attempts: list[Attempt]
    counts: dict[int, collections.Counter[int]]
    rolled_back: int  # micro-batches discarded because a resume went back past them

    def violations(self, num_samples: int, epochs: int | None = None) -> list[str]:
        """Every breach of "each of ``num_samples`` ids exactly once per epoch" (empty: none).
        ``epochs`` (optional) also requires that many epochs to be present."""
        problems = []
        expected = range(epochs) if epochs is not None else sorted(self.counts)
        for epoch in expected:
            counts = self.counts.get(epoch, collections.Counter())
            missing = [i for i in range(num_samples) if counts[i] == 0]
            repeated = {i: c for i, c in counts.items() if c > 1}
            foreign = [i for i in counts if not 0 <= i < num_samples]
            for label, what in (("missing", missing), ("repeated", repeated)):
                if what:
                    problems.append(f"epoch {epoch}: {len(what)} ids {label}: {_head(what)}")
            if foreign:
                problems.append(f"epoch {epoch}: ids out of range: {_head(foreign)}")
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


def read_audit(directory: str | os.PathLike[str]) -> AuditReport:
    """Read every attempt's files in ``directory``; keep the committed micro-batches."""
    attempts: dict[str, Attempt] = {}
    for name, lines in read_audit_files(directory):
        head = lines[0]
        attempt = attempts.setdefault(
            name, Attempt(name, head["start_step"], head["world_size"], head["time"])
        )
        for record in lines[1:]:
            if "ids" in record:
                attempt.batches.append(record)
            elif "checkpoint_step" in record:
                attempt.checkpoints.append(record["checkpoint_step"])
            elif "end_step" in record:
                attempt.finished = True
    ordered = [attempts[k] for k in sorted(attempts)]
    counts: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    rolled_back = 0
    for i, attempt in enumerate(ordered):
        limit = ordered[i + 1].start_step if i + 1 < len(ordered) else None
        for batch in attempt.batches:
            if limit is not None and batch["step"] > limit:
                rolled_back += 1
                continue
            counts[batch["epoch"]].update(batch["ids"])
    return AuditReport(ordered, dict(counts), rolled_back)
