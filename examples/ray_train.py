"""Running on Ray: ``DistributedTrainer.fit`` inside Ray Train's ``TorchTrainer``.

    pip install -c constraints.txt -e ".[ray,demo]"
    python examples/ray_train.py --storage /tmp/ray-run                 # a local Ray, 2 workers
    python examples/ray_train.py --address auto --workers 8 --storage /shared/ray-run

Ray starts the workers, builds their process group and restarts them after a failure
(``--max-failures``); rankwise adopts the group, gives every worker its shard, checkpoints to
STORAGE/checkpoints (a folder every node sees, or an ``s3://`` URL) and resumes from there
with ``resume="auto"``, so every sample is trained once across a failure. ``RayReport`` hands
each epoch's metrics and a pointer to its checkpoint to Ray (``result.metrics``,
``result.best_checkpoints``, Ray Tune). ``rankwise audit STORAGE/audit`` shows what each worker
trained. docs/ray.md explains each part.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rankwise.train import (
    AuditLog,
    DistributedTrainer,
    DistributedTrainingConfig,
    RayReport,
    rankwise_checkpoint,
)


def build(config: dict[str, Any]) -> tuple[DistributedTrainer, DistributedTrainingConfig, Any]:
    """The trainer, its config and the data: the same on every worker (and under ``rankwise
    launch``, where the same code runs without Ray)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)  # 1797 images of 8x8 pixels, as numpy arrays
    x = x / 16.0
    torch.manual_seed(0)  # the same initial weights on every worker
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    storage = Path(config["storage"])
    trainer = DistributedTrainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.Adam(model.parameters(), lr=3e-3),
        callbacks=[AuditLog(storage / "audit")],  # which samples each worker trained
    )
    cfg = DistributedTrainingConfig(
        epochs=config.get("epochs", 3),
        batch_size=config.get("batch_size", 32),  # per worker
        verbose=False,
        checkpoint_dir=str(storage / "checkpoints"),  # absolute, on storage every node sees
        checkpoint_every_n_steps=10,  # mid-epoch too: a restart redoes at most 10 steps
        keep_last_checkpoints=None,  # Ray's pointers name every epoch's checkpoint
        resume="auto",  # a restarted worker group goes on from the newest valid checkpoint
    )
    return trainer, cfg, (x[:1500], y[:1500])


def train_func(config: dict[str, Any]) -> None:
    """What every Ray worker runs."""
    trainer, cfg, (x, y) = build(config)
    trainer.callbacks.append(RayReport())  # each epoch: metrics and checkpoint to Ray
    trainer.fit(x, y, cfg)


def run(
    storage: str | Path,
    workers: int = 2,
    max_failures: int = 1,
    train_loop: Any = train_func,
    **config: Any,
) -> Any:
    """Train on ``workers`` Ray workers of the Ray cluster this process is connected to;
    Ray's run folder goes to STORAGE/ray. Returns Ray's ``Result``."""
    import ray.train
    from ray.train.torch import TorchTrainer

    storage = Path(storage).absolute()
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"storage": str(storage), **config},
        scaling_config=ray.train.ScalingConfig(num_workers=workers),
        run_config=ray.train.RunConfig(
            name="rankwise",
            storage_path=str(storage / "ray"),
            failure_config=ray.train.FailureConfig(max_failures=max_failures),
        ),
    )
    return trainer.fit()


def main() -> None:
    import ray

    parser = argparse.ArgumentParser()
    parser.add_argument("--storage", default="./ray-run", help="shared by every node")
    parser.add_argument("--address", default=None, help="a Ray cluster ('auto'); else local")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-failures", type=int, default=1)
    args = parser.parse_args()
    # Ray Train's placement-group cleaner warns once a second without the dashboard's State
    # API; the hook quiets that one logger in every Ray worker (docs/ray.md).
    quiet = {"worker_process_setup_hook": "rankwise.train.ray_report.quiet_ray_workers"}
    ray.init(address=args.address, include_dashboard=False, runtime_env=quiet)
    try:
        result = run(args.storage, args.workers, args.max_failures, epochs=args.epochs)
    finally:
        ray.shutdown()
    print(f"last report: {result.metrics}")
    print(f"its checkpoint: {rankwise_checkpoint(result.checkpoint)}")


if __name__ == "__main__":
    main()
