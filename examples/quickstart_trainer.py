"""Quick start, the trainer form: fit, checkpoints, resume.

    python examples/quickstart_trainer.py --out /tmp/qs --epochs 1
    rankwise launch --nproc-per-node 2 examples/quickstart_trainer.py --out /tmp/qs --batch-size 16
    rankwise launch --nproc-per-node 2 --max-restarts 3 examples/quickstart_trainer.py

Run it again with the same --out (or let --max-restarts restart a crashed run): resume="auto"
continues from the newest valid checkpoint, also on another number of ranks; --batch-size 16
on 2 ranks keeps the global batch of 32 on 1, so the run goes on as if never stopped.
"""

import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn

from rankwise.train import DistributedTrainer, DistributedTrainingConfig

parser = argparse.ArgumentParser()
parser.add_argument("--out", default="./quickstart")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=32)
args = parser.parse_args()

x, y = load_digits(return_X_y=True)  # 1797 images of 8x8 pixels, as numpy arrays
x = x / 16.0
torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters()))
config = DistributedTrainingConfig(
    epochs=args.epochs,
    batch_size=args.batch_size,  # per rank: the global batch is batch_size x world size
    validation_split=0.1,
    checkpoint_dir=f"{args.out}/checkpoints",
    checkpoint_every_n_steps=10,  # mid-epoch checkpoints; a resume continues mid-epoch
    resume="auto",  # the newest valid checkpoint in checkpoint_dir, if there is one
)
history = trainer.fit(x[:1500], y[:1500], config)  # each rank trains on its own shard
loss, accuracy = trainer.evaluate(x[1500:], y[1500:])  # exact: every test sample once
if trainer.is_master():
    epochs, ranks = len(history.train_losses), trainer.get_world_size()
    print(f"epochs {epochs} steps {trainer.global_step} ranks {ranks} test accuracy {accuracy:.3f}")
