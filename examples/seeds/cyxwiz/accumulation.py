"""CyxWiz guide, "Best Practices" 4: Use Gradient Accumulation for Large Models.

    scripts/launch_distributed.sh 2 python examples/seeds/cyxwiz/accumulation.py

The guide's loop with its import changed, on :class:`DistributedDataParallel`: every
``ddp.backward`` only accumulates on its rank; ``ddp.sync_gradients()`` averages over the ranks
once per window; ``ddp.update_parameters(optimizer)`` steps and clears the gradients. After the
loop the port checks the claim that makes accumulation worth having: the update equals one big
batch's, here every micro-batch of every rank of a window in one process (one SGD step per
window, so the comparison sees the gradient itself, which Adam's normalised step would hide).

What the port adds or changes (marked "port:"):

- The guide leaves ``ddp``, ``batches``, ``target``, ``loss_fn`` and ``optimizer`` undefined. The
  setup block makes 8 micro-batches of 8 rows per rank (two windows of ``accumulation_steps``)
  that all share the labels ``target`` (so the guide's ``target`` needs no per-batch lookup).
- ``loss_fn.backward(...)``: the guide elides the argument. The port passes ``loss``, the
  scaled loss, so the ``/ accumulation_steps`` reaches the gradients; called with the literal
  ``...``, ``cx.CrossEntropyLoss.backward`` raises a TypeError that says so.
"""

import torch  # port

import rankwise.compat.cyxwiz as cx

# --- port: what the guide's snippet leaves undefined ---
cx.distributed.init()
rank, world = cx.distributed.get_rank(), cx.distributed.get_world_size()
g = torch.Generator().manual_seed(11)  # the same numbers on every rank: each takes its own part
all_batches = torch.randn(world, 8, 8, 20, generator=g)  # [rank, micro-batch, row, feature]
target = torch.randint(0, 5, (8,), generator=g)  # the labels of every micro-batch


def build():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    return (
        cx.SequentialModel()
        .add(cx.LinearModule(20, 16))
        .add(cx.ReLUModule())
        .add(cx.LinearModule(16, 5))
    )


model = build()
ddp = cx.distributed.DistributedDataParallel(model, cx.distributed.DDPConfig())
batches = list(all_batches[rank])
loss_fn = cx.CrossEntropyLoss()
optimizer = cx.SGDOptimizer(0.5)
# --- end of port setup ---

accumulation_steps = 4
for i, batch in enumerate(batches):
    output = ddp.forward(batch)
    loss = loss_fn.forward(output, target) / accumulation_steps
    ddp.backward(loss_fn.backward(loss))  # port: the guide has loss_fn.backward(...)

    if (i + 1) % accumulation_steps == 0:
        ddp.sync_gradients()
        ddp.update_parameters(optimizer)

# --- port: the same two steps with one big batch per window, in this process alone ---
reference = build()
sgd = torch.optim.SGD(reference.parameters(), lr=0.5)
for window in range(2):
    rows = all_batches[:, window * 4 : (window + 1) * 4].reshape(
        -1, 20
    )  # every rank's 4 micro-batches
    torch.nn.functional.cross_entropy(reference(rows), target.repeat(world * 4)).backward()
    sgd.step()
    sgd.zero_grad()
diff = max(
    (a - b).abs().max().item()
    for a, b in zip(model.parameters(), reference.parameters(), strict=True)
)
moved = max(
    (a - b).abs().max().item()
    for a, b in zip(model.parameters(), build().parameters(), strict=True)
)
print(
    f"rank {rank}/{world}: max abs diff vs one big batch {diff:.3g}, parameters moved {moved:.3g}"
)
cx.distributed.finalize()
