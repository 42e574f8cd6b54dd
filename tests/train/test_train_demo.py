"""`rankwise demo` on the trainer: 2 real ranks, the promised accuracy, its output folder."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rankwise.cli import fresh_run_folder
from rankwise.demo import demo_config
from rankwise.testing import child_env, run_isolated


@pytest.mark.timeout(300)
def test_demo_trains_to_the_promised_accuracy_and_leaves_its_files(tmp_path: Path) -> None:
    # In a clone (a git work tree), after an earlier run in the same --out: the run gets a
    # fresh folder (the earlier one's metrics.csv is not continued), git sees nothing new,
    # and the console's training time is history.png's title's.
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    out = tmp_path / "rankwise-demo"
    earlier = out / "run-20000101-000000" / "logs"
    earlier.mkdir(parents=True)
    (earlier / "metrics.csv").write_text("an earlier run's log\n")
    cmd = [sys.executable, "-m", "rankwise.cli", "demo", f"--out={out}", "epochs=12"]
    proc = run_isolated(cmd, env=child_env(), timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    assert text.count("epoch 1/12 done") == 1, "per-epoch lines must come from rank 0 only"
    assert len(re.findall(r"^epoch \d+/12 done: train_loss [\d.]+", text, re.M)) == 12
    match = re.search(r"final test accuracy: ([\d.]+) over (\d+) samples \(2 ranks", text)
    assert match, text
    assert float(match.group(1)) >= 0.93
    assert int(match.group(2)) == 359  # every test sample exactly once
    [named] = re.findall(r"output in (\S+)$", text, re.M)
    run = Path(named)
    assert run.parent == out and run.name.startswith("run-") and run != earlier.parent
    assert (earlier / "metrics.csv").read_text() == "an earlier run's log\n"
    history = json.loads((run / "history.json").read_text())
    assert len(history["train_losses"]) == 12 and history["world_size"] == 2
    assert (run / "history.png").stat().st_size > 0
    with open(run / "logs" / "metrics.csv", newline="") as f:
        steps = [int(r["global_step"]) for r in csv.DictReader(f) if r["kind"] == "step"]
    assert steps[0] <= 5 and steps == sorted(steps) and len(steps) > 12  # one run, from 1
    assert sorted((run / "checkpoints").glob("*.pt")), "checkpoints in the run's folder"
    trained = re.search(r"trained in ([\d,.]+) s", text)
    assert trained and trained.group(1) == f"{history['total_time_seconds']:,.1f}"
    untracked = subprocess.run(
        ["git", "-C", str(tmp_path), "status", "--porcelain", "--untracked-files=all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert untracked == "", untracked


def test_each_demo_run_gets_a_fresh_folder(tmp_path: Path) -> None:
    now = 1_700_000_000.0
    first, second = fresh_run_folder(tmp_path, now), fresh_run_folder(tmp_path, now)
    assert first != second and second.name == f"{first.name}-2"
    assert first.is_dir() and second.is_dir() and not any(first.iterdir())
    assert (tmp_path / ".gitignore").read_text().splitlines()[-1] == "*"


def test_demo_config_file_and_overrides(tmp_path: Path) -> None:
    default = demo_config(tmp_path, None, ["epochs=3", "precision=bf16"])
    assert (default.epochs, default.precision, default.batch_size) == (3, "bf16", 32)
    assert default.checkpoint_dir == str(tmp_path / "checkpoints")
    yaml_file = tmp_path / "cfg.yaml"
    default.to_yaml(yaml_file)
    loaded = demo_config(tmp_path, str(yaml_file), ["batch_size=16"])
    assert (loaded.epochs, loaded.batch_size) == (3, 16)
    with pytest.raises(ValueError, match="epochs"):
        demo_config(tmp_path, None, ["epoch=3"])


def test_demo_refuses_a_bad_override_before_launching() -> None:
    cmd = [sys.executable, "-m", "rankwise.cli", "demo", "precision=fp8"]
    proc = run_isolated(cmd, env=child_env(), timeout=60)
    assert proc.returncode == 2
    assert "precision" in proc.stderr and "fp8" in proc.stderr
