"""DistributedTrainingHistory: per-epoch records, JSON round trip, PNG plot. Pure, no processes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rankwise.train.tracking.history import DistributedTrainingHistory


def fake_history(epochs: int = 10, classes: bool = True) -> DistributedTrainingHistory:
    history = DistributedTrainingHistory(
        world_size=2, effective_batch_size=128, samples_per_second=4321.5, total_time_seconds=9.5
    )
    for e in range(epochs):
        loss = 2.3 * math.exp(-0.4 * e) + 0.05
        acc = 1 - 0.9 * math.exp(-0.5 * e) if classes else None
        history.append_epoch(loss, acc, loss * 1.1, acc and acc * 0.98, seconds=0.9 + e / 100)
    return history


def test_append_epoch_keeps_lists_aligned() -> None:
    history = fake_history(3, classes=False)
    assert history.epochs == 3
    assert history.train_accuracies == [None, None, None]
    assert [len(history.val_losses), len(history.epoch_times)] == [3, 3]
    history.append_epoch(np.float32(0.5), None, None, None, 1)  # numpy scalars are numbers
    assert history.val_losses[-1] is None and isinstance(history.train_losses[-1], float)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((0.5, 93.0, None, None, 1.0), "train_acc (93.0) must be a fraction in [0, 1]"),
        (("0.5", None, None, None, 1.0), "train_loss ('0.5') must be a number"),
        ((0.5, None, None, -0.1, 1.0), "val_acc (-0.1)"),
    ],
)
def test_append_epoch_refuses_bad_values(args: tuple, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        DistributedTrainingHistory().append_epoch(*args)
    assert fragment in str(info.value)


def test_json_round_trip(tmp_path: Path) -> None:
    history = fake_history()
    path = history.save(tmp_path / "out" / "history.json")
    assert DistributedTrainingHistory.load(path) == history
    on_disk = json.loads(path.read_text())
    assert on_disk["world_size"] == 2 and len(on_disk["train_losses"]) == 10
    assert [p.name for p in path.parent.iterdir()] == ["history.json"]  # no temporary left


def test_from_dict_refuses_unknown_keys_and_ragged_lists() -> None:
    with pytest.raises(ValueError, match="did you mean 'train_losses'"):
        DistributedTrainingHistory.from_dict({"train_loss": [1.0]})
    with pytest.raises(ValueError, match="one entry per epoch"):
        DistributedTrainingHistory.from_dict({"train_losses": [1.0, 0.5], "epoch_times": [1.0]})


def test_load_names_a_file_that_is_not_a_history(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"train_losses": [1.0')
    with pytest.raises(ValueError, match=r"broken\.json is not a JSON history file"):
        DistributedTrainingHistory.load(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"broken\.json is not a DistributedTrainingHistory"):
        DistributedTrainingHistory.load(path)


@pytest.mark.parametrize("classes", [True, False], ids=["classes", "no-class-targets"])
def test_plot_writes_a_png_with_curves(tmp_path: Path, classes: bool) -> None:
    image_module = pytest.importorskip("matplotlib.image")
    path = fake_history(classes=classes).plot(tmp_path / "history.png")
    image = image_module.imread(path)
    height, width = image.shape[:2]
    assert width > 800 and height > 300
    rgb = image[..., :3]
    assert rgb.std() > 0.05  # not blank
    # Coloured (non-grey) pixels are the curves: both panels have some when there are classes.
    coloured = np.ptp(rgb, axis=2) > 0.3
    left, right = coloured[:, : width // 2].sum(), coloured[:, width // 2 :].sum()
    assert left > 500
    assert (right > 500) == classes


def test_plot_of_an_empty_history_still_writes(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = DistributedTrainingHistory().plot(tmp_path / "empty.png")
    assert path.stat().st_size > 1000
