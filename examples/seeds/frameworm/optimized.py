"""FRAMEWORM guide, "Mixed Precision + Gradient Compression" (PowerSGD + autocast + GradScaler).

The guide's ``train_optimized`` with its import changed: ``from torch.cuda.amp import
autocast, GradScaler`` -> ``from rankwise.compat.frameworm import autocast, GradScaler``.
torch's CUDA ones do nothing without CUDA (both warn "... CUDA is not available. Disabling":
the loop would train in float32 with no scaling while claiming mixed precision); rankwise's
autocast float16 with loss scaling on CUDA, and bfloat16 on the CPU with a pass-through scaler
(bfloat16 has float32's range: nothing to scale). PowerSGD is torch's own hook, registered as
the guide does. Run from this folder on 2 processes (the guide gives no launch line for it):

    cd examples/seeds/frameworm && python optimized.py

Lines marked "port:" add the guide's undefined ``train_loader``, the ``setup`` / ``cleanup``
of its DDP example, the CPU fallbacks of ``train_distributed.py``, ``mp.spawn`` and prints.
The guide's ``PowerSGDState`` keeps torch's default ``start_powerSGD_iter=1000``: the first
1000 steps are plain all-reduces. The port passes 2 so its 50 steps are compressed
(rankwise's ``DDPConfig(compression="powersgd")`` starts at 10).
"""

import os  # port

import torch  # port
import torch.distributed as dist  # port
from torch.nn.parallel import DistributedDataParallel as DDP  # port
from torch.utils.data import DataLoader  # port
from torch.utils.data.distributed import DistributedSampler  # port

from rankwise.compat.frameworm import (  # port: the DDP example's imports
    Config,
    GradScaler,
    autocast,
    get_model,
)

CUDA = torch.cuda.is_available()  # port


def setup(rank, world_size):  # type: ignore[no-untyped-def]  # port: the DDP example's
    dist.init_process_group(
        "nccl" if CUDA else "gloo", init_method="env://", rank=rank, world_size=world_size
    )
    if CUDA:
        torch.cuda.set_device(rank)


def cleanup():  # type: ignore[no-untyped-def]  # port: the DDP example's
    dist.destroy_process_group()


def train_optimized(rank, world_size, config):  # type: ignore[no-untyped-def]
    setup(rank, world_size)
    device = rank if CUDA else "cpu"  # port
    torch.manual_seed(0)  # port: the same data on every rank
    data = torch.randn(config.data.train_samples, config.model.input_dim)  # port
    train_loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))  # port

    model = get_model("vae")(config).to(device)  # port: .to(rank)
    model = DDP(model, device_ids=[rank] if CUDA else None)  # port: [rank]

    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    scaler = GradScaler()  # For mixed precision

    # Enable gradient compression (PowerSGD)
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    state = powerSGD_hook.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=1,
        start_powerSGD_iter=2,  # port: torch's default 1000 would not compress in 50 steps
    )
    model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)

    losses = []  # port
    for epoch in range(25):  # noqa: B007  # port: 50 (25 epochs x 2 steps = 50 steps)
        for batch in train_loader:
            batch = batch.to(device)  # port: the guide never moves the batch to the GPU
            optimizer.zero_grad()

            # Mixed precision forward
            with autocast():
                output = model(batch)
                loss = output["loss"]
            losses.append(loss.item())  # port

            # Scaled backward
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

    # port: what the test checks
    checksum = sum(p.double().sum().item() for p in model.parameters())
    print(
        f"rank {rank}: output dtype {output['recon'].dtype}, scaler enabled "
        f"{scaler.is_enabled()}, powersgd iter {state.iter} compressed-numel "
        f"{state.total_numel_after_compression}, loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
        f"checksum {checksum!r}\n",
        end="",  # one write: the ranks' lines must not interleave
        flush=True,
    )
    cleanup()


if __name__ == "__main__":  # port: the guide does not say how to run it
    import torch.multiprocessing as mp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    world_size = torch.cuda.device_count() if CUDA else 2
    mp.spawn(train_optimized, args=(world_size, Config.from_file("config.yaml")), nprocs=world_size)
