"""TensorBrain guide, "Synchronization and Barriers" and "Communication Collectives".

The guide's code with its imports changed. Its scatter sends a list of 3 tensors, which
torch accepts only in a world of 3, so this port is launched on 3 ranks:

    torchrun --nproc_per_node=3 examples/seeds/tensorbrain/collectives.py

The guide's snippets run inside an initialised job: the port initialises the group with gloo
from torchrun's environment, and prints each result (lines marked "port:").
"""

import rankwise.compat.tensorbrain as tb
import rankwise.compat.tensorbrain.distributed as dist

dist.init_process_group(backend="gloo")  # port

# --- Synchronization and Barriers ---
# Synchronize all processes
dist.barrier()

# All-reduce operations
if dist.get_rank() == 0:  # noqa: SIM108 (the guide's code)
    tensor = tb.tensor([1.0, 2.0, 3.0])
else:
    tensor = tb.tensor([0.0, 0.0, 0.0])

# Sum across all ranks
dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
print(f"Rank {dist.get_rank()}: {tensor}")  # All ranks see [1.0, 2.0, 3.0]

# --- Communication Collectives ---
# All-gather
tensor_list = [tb.empty_like(tensor) for _ in range(dist.get_world_size())]
dist.all_gather(tensor_list, tensor)
print(f"Rank {dist.get_rank()}: all_gather {[t.tolist() for t in tensor_list]}")  # port

# Broadcast
if dist.get_rank() == 0:  # noqa: SIM108 (the guide's code)
    broadcast_tensor = tb.tensor([1.0, 2.0, 3.0])
else:
    broadcast_tensor = tb.zeros(3)

dist.broadcast(broadcast_tensor, src=0)
print(f"Rank {dist.get_rank()}: broadcast {broadcast_tensor.tolist()}")  # port

# Scatter
if dist.get_rank() == 0:
    scatter_list = [tb.tensor([1.0]), tb.tensor([2.0]), tb.tensor([3.0])]
else:
    scatter_list = [None]

tensor = tb.empty(1)
dist.scatter(tensor, scatter_list if dist.get_rank() == 0 else None, src=0)
print(f"Rank {dist.get_rank()}: scatter {tensor.tolist()}")  # port
dist.destroy_process_group()  # port
