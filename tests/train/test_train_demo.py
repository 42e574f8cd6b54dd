"""`rankwise demo` on the trainer: 2 real ranks, the promised accuracy, its output folder."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from rankwise.demo import demo_config
from rankwise.testing import child_env, run_isolated


@pytest.mark.timeout(300)
def test_demo_trains_to_the_promised_accuracy_and_leaves_its_files(tmp_path: Path) -> None:
    out = tmp_path / "demo"
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
    history = json.loads((out / "history.json").read_text())
    assert len(history["train_losses"]) == 12 and history["world_size"] == 2
    assert (out / "history.png").stat().st_size > 0
    assert (out / "logs" / "metrics.csv").read_text().count("\n") > 12
    assert sorted((out / "checkpoints").glob("*.pt")), "checkpoints in --out"


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
