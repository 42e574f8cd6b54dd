"""AuditLog / read_audit: the committed records of several attempts, and what counts as a
violation (the check the fault-injection tests rely on must catch loss and repetition).

The verdict is a pure function of the audit files, so it is checked as a property over
generated folders (``helpers.audit_runs``: a reference model of which samples each optimizer
step trains, through regroups, rejoins, preemptions, resumes from older checkpoints, drains,
validation hold-outs, padding and accumulation, written through AuditLog's record API): a
correct run always passes, and one replayed, skipped or substituted micro-batch always fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.audit_runs import audited_fit, check_model, plans, simulate
from rankwise.testing import child_env
from rankwise.train import AuditLog, DistributedTrainer, DistributedTrainingConfig, read_audit
from rankwise.train.audit.timeline import read_timeline, summary
from rankwise.train.checkpoint import set_fault_hook


def write_attempt(folder: Path, name: str, start: int, steps: range, ids_per_step: int = 2) -> None:
    """One rank's file: step s consumed ids [(s-1)*n, s*n) of epoch 0."""
    lines = [{"start_step": start, "rank": 0, "world_size": 1, "time": float(name)}]
    for s in steps:
        ids = list(range((s - 1) * ids_per_step, s * ids_per_step))
        lines.append({"epoch": 0, "step": s, "ids": ids, "time": 0.0})
    text = "".join(json.dumps(line) + "\n" for line in lines)
    (folder / f"audit-{name}-rank0.jsonl").write_text(text)


def test_rolled_back_steps_are_not_counted(tmp_path):
    write_attempt(tmp_path, "001", 0, range(1, 9))  # killed in step 8
    write_attempt(tmp_path, "002", 6, range(7, 11))  # resumed from the step-6 checkpoint
    report = read_audit(tmp_path)
    assert [a.start_step for a in report.attempts] == [0, 6]
    assert report.rolled_back == 2
    assert report.violations(20, epochs=1) == []


def test_a_resume_past_unsaved_steps_loses_samples(tmp_path):
    write_attempt(tmp_path, "001", 0, range(1, 7))
    write_attempt(tmp_path, "002", 8, range(9, 11))  # steps 7-8 never trained
    problems = read_audit(tmp_path).violations(20, epochs=1)
    assert problems == ["epoch 0: 4 ids missing: [12, 13, 14, 15]"]


def test_a_fresh_restart_repeats_samples(tmp_path):
    write_attempt(tmp_path, "001", 0, range(1, 4))  # its steps stay committed: nothing rolled back
    write_attempt(tmp_path, "002", 3, range(1, 11))
    problems = read_audit(tmp_path).violations(20, epochs=1)
    assert problems == ["epoch 0: 6 ids repeated: [(0, 2), (1, 2), (2, 2), (3, 2), (4, 2), (5, 2)]"]


def test_a_torn_last_line_is_ignored_and_missing_epochs_reported(tmp_path):
    write_attempt(tmp_path, "001", 0, range(1, 11))
    with open(tmp_path / "audit-001-rank0.jsonl", "a") as f:
        f.write('{"epoch": 0, "step": 11, "ids": [1')  # a kill mid-line
    report = read_audit(tmp_path)
    assert report.violations(20, epochs=1) == []
    assert report.violations(20, epochs=2)[0].startswith("epoch 1: 20 ids missing")


def test_needs_the_trainers_sampler(tmp_path):
    net = torch.nn.Linear(4, 2)
    trainer = DistributedTrainer(
        net,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(net.parameters(), lr=0.1),
        callbacks=[AuditLog(tmp_path)],
    )
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,))), batch_size=4
    )
    cfg = DistributedTrainingConfig(epochs=1, verbose=False, checkpoint_dir=None)
    with pytest.raises(ValueError, match="pass arrays or a Dataset"):
        trainer.fit(loader, config=cfg)


# -- the verdict as a property of generated runs -------------------------------------------


@settings(max_examples=120, deadline=None)
@given(plan=plans())
def test_a_correct_run_always_passes(plan: Any) -> None:
    run = simulate(plan)
    check_model(run, plan)  # the model itself trains each id once per epoch
    with tempfile.TemporaryDirectory() as folder:
        report = read_audit(run.write(Path(folder)))
        assert report.violations() == [], run.faults  # no flags: the header says the data
        assert report.violations(plan.data_size, plan.epochs) == []  # --samples agrees
        assert (report.data_size, list(report.held_out)) == (plan.data_size, plan.held_out)
        lines, problems = summary(read_timeline(folder), report)
        assert problems == [] and any("exactly once: ok" in line for line in lines), lines


@settings(max_examples=120, deadline=None)
@given(plan=plans(), data=st.data())
def test_one_replayed_or_skipped_micro_batch_always_fails(plan: Any, data: st.DataObject) -> None:
    run = simulate(plan)
    which = st.integers(0, len(run.committed) - 1)
    fault = data.draw(st.sampled_from(["replay", "skip", "instead"]))
    with tempfile.TemporaryDirectory() as folder:
        if fault == "instead":  # another committed micro-batch of the epoch trained again
            b = data.draw(which)
            epoch = run.calls[run.committed[b]][2][0]
            others = [
                a for a in range(len(run.committed))
                if a != b and run.calls[run.committed[a]][2][0] == epoch
            ]  # fmt: skip
            if not others:
                return
            run.write(Path(folder), instead=(data.draw(st.sampled_from(others)), b))
        else:
            run.write(Path(folder), **{fault: data.draw(which)})
        assert read_audit(folder).violations() != [], (fault, run.faults)


def test_a_resume_before_a_regroups_start_rolls_both_attempts_back(tmp_path):
    # Found on main: attempt 1 regrouped at step 10, attempt 2 was preempted at 14 and
    # attempt 3 resumed from the step-8 checkpoint: steps 9-10 of attempt 1 were counted too.
    write_attempt(tmp_path, "001", 0, range(1, 11))
    write_attempt(tmp_path, "002", 10, range(11, 15))
    write_attempt(tmp_path, "003", 8, range(9, 21))
    report = read_audit(tmp_path)
    assert report.violations(40, epochs=1) == []
    assert report.rolled_back == 2 + 4


def test_records_without_the_data_set_need_its_size(tmp_path):
    write_attempt(tmp_path, "001", 0, range(1, 11))  # a header of before data_size
    report = read_audit(tmp_path)
    assert report.data_size is None
    with pytest.raises(ValueError, match="pass num_samples"):
        report.violations()
    assert report.violations(20) == []


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(4, 40),  # at least the world
    worlds=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    per_rank=st.integers(1, 3),
    first=st.integers(0, 6),
    seed=st.integers(0, 99),
)
def test_padding_names_exactly_the_samplers_duplicates(
    size: int, worlds: tuple[int, int], per_rank: int, first: int, seed: int
) -> None:
    """What ``before_backward`` records as padding, against the real sampler: an epoch begun
    on one world and finished on another (a regroup keeps the global batch: uneven shares
    where the new world does not divide it) trains every id once, the rest is padding."""
    from rankwise.data import DistributedSampler
    from rankwise.data.shares import GlobalBatchShares
    from rankwise.train.audit import padding

    one, two = worlds
    batch = one * per_rank
    two = min(two, batch)  # a world never outgrows the global batch (continuing.fits)
    trained: list[int] = []
    pads: list[int] = []

    def take(sampler: DistributedSampler, chunk: list[int]) -> None:
        pad = padding(sampler, len(chunk))
        trained.extend(chunk[: len(chunk) - pad])
        pads.extend(chunk[len(chunk) - pad :])

    state = None
    for r in range(one):  # the first world: `first` micro-batches (or the whole epoch)
        sampler = DistributedSampler(size, num_replicas=one, rank=r, seed=seed)
        rest = sampler.rest_indices()
        for k in range(0, min(len(rest), first * per_rank), per_rank):
            take(sampler, rest[k : k + per_rank])
            sampler.advance(len(rest[k : k + per_rank]))
        state = sampler.state_dict()
    for r in range(two):  # the rest of the epoch on the second world
        sampler = DistributedSampler(size, num_replicas=two, rank=r, seed=seed)
        assert state is not None
        sampler.load_state_dict(state)
        if sampler.remaining() == 0:
            break
        if batch % two:
            shares = GlobalBatchShares(sampler, batch)
            for chunk in list(shares.arrays()):
                take(sampler, chunk.tolist())
                shares.advance()
        else:
            rest, step = sampler.rest_indices(), batch // two
            for k in range(0, len(rest), step):
                take(sampler, rest[k : k + step])
                sampler.advance(len(rest[k : k + step]))
    assert sorted(trained) == list(range(size))
    assert len(pads) < max(worlds)


# -- checkpoints: recorded by the rank that wrote them, once they landed --------------------


def _checkpoints(folder: Path) -> list[int]:
    lines = [
        json.loads(x) for f in folder.glob("audit-*.jsonl") for x in f.read_text().splitlines()
    ]
    return [r["checkpoint_step"] for r in lines if "checkpoint_step" in r]


def test_the_write_an_exception_drained_is_recorded(tmp_path: Path) -> None:
    # Found on main: the checkpoint was reported only at the next save or the end of fit.
    def slow_pointer(point: str) -> None:
        if point == "before-pointer":
            time.sleep(0.3)

    def fail(trainer: Any, epoch: int, step: int, ids: Any) -> None:
        if step == 5:
            raise KeyboardInterrupt

    set_fault_hook(slow_pointer)
    try:
        with pytest.raises(KeyboardInterrupt):
            audited_fit(tmp_path, fail)
    finally:
        set_fault_hook(None)
    assert _checkpoints(tmp_path / "audit") == [4]
    assert read_audit(tmp_path / "audit").attempts[0].checkpoints == [4]


_SIGTERM_SCRIPT = """
import os, signal, sys, time
from pathlib import Path
from rankwise.train.checkpoint import set_fault_hook
from helpers.audit_runs import audited_fit

def slow_pointer(point):
    if point == "before-pointer":
        time.sleep(1.0)

def preempt(trainer, epoch, step, ids):
    if step == 5:  # the save at step 4 is being written
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)

set_fault_hook(slow_pointer)
audited_fit(Path(sys.argv[1]), preempt)
"""


def test_the_write_a_sigterm_drained_is_recorded(tmp_path: Path) -> None:
    # Found on main: `rankwise audit` listed no checkpoint, though step 4's had landed.
    script = tmp_path / "preempted.py"
    script.write_text(textwrap.dedent(_SIGTERM_SCRIPT))
    env = child_env()  # and the tests' folder, for helpers.audit_runs
    env["PYTHONPATH"] = f"{Path(__file__).parents[1]}{os.pathsep}{env['PYTHONPATH']}"
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == -signal.SIGTERM, result.stderr[-3000:]
    assert (tmp_path / "ckpt" / "ckpt-e000000-s000000004.pt").exists()
    assert _checkpoints(tmp_path / "audit") == [4]
