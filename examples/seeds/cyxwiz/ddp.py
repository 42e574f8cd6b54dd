"""CyxWiz guide, "Python API Reference": DistributedDataParallel (DDP), with the import changed.

    scripts/launch_distributed.sh 2 python examples/seeds/cyxwiz/ddp.py

The guide's snippet uses ``model``, ``input_tensor``, ``grad_tensor`` and ``optimizer`` without
defining them; the port's setup block makes a small model with a *different* random start on
every rank (so ``broadcast_parameters`` has something to do), a batch per rank, d loss / d
output as ``grad_tensor``, and ``cx.AdamOptimizer``. It prints what the test checks (lines
marked "port:"): after the wrap every rank holds rank 0's parameters, the synced gradients and
the updated parameters are the same on every rank, and ``backward`` returned d loss / d input.
"""

import torch  # port

import rankwise.compat.cyxwiz as cx

# --- port: what the guide's snippet leaves undefined ---
cx.distributed.init()
rank = cx.distributed.get_rank()
torch.manual_seed(rank)  # a different initial model on every rank, on purpose
model = (
    cx.SequentialModel().add(cx.LinearModule(6, 4)).add(cx.ReLUModule()).add(cx.LinearModule(4, 3))
)
input_tensor = torch.randn(5, 6)
grad_tensor = torch.full((5, 3), 0.2)  # d loss / d output of a loss = 0.2 * output.sum()
optimizer = cx.AdamOptimizer(0.01)
first_layer = model[0].weight  # port
# --- end of port setup ---

# Configuration
ddp_config = cx.distributed.DDPConfig()
ddp_config.broadcast_parameters = True  # Sync params from rank 0
ddp_config.bucket_size_mb = 25  # Gradient bucket size
ddp_config.find_unused_parameters = False

# Wrap model
ddp = cx.distributed.DistributedDataParallel(model, ddp_config)
start = first_layer.detach().sum().item()  # port

# Training methods
output = ddp.forward(input_tensor)
grad_output = ddp.backward(grad_tensor)
synced_grads = ddp.sync_gradients()  # AllReduce gradients
ddp.update_parameters(optimizer)  # Sync + update

# Info methods
print(  # port: the info methods, and what the test compares across ranks
    f"rank {rank}: info {ddp.is_master()} {ddp.get_rank()} {ddp.get_world_size()} "
    f"{ddp.get_model() is model} start {start!r} grad_output {tuple(grad_output.shape)} "
    f"synced {sum(g.double().sum().item() for g in synced_grads)!r} "
    f"params {sum(p.double().sum().item() for p in model.parameters())!r}"
)
cx.distributed.finalize()  # port
