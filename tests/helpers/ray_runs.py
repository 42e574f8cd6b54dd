"""What tests/integrations/test_integrations_ray.py runs: the Ray example's trainer (examples/ray_train.py)
on Ray workers, with a crash for the restart test, and on spawned gloo ranks as the reference.

Ray's workers import this module by name: the test's Ray cluster puts tests/ and examples/ on
their PYTHONPATH.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from helpers.paths import EXAMPLES


def example() -> ModuleType:
    """examples/ray_train.py as the module ``ray_train``."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module("ray_train")


def train_crashing_once(config: dict[str, Any]) -> None:
    """The example's ``train_func``, except that rank 1 dies (``os._exit``) inside optimizer
    step ``config["crash_step"]``, once: a marker file in the storage folder keeps the
    restarted worker group from dying again. It dies ``config["crash_after_s"]`` seconds after
    reaching the step: Ray's controller collects a report only when it next polls the worker
    (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S), and a worker that dies before takes it along."""
    import rankwise.distributed as rd
    from rankwise.train import RayReport

    trainer, cfg, (x, y) = example().build(config)
    trainer.callbacks.append(RayReport())
    marker = Path(config["storage"]) / "crashed"

    def crash(trainer: Any, epoch: int, step: int, ids: Any) -> None:
        if rd.get_rank() == 1 and step + 1 == config["crash_step"] and not marker.exists():
            marker.write_text(f"{os.getpid()}\n")
            time.sleep(config["crash_after_s"])
            os._exit(1)

    trainer.on_batch = crash
    trainer.fit(x, y, cfg)


def spawn_run(storage: str, epochs: int) -> dict[str, Any]:
    """The example's trainer without Ray, on ranks from ``rankwise.testing.run_distributed``:
    the weights, steps and last loss a Ray run of the same config must reproduce."""
    trainer, cfg, (x, y) = example().build({"storage": storage, "epochs": epochs})
    history = trainer.fit(x, y, cfg)
    weights = {k: v.detach().clone() for k, v in trainer.module.state_dict().items()}
    return {"weights": weights, "steps": trainer.global_step, "loss": history.train_losses[-1]}
