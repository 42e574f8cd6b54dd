"""TensorBrain guide, "Gradient Accumulation", and its best practice "Use no_sync()".

The guide's accumulation loop with its imports changed, run on a DDP model, then the same
loop with DDP's ``no_sync()`` on the micro-batches that do not step (the guide's best
practice 3). Both must end with the same parameters; ``no_sync`` all-reduces once per
optimizer step instead of once per micro-batch. Launched as the guide launches its scripts:

    torchrun --nproc_per_node=2 examples/seeds/tensorbrain/accumulation.py
    python -m torch.distributed.launch --nproc_per_node=2 \\
        examples/seeds/tensorbrain/accumulation.py --args

The guide's snippet runs inside its DDP script; the port sets up the group, a tiny linear
model, 64 random samples and the rank's sampler the way that script does, and counts
all-reduces with a DDP communication hook (lines marked "port:"). The second command, the
guide's ``torch.distributed.launch`` form, passes ``--local-rank`` and the guide's ``--args``:
the port accepts and ignores both.
"""

import argparse
import contextlib

import rankwise.compat.tensorbrain as tb
import rankwise.compat.tensorbrain.distributed as dist
from rankwise.compat.tensorbrain.nn.parallel import DistributedDataParallel as DDP

# port: torch.distributed.launch passes --local-rank (and the guide passes --args)
argparse.ArgumentParser().parse_known_args()
dist.init_process_group(backend="gloo")  # port: torchrun's environment says who we are
tb.manual_seed(0)
dataset = tb.utils.data.TensorDataset(tb.randn(64, 16), tb.randint(0, 4, (64,)))
train_sampler = tb.utils.data.DistributedSampler(dataset, shuffle=True, seed=1)
train_loader = tb.utils.data.DataLoader(dataset, batch_size=4, sampler=train_sampler)
criterion = tb.nn.CrossEntropyLoss()
num_epochs = 2


def count_allreduces(state, bucket):  # type: ignore[no-untyped-def]
    """port: torch's default all-reduce, counted."""
    state["allreduces"] += 1
    tensor = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda f: f.value()[0])


def build():  # type: ignore[no-untyped-def]
    """port: the same initial model on every rank and for both loops."""
    tb.manual_seed(42)
    model = DDP(tb.nn.Linear(16, 4))
    state = {"allreduces": 0}
    model.register_comm_hook(state, count_allreduces)
    return model, tb.optim.SGD(model.parameters(), lr=0.1), state


# --- the guide's loop ---
model, optimizer, guide_state = build()
accumulation_steps = 4

for epoch in range(num_epochs):
    train_sampler.set_epoch(epoch)  # port: as in the guide's DDP loop
    for batch_idx, (batch_data, batch_labels) in enumerate(train_loader):
        outputs = model(batch_data)
        loss = criterion(outputs, batch_labels) / accumulation_steps
        loss.backward()

        if (batch_idx + 1) % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
guide_model = model

# --- the same loop with no_sync() on the micro-batches that do not step ---
model, optimizer, no_sync_state = build()
for epoch in range(num_epochs):
    train_sampler.set_epoch(epoch)
    for batch_idx, (batch_data, batch_labels) in enumerate(train_loader):
        stepping = (batch_idx + 1) % accumulation_steps == 0
        with contextlib.nullcontext() if stepping else model.no_sync():
            outputs = model(batch_data)
            loss = criterion(outputs, batch_labels) / accumulation_steps
            loss.backward()

        if stepping:
            optimizer.step()
            optimizer.zero_grad()

same = all(
    tb.allclose(a, b, atol=1e-6)
    for a, b in zip(guide_model.parameters(), model.parameters(), strict=True)
)
checksum = sum(p.double().sum().item() for p in model.parameters())
print(
    f"rank {dist.get_rank()}: all-reduces {guide_state['allreduces']} (guide loop) vs "
    f"{no_sync_state['allreduces']} (no_sync), same parameters {same}, checksum {checksum!r}"
)
dist.destroy_process_group()
