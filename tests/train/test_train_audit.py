"""AuditLog / read_audit: the committed records of several attempts, and what counts as a
violation (the check the fault-injection tests rely on must catch loss and repetition)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rankwise.train import AuditLog, DistributedTrainer, DistributedTrainingConfig, read_audit


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
