"""scDataset guide, "The set_epoch() Method".

    python examples/seeds/scdataset/set_epoch.py

Lines marked "port:" are not the guide's: it leaves ``dataset``, ``loader`` and ``train_step``
undefined (the port shuffles 64 rows in blocks of 4, batches of 16, one rank, and records the
order of each epoch), and it prints what the test checks. It also shows the guide's warning
("Without set_epoch(), the same data order would be used every epoch"): iterating again
without ``set_epoch`` repeats the epoch (the released scdataset would move to the next epoch
by itself; rankwise keeps the guide's rule, as torch's samplers do).
"""

import numpy as np  # port
from torch.utils.data import DataLoader  # port

from rankwise.compat.scdataset import BlockShuffling, scDataset

dataset = scDataset(np.arange(64), BlockShuffling(block_size=4), batch_size=16, seed=0)  # port
loader = DataLoader(dataset, batch_size=None)  # port
orders = []  # port


def train_step(batch):  # port: record the order the rows come in
    orders[-1].extend(batch.tolist())


for epoch in range(100):
    dataset.set_epoch(epoch)  # New shuffling for each epoch
    orders.append([])  # port
    for batch in loader:
        train_step(batch)

print(
    f"epochs {len(orders)}, each a permutation of the 64 rows: {all(sorted(o) == list(range(64)) for o in orders)}"
)  # port
print(f"distinct orders: {len({tuple(o) for o in orders})}")  # port
again = []  # port: the same loop once more, without set_epoch
for batch in loader:  # port
    again.extend(batch.tolist())  # port
print(f"without set_epoch: the order of epoch 99 again: {again == orders[-1]}")  # port
