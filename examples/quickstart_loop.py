"""Quick start, the loop form: your own loop, with rankwise's sampler, wrapping and checkpoints.

    python examples/quickstart_loop.py --out /tmp/ql
    rankwise launch --nproc-per-node 2 examples/quickstart_loop.py --out /tmp/ql

A checkpoint every 10 steps holds the model, the optimizer and the sampler's cursor; run it
again with the same --out and it continues from there, mid-epoch, each sample once per epoch.
"""

import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import rankwise.distributed as rd
import rankwise.parallel as rp
import rankwise.train as rt
from rankwise.data import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--out", default="./quickstart-loop")
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

rd.init()  # a world of one under `python`, N ranks under `rankwise launch`
x, y = load_digits(return_X_y=True)
data = TensorDataset(torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y))
torch.manual_seed(0)
model = rp.wrap_model(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)))  # DDP
optimizer = torch.optim.Adam(model.parameters())
sampler = DistributedSampler(data, seed=0)  # this rank's share of one seeded global order
loader = DataLoader(data, batch_size=32, sampler=sampler)
manager = rt.CheckpointManager(f"{args.out}/checkpoints")

start_epoch, step = 0, 0
found = manager.load_latest()  # the newest *valid* checkpoint, or None
if found is not None:
    _, state = found
    rt.load_model_state_dict(model, state["model"])
    rt.load_optimizer_state_dict(model, optimizer, state["optimizer"])
    sampler.load_state_dict(state["sampler"])  # the epoch and the cursor, for any world size
    start_epoch, step = state["epoch"], state["step"]

for epoch in range(start_epoch, args.epochs):
    sampler.set_epoch(epoch)  # a new epoch rewinds the cursor; the resumed one keeps it
    for inputs, targets in loader:
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients over the ranks here
        optimizer.step()
        sampler.advance(len(inputs))  # the cursor: samples consumed, counted over all ranks
        step += 1
        if step % 10 == 0:
            state = {
                "model": rt.model_state_dict(model),  # the same keys with or without DDP
                "optimizer": rt.optimizer_state_dict(model, optimizer),
                "sampler": sampler.state_dict(),
                "epoch": epoch,
                "step": step,
            }
            if rd.is_master():
                manager.save(state, epoch=epoch, step=step)  # atomic: written, fsynced, renamed
            rd.barrier()  # no rank runs ahead of a checkpoint that is not on disk yet
    metrics = rd.reduce_metrics({"loss": loss.item()}, weight=len(inputs))  # mean over ranks
    if rd.is_master():
        consumed = sampler.state_dict()["consumed"]  # N at the end of an epoch
        print(f"epoch {epoch} step {step} loss {metrics['loss']:.3f} consumed {consumed}")
rd.finalize()
