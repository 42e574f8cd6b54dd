"""The README's first example: the same script on one process and on N.

python examples/quickstart.py
rankwise launch --nproc-per-node 2 examples/quickstart.py
"""

import torch

import rankwise.distributed as rd

rd.init()  # world of one under `python`, N ranks under a launch
rank, world = rd.get_rank(), rd.get_world_size()
loss = torch.tensor([0.25 * (rank + 1)])
rd.all_reduce(loss, op="mean")  # identity in a world of one
metrics = rd.reduce_metrics({"loss": 0.3 + 0.1 * rank, "acc": 0.9}, weight=128)
if rd.is_master():
    print(f"world {world}: mean loss {loss.item():.3f}, metrics {metrics}")
rd.finalize()
