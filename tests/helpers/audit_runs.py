"""Audit folders of real-shaped runs, from a reference model of which samples each optimizer
step trains, written through :class:`rankwise.train.AuditLog`'s record API (so the files are
in the real format).

The model: each epoch's global order is a fixed permutation of the trained ids (the data set
less its validation hold-out). A world of ``R`` ranks takes it one global micro-batch of
``M`` positions at a time, rank ``r`` the positions ``c + r, c + r + R, ...`` below
``c + M``; the order is padded by wrapping (positions ``>= N`` repeat its start) up to a
multiple of ``R`` from where the split began when ``R`` divides ``M``, else only a tail
shorter than the world is padded to ``R`` (the uneven shares of ``--on-failure continue``).
An optimizer step is ``accum`` micro-batches (fewer at the epoch's end).

A run is a sequence of attempts; each but the last ends in a fault:

- ``regroup`` (``--on-failure continue``): a rank is lost in a step; the survivors go on from
  the last completed step (or from that step, when its gradient got through), with the same
  global batch (uneven shares when the world no longer divides it);
- ``rejoin``: a lost slot comes back at a step boundary;
- ``preempt``: every process is stopped in a step (SIGKILL, or SIGTERM with a ``drain``: the
  checkpoint write in flight lands and is recorded first); the relaunch, on any world size,
  resumes from the newest checkpoint that landed, or one ``back`` further (a corrupt newest).

Checkpoints every ``every`` steps are written in the background by rank 0 (or by every rank:
``all_write``) and recorded by the writers once they land (at the next save or the end);
a save may fail (a store outage: never recorded, never resumed from). The model keeps the
*committed* micro-batches as a chain that a rollback truncates, independently of how
``read_audit`` decides, so a test can replay or skip exactly one committed micro-batch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from rankwise.train import AuditLog

Call = tuple[tuple[int, int], str, tuple[Any, ...], dict[str, Any]]  # (attempt, rank), method


@dataclass
class Fault:
    kind: str  # "regroup", "rejoin", "preempt"
    after: int  # steps into the attempt
    completed: bool = False  # regroup: the lost step's gradient got through
    drain: bool = False  # preempt: SIGTERM (the write in flight lands) rather than SIGKILL
    back: int = 0  # preempt: resume from this many checkpoints before the newest
    world: int = 1  # preempt: the relaunch's world size
    torn: bool = False  # preempt: a killed rank's last line half written


@dataclass
class Plan:
    data_size: int
    held_out: list[int]
    epochs: int
    batch: int  # per rank, at the first launch (the global micro-batch is world * batch)
    accum: int
    world: int
    every: int  # checkpoint every N steps (0: only at the end)
    all_write: bool
    faults: list[Fault]
    seed: int


@dataclass
class Run:
    """What the model did: the record calls in order, which of them are the committed
    micro-batches, and the attempts (start step, world size)."""

    calls: list[Call] = field(default_factory=list)
    committed: list[int] = field(default_factory=list)  # indices into calls
    attempts: list[tuple[int, int]] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)

    def write(
        self,
        folder: Path,
        replay: int | None = None,
        skip: int | None = None,
        instead: tuple[int, int] | None = None,
    ) -> Path:
        """The audit folder; the negative controls, indices into ``committed``: ``replay``
        the one micro-batch recorded twice, ``skip`` the one not recorded, ``instead``
        ``(a, b)``: micro-batch ``a``'s samples trained again in place of ``b``'s."""
        logs: dict[tuple[int, int], AuditLog] = {}
        twice = None if replay is None else self.committed[replay]
        dropped = None if skip is None else self.committed[skip]
        calls = list(self.calls)
        if instead is not None:
            a, b = (self.committed[k] for k in instead)
            key, method, args, kwargs = calls[b]
            _, _, (_, _, ids, pad), _ = calls[a]
            calls[b] = (key, method, (args[0], args[1], ids, pad), kwargs)
        for i, (key, method, args, kwargs) in enumerate(calls):
            if method == "torn":
                logs[key].close()
                name = f"audit-{args[0]}-rank{key[1]}.jsonl"
                with open(folder / name, "a", encoding="utf-8") as f:
                    f.write('{"epoch": 0, "step": 1, "ids": [1')
                continue
            log = logs.setdefault(key, AuditLog(folder))
            if i == dropped:
                continue
            for _ in range(2 if i == twice else 1):
                getattr(log, method)(*args, **kwargs)
        for log in logs.values():
            log.close()
        return folder


class _Model:
    def __init__(self, plan: Plan) -> None:
        self.plan, self.rng = plan, random.Random(plan.seed)
        held = set(plan.held_out)
        trained = [i for i in range(plan.data_size) if i not in held]
        self.orders = [self.rng.sample(trained, len(trained)) for _ in range(plan.epochs)]
        self.n = len(trained)
        self.run = Run()
        self.t = 1_000.0
        self.chain: list[tuple[int, int]] = []  # (step, call index) of committed micro-batches
        self.history: dict[int, tuple[int, int]] = {0: (0, 0)}  # step -> (epoch, cursor)
        self.landed: list[int] = []  # steps whose checkpoint is on disk, in order
        self.pending: int | None = None  # the background write in flight (its step)
        self.slots_lost: list[int] = []
        self.pid = 100

    # -- the sampler ---------------------------------------------------------------------

    def micro_batch(self, epoch: int, c: int, s0: int, world: int, m: int) -> tuple[dict, int]:
        """Each rank's (ids, pad) of the global micro-batch at cursor ``c``, and the cursor
        after it."""
        n = self.n
        if m % world == 0:
            end = s0 + -(-(n - s0) // world) * world
            stop = min(c + m, end)
        else:
            stop = min(c + m, n) if n - c >= world else c + world
        out = {}
        for r in range(world):
            positions = list(range(c + r, stop, world))
            ids = [self.orders[epoch][p % n] for p in positions]
            out[r] = (ids, sum(p >= n for p in positions))
        return out, stop

    # -- the run -------------------------------------------------------------------------

    def call(self, key: tuple[int, int], method: str, *args: Any, **kwargs: Any) -> int:
        self.run.calls.append((key, method, args, kwargs))
        return len(self.run.calls) - 1

    def simulate(self) -> Run:
        plan = self.plan
        world, m = plan.world, plan.world * plan.batch
        slots = list(range(world))
        pids = {s: self.new_pid() for s in slots}
        step, faults = 0, list(plan.faults)
        gen = 0
        while True:
            fault = faults.pop(0) if faults else None
            step, world, m, slots, pids = self.attempt(step, world, m, slots, pids, gen, fault)
            gen += 1
            if fault is None or step < 0:
                break
        chain_ids = sorted(i for _, i in self.chain)
        self.run.committed = chain_ids
        return self.run

    def new_pid(self) -> int:
        self.pid += 1
        return self.pid

    def attempt(self, start, world, m, slots, pids, gen, fault):
        plan = self.plan
        index = len(self.run.attempts)
        self.run.attempts.append((start, world))
        self.t += 1.0
        name = f"{int(self.t * 1e6):020d}"
        keys = [(index, r) for r in range(world)]
        writers = keys if plan.all_write else keys[:1]
        for r, key in enumerate(keys):
            self.call(
                key, "open_attempt", name, rank=r, world_size=world, start_step=start,
                data_size=plan.data_size, held_out=plan.held_out, epochs=plan.epochs,
                member=(slots[r], int(pids[slots[r]] > 100 + plan.world), gen),
                pid=pids[slots[r]], at=self.t,
            )  # fmt: skip
        epoch, c = self.history[start]
        s0 = c
        step = start
        done_steps = 0
        while epoch < plan.epochs:
            if fault is not None and done_steps == fault.after:
                return self.fault(fault, step, epoch, c, s0, world, m, slots, pids, keys, writers)
            # one optimizer step: up to accum micro-batches, none past the epoch's end
            for _ in range(plan.accum):
                if c >= self.n:
                    break
                shares, c = self.micro_batch(epoch, c, s0, world, m)
                self.t += 0.05
                for r, key in enumerate(keys):
                    ids, pad = shares[r]
                    i = self.call(key, "record_batch", epoch, step + 1, ids, pad, at=self.t)
                    self.chain.append((step + 1, i))
            step += 1
            done_steps += 1
            if c >= self.n:
                epoch, c, s0 = epoch + 1, 0, 0
            self.history[step] = (epoch, c)
            if plan.every and step % plan.every == 0 and epoch < plan.epochs:
                self.save(step, writers)
        # the end of fit: the last save, durable, then every rank's end
        self.save(step, writers, final=True)
        self.t += 0.05
        for key in keys:
            self.call(key, "record_end", step, at=self.t)
        return -1, world, m, slots, pids

    def save(self, step: int, writers: list[tuple[int, int]], final: bool = False) -> None:
        """A background save at ``step``: the one in flight lands first (recorded by its
        writers); the last one of fit is waited for too. A save may fail (an outage)."""
        self.land(writers)
        if final and self.landed and self.landed[-1] == step:
            return
        self.pending = step if final or self.rng.random() >= 0.15 else None
        if final:
            self.land(writers)

    def land(self, writers: list[tuple[int, int]]) -> None:
        if self.pending is None:
            return
        self.landed.append(self.pending)
        self.t += 0.01
        for key in writers:
            self.call(key, "record_checkpoint", f"ckpt-s{self.pending:09d}.pt", 0, at=self.t)
        self.pending = None

    def rollback(self, to: int) -> None:
        self.chain = [(s, i) for s, i in self.chain if s <= to]
        self.history = {s: h for s, h in self.history.items() if s <= to}
        self.landed = [s for s in self.landed if s <= to]

    def fault(self, fault, step, epoch, c, s0, world, m, slots, pids, keys, writers):
        plan, rng = self.plan, self.rng
        if fault.kind == "rejoin" and self.slots_lost:
            back = self.slots_lost.pop(0)
            pids = {**pids, back: self.new_pid()}
            self.run.faults.append(f"rejoin slot {back} at step {step}")
            self.land(writers)
            return step, world + 1, m, sorted([*slots, back]), pids
        if fault.kind == "regroup" and world > 1:
            # some ranks recorded some micro-batches of the next step before one was lost
            shares_c, partial = c, []
            for _ in range(plan.accum):
                if shares_c >= self.n:
                    break
                shares, shares_c = self.micro_batch(epoch, shares_c, s0, world, m)
                partial.append(shares)
            lost = rng.randrange(world)
            self.t += 0.05
            if fault.completed and partial:
                for shares in partial:
                    for r, key in enumerate(keys):
                        i = self.call(key, "record_batch", epoch, step + 1, *shares[r], at=self.t)
                        self.chain.append((step + 1, i))
                step += 1
                epoch, c = (epoch + 1, 0) if shares_c >= self.n else (epoch, shares_c)
                self.history[step] = (epoch, c)
            else:
                for r, key in enumerate(keys):
                    for shares in partial[: rng.randint(0, len(partial))]:
                        self.call(key, "record_batch", epoch, step + 1, *shares[r], at=self.t)
            if lost == 0:
                self.pending = None  # the writer was lost: its write is never recorded
            else:
                self.land(writers)  # the survivors' next save (or end) waits for it
            slot = slots[lost]
            self.slots_lost.append(slot)
            self.run.faults.append(f"regroup: slot {slot} lost, from step {step}")
            left = [s for s in slots if s != slot]
            return step, world - 1, m, left, pids
        # a preemption: every process stopped in the next step
        self.t += 0.05
        partial_c = c
        if partial_c < self.n:
            shares, _ = self.micro_batch(epoch, partial_c, s0, world, m)
            for r, key in enumerate(keys):
                if rng.random() < 0.5:
                    self.call(key, "record_batch", epoch, step + 1, *shares[r], at=self.t)
        if fault.drain:
            self.land(writers)
        elif self.pending is not None and rng.random() < 0.5:
            self.landed.append(self.pending)  # it landed, the kill came before its record
        self.pending = None
        if fault.torn:
            self.call(keys[-1], "torn", self.run_name(len(self.run.attempts) - 1))
        older = [s for s in self.landed if s <= step]
        resume = older[-1 - fault.back] if len(older) > fault.back else 0
        self.rollback(resume)
        world = max(1, fault.world)
        self.slots_lost = []
        self.run.faults.append(f"preempt at step {step}, resumed from {resume} on {world}")
        return (
            resume,
            world,
            world * plan.batch,
            list(range(world)),
            {s: self.new_pid() for s in range(world)},
        )

    def run_name(self, index: int) -> str:
        head = next(c for c in self.run.calls if c[0] == (index, 0) and c[1] == "open_attempt")
        return head[2][0]


def simulate(plan: Plan) -> Run:
    """The record calls of ``plan``'s run (see the module doc)."""
    return _Model(plan).simulate()


def check_model(run: Run, plan: Plan) -> None:
    """The model's own invariant: its committed chain trains every id but the held-out ones
    exactly once per epoch (padding apart)."""
    counts: dict[int, dict[int, int]] = {}
    for i in run.committed:
        _, _, (epoch, _, ids, pad), _ = run.calls[i]
        for x in ids[: len(ids) - pad]:
            counts.setdefault(epoch, {}).setdefault(x, 0)
            counts[epoch][x] += 1
    trained = sorted(set(range(plan.data_size)) - set(plan.held_out))
    for epoch in range(plan.epochs):
        got = counts.get(epoch, {})
        assert sorted(got) == trained and set(got.values()) == {1}, (epoch, got)


@st.composite
def plans(draw: st.DrawFn, max_faults: int = 4) -> Plan:
    """Runs of every shape: validation hold-outs, padding, accumulation, checkpoints written
    by one or every rank, and up to ``max_faults`` regroups, rejoins and preemptions."""
    size = draw(st.integers(4, 40))
    held = draw(st.lists(st.integers(0, size - 1), unique=True, max_size=size // 4))
    world = draw(st.integers(1, 4))
    faults = draw(
        st.lists(
            st.builds(
                Fault,
                kind=st.sampled_from(["regroup", "rejoin", "preempt"]),
                after=st.integers(0, 8),
                completed=st.booleans(),
                drain=st.booleans(),
                back=st.integers(0, 2),
                world=st.integers(1, 4),
                torn=st.booleans(),
            ),
            max_size=max_faults,
        )
    )
    return Plan(
        data_size=size,
        held_out=sorted(held),
        epochs=draw(st.integers(1, 3)),
        batch=draw(st.integers(1, 3)),
        accum=draw(st.integers(1, 2)),
        world=world,
        every=draw(st.integers(0, 4)),
        all_write=draw(st.booleans()),
        faults=faults,
        seed=draw(st.integers(0, 2**16)),
    )


def random_plan(faults: int, seed: int = 0) -> Plan:
    """A fixed plan with ``faults`` faults of every kind (for pictures)."""
    rng = random.Random(seed)
    kinds = ["regroup", "rejoin", "preempt"]
    return Plan(
        data_size=600,
        held_out=sorted(rng.sample(range(600), 60)),
        epochs=3,
        batch=4,
        accum=1,
        world=4,
        every=5,
        all_write=False,
        faults=[
            Fault(
                kinds[i % 3],
                after=rng.randint(2, 8),
                drain=i % 2 == 0,
                back=i % 4 == 3,
                world=rng.randint(2, 4),
                completed=i % 5 == 0,
            )
            for i in range(faults)
        ],
        seed=seed,
    )


def audited_fit(folder: Path, on_batch: Any) -> None:
    """One rank's fit of 8 steps with AuditLog(folder / "audit"), a background checkpoint
    every 4 steps into folder / "ckpt", and ``on_batch`` as the trainer's hook."""
    import torch

    from rankwise.train import DistributedTrainer, DistributedTrainingConfig

    torch.manual_seed(0)
    net = torch.nn.Linear(6, 3)
    trainer = DistributedTrainer(
        net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
        callbacks=[AuditLog(folder / "audit")],
    )  # fmt: skip
    trainer.on_batch = on_batch
    cfg = DistributedTrainingConfig(
        epochs=1, batch_size=8, verbose=False, checkpoint_dir=str(folder / "ckpt"),
        checkpoint_every_n_steps=4,
    )  # fmt: skip
    trainer.fit(torch.randn(64, 6), torch.randint(0, 3, (64,)), cfg)
