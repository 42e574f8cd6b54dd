"""FRAMEWORM guide, "Monitoring: Track training across all GPUs" (a loss all-reduced).

The guide's snippet as it is (its only import is its own), on 2 processes:

    rankwise launch --nproc-per-node 2 examples/seeds/frameworm/monitoring.py

Lines marked "port:" make what the snippet leaves undefined: ``rank`` and ``world_size``
(from rankwise, which joins the launcher's group) and a ``loss`` from one VAE forward on this
rank's own data. ``.to(rank)`` puts the tensor on GPU ``rank``: without CUDA the port keeps it
on the CPU (gloo reduces CPU tensors). ``rankwise.distributed.reduce_metrics`` does the same in
one call.
"""

import torch  # port
import torch.distributed as dist

import rankwise.distributed as rd  # port
from rankwise.compat.frameworm import Config, get_model  # port

rd.init()  # port: joins the launcher's group (torch's process group underneath)
rank, world_size = rd.get_rank(), rd.get_world_size()  # port
device = rank if torch.cuda.is_available() else "cpu"  # port
torch.manual_seed(rank)  # port: each rank its own data
model = get_model("vae")(Config.from_file("examples/seeds/frameworm/config.yaml"))  # port
loss = model(torch.randn(8, model.input_dim))["loss"]  # port
print(f"rank {rank} loss {loss.item()!r}\n", end="", flush=True)  # port: one write

# Synchronize metrics across GPUs
if dist.is_initialized():
    # Reduce loss across all processes
    loss_tensor = torch.tensor([loss.item()]).to(device)  # port: .to(rank)
    dist.all_reduce(loss_tensor, op=dist.ReduceOp.SUM)
    avg_loss = loss_tensor.item() / world_size

    if rank == 0:
        print(f"Average loss across all GPUs: {avg_loss:.4f}")
