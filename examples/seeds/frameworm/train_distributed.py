"""FRAMEWORM guide, "DistributedDataParallel (Recommended)" and "Multi-Machine Training".

The guide's ``train_distributed.py`` with its import changed (``from frameworm import ...`` ->
``from rankwise.compat.frameworm import ...``), launched as the guide launches it, from this
folder (where ``config.yaml`` is):

    cd examples/seeds/frameworm && python train_distributed.py

and on two machines with the guide's variables (2 processes each on CPUs):

    MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 WORLD_SIZE=4 RANK=0 python train_distributed.py
    MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 WORLD_SIZE=4 RANK=2 python train_distributed.py

What a port must add or change is marked "port:":

- The guide leaves ``train_dataset`` and ``val_loader`` undefined and never imports
  ``DataLoader``: the port makes them (``config.data``: 64 training, 16 validation samples).
- ``backend='nccl'``, ``torch.cuda.set_device``, ``.to(rank)`` and ``device_ids=[rank]`` need
  one GPU per process: without CUDA the port uses gloo and the CPU, and 2 processes.
- ``init_method='env://'`` needs MASTER_ADDR and MASTER_PORT, which the guide sets only for
  several machines: on one machine the port defaults them to 127.0.0.1:29500.
- ``num_workers=4`` stays on GPUs; on the CPU the port loads in the process (0): on the
  2-core test machine, 4 loader workers forked inside each of ``mp.spawn``'s processes
  stalled (a plain torch script, spawn + gloo + ``DataLoader(num_workers=4)``, stalls there
  the same way), and 64 in-memory samples need no workers.
- Multi-machine: the guide's script ignores the RANK and WORLD_SIZE it exports (each machine
  would start ranks 0..3 of a world of its own GPU count, so two machines never meet). The
  port reads them as the guide means them, RANK = this machine's first rank and WORLD_SIZE =
  all processes, and gives each process its global rank, as a launcher would (also in the
  RANK / WORLD_SIZE / LOCAL_RANK variables, which rankwise reads). A process's GPU is its
  local rank: the guide's ``set_device(rank)`` with rank 4 fails on a 4-GPU machine.
"""

import os  # port

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader  # port: used by the guide, not imported there
from torch.utils.data.distributed import DistributedSampler

from rankwise.compat.frameworm import Config, Trainer, get_model

CUDA = torch.cuda.is_available()  # port


def make_data(config):  # type: ignore[no-untyped-def]  # port: the guide's undefined data
    """Samples near a 4-dimensional subspace of config.model.input_dim features."""
    g = torch.Generator().manual_seed(0)  # the same data on every process
    n = config.data.train_samples + config.data.val_samples
    basis = torch.randn(4, config.model.input_dim, generator=g)
    x = torch.randn(n, 4, generator=g) @ basis
    x += 0.1 * torch.randn(n, config.model.input_dim, generator=g)
    return x[: config.data.train_samples], x[config.data.train_samples :]


def setup(rank, world_size):  # type: ignore[no-untyped-def]
    """Initialize distributed training"""
    dist.init_process_group(
        backend="nccl" if CUDA else "gloo",  # port: 'nccl'
        init_method="env://",
        rank=rank,
        world_size=world_size,
    )
    if CUDA:  # port
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # port: rank


def cleanup():  # type: ignore[no-untyped-def]
    """Clean up distributed training"""
    dist.destroy_process_group()


def train_ddp(rank, world_size, config):  # type: ignore[no-untyped-def]
    """Train with DDP"""
    local_rank, rank = rank, int(os.environ.get("RANK", 0)) + rank  # port: global rank
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank)
    )  # port
    device = local_rank if CUDA else "cpu"  # port
    train_dataset, val_dataset = make_data(config)  # port
    val_loader = DataLoader(val_dataset, batch_size=16)  # port

    setup(rank, world_size)

    # Create model on current GPU
    torch.manual_seed(rank)  # port: different initial weights per rank; DDP syncs rank 0's
    model = get_model("vae")(config).to(device)  # port: .to(rank)
    model = DDP(model, device_ids=[local_rank] if CUDA else None)  # port: [rank]

    # Distributed sampler
    train_sampler = DistributedSampler(
        train_dataset, num_replicas=world_size, rank=rank, shuffle=True
    )

    train_loader = DataLoader(
        train_dataset,
        batch_size=128 // world_size,  # Split batch across GPUs
        sampler=train_sampler,
        num_workers=4 if CUDA else 0,  # port: 4 (see the docstring)
        pin_memory=CUDA,  # port: True (no memory to pin for without CUDA)
    )

    # Optimizer
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)

    # Trainer
    trainer = Trainer(model, optimizer, device=device, verbose=False)  # port: device=rank, quiet
    history = trainer.train(train_loader, val_loader, epochs=50)  # port: `history =`

    # port: what the test checks; DDP keeps every rank's parameters identical
    checksum = sum(p.double().sum().item() for p in model.parameters())
    print(
        f"rank {rank}/{world_size} local {local_rank} trained {type(trainer.model).__name__}; "
        f"loss {history.train_losses[0]:.4f} -> {history.train_losses[-1]:.4f}, "
        f"val {history.val_losses[-1]:.4f}, checksum {checksum!r}\n",
        end="",  # one write: the ranks' lines must not interleave
        flush=True,
    )
    cleanup()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    world_size = torch.cuda.device_count() if CUDA else 2  # port: 2 CPU processes
    nprocs = world_size  # port: this machine's processes; the world may be larger:
    world_size = int(os.environ.get("WORLD_SIZE", world_size))  # port: multi-machine total
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # port: env:// needs them
    os.environ.setdefault("MASTER_PORT", "29500")  # port
    config = Config.from_file("config.yaml")

    # Spawn processes
    mp.spawn(
        train_ddp,
        args=(world_size, config),
        nprocs=nprocs,  # port: world_size
        join=True,
    )
