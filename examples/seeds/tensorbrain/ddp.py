"""TensorBrain guide, "Distributed Data Parallel: Multi-GPU, Single Machine".

The guide's code with its imports changed, launched as the guide launches it:

    torchrun --nproc_per_node=2 examples/seeds/tensorbrain/ddp.py

What a port must add or change is marked "port:":

- The guide's snippet uses ``rank``, ``train_dataset``, ``num_epochs``, ``criterion`` and
  ``optimizer`` without defining them: the port reads the rank torchrun gives each process,
  makes 8 random 3x32x32 images, runs 2 epochs, and uses the loss and optimizer of the guide's
  DataParallel example.
- It calls ``torch.cuda.set_device(rank)`` without importing torch; the port spells it
  ``tb.cuda.set_device``. Its ``backend='nccl'``, ``model.to(rank)`` and
  ``device_ids=[rank]`` need one GPU per rank: without CUDA the port uses gloo and the CPU
  (the guide's comment names gloo as the alternative).
- ``world_size=4`` becomes the launched world size, so any ``--nproc_per_node`` works.
"""

import os

import rankwise.compat.tensorbrain as tb
import rankwise.compat.tensorbrain.distributed as dist
from rankwise.compat.tensorbrain.nn.parallel import DistributedDataParallel as DDP

rank = int(os.environ["LOCAL_RANK"])  # port: one machine, so the local rank is the rank
cuda = tb.cuda.is_available()  # port
tb.manual_seed(0)  # port: the same initial model and data on every rank
train_dataset = tb.utils.data.TensorDataset(tb.rand(8, 3, 32, 32), tb.randint(0, 1000, (8,)))
num_epochs = 2

# Initialize process group
dist.init_process_group(
    backend="nccl" if cuda else "gloo",  # or 'gloo'
    world_size=int(os.environ["WORLD_SIZE"]),  # port: the guide has 4
    rank=rank,
)

# Set device based on rank
if cuda:  # port
    tb.cuda.set_device(rank)
device = rank if cuda else "cpu"  # port

# Create model
model = tb.nn.ResNet50()
model = model.to(device)
model = DDP(model, device_ids=[rank] if cuda else None)
criterion = tb.nn.CrossEntropyLoss()  # port: from the guide's DataParallel example
optimizer = tb.optim.Adam(model.parameters())  # port: likewise

# Create sampler for distributed data loading
train_sampler = tb.utils.data.DistributedSampler(
    train_dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=True
)

train_loader = tb.utils.data.DataLoader(train_dataset, batch_size=32, sampler=train_sampler)

# Training loop
for epoch in range(num_epochs):
    train_sampler.set_epoch(epoch)  # Ensures different shuffling each epoch
    print(f"rank {rank} epoch {epoch} samples {list(train_sampler)}")  # port

    for batch_data, batch_labels in train_loader:
        batch_data = batch_data.to(device)
        batch_labels = batch_labels.to(device)

        outputs = model(batch_data)
        loss = criterion(outputs, batch_labels)

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

# port: the ranks' models must be identical after DDP's synchronised steps
checksum = sum(p.double().sum().item() for p in model.parameters())
print(f"rank {rank} parameter checksum {checksum!r}")
dist.destroy_process_group()
