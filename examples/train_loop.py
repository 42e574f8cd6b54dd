"""The README's training loop, runnable: every rankwise layer in one script.

Digits (8x8 images) with deterministic augmentation, PowerSGD-compressed DDP, bf16 autocast,
gradient accumulation, clipping, the sampler's resume cursor and exact metrics.

    python examples/train_loop.py
    rankwise launch --nproc-per-node 2 examples/train_loop.py --epochs 8
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

import rankwise.distributed as rd
import rankwise.parallel as rp
from rankwise.augment import AugmentedDataset, get_preset
from rankwise.data import DistributedSampler, contiguous_range


def digits() -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    images = torch.tensor(x / 16.0, dtype=torch.float32).view(-1, 1, 8, 8)
    labels = torch.tensor(y)
    # A fixed split: the last 360 images are the test set.
    return TensorDataset(images[:-360], labels[:-360]), images[-360:], labels[-360:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--accumulation-steps", type=int, default=2)
    args = parser.parse_args()

    rd.init()
    torch.manual_seed(0)
    train_set, x_test, y_test = digits()
    net = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    )

    sampler = DistributedSampler(train_set, seed=0)  # O(1) memory, resumable cursor
    data = AugmentedDataset(train_set, get_preset("mild"), epoch_source=sampler)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    # powersgd_start_iter: plain all-reduce for the first steps, then rank-1 compression.
    model = rp.wrap_model(net, rp.DDPConfig(compression="powersgd", powersgd_start_iter=10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    precision = rp.Precision("bf16")
    steps = args.accumulation_steps

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # new order and new augmentation, on every worker
        loss_sum, seen = 0.0, 0
        for i, (x, y) in enumerate(loader):
            last = rp.is_sync_step(i, steps, total=len(loader))
            with rp.accumulate(model, is_last=last):  # no_sync on all but the last
                with precision.autocast():
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                precision.backward(loss / steps)
            if last:
                precision.clip_grad_norm_(model, 1.0, optimizer)
                precision.step(optimizer)
                optimizer.zero_grad()
            sampler.advance(len(x))  # the resume cursor (saved by state_dict())
            loss_sum, seen = loss_sum + loss.item() * len(x), seen + len(x)
        train = rd.reduce_metrics({"loss": loss_sum / seen}, weight=seen)  # exact across ranks

        # Exact test accuracy: each rank scores one contiguous block of the real test samples.
        start, end = contiguous_range(len(x_test), rd.get_world_size(), rd.get_rank())
        with torch.no_grad():
            correct = (model(x_test[start:end]).argmax(1) == y_test[start:end]).float().mean()
        test = rd.reduce_metrics({"accuracy": correct.item()}, weight=end - start)
        if rd.is_master():
            print(
                f"epoch {epoch + 1}/{args.epochs} loss {train['loss']:.4f} "
                f"test_acc {test['accuracy']:.4f} cursor {sampler.state_dict()['consumed']}",
                flush=True,
            )
    in_sync = rp.check_parameters_in_sync(model)
    if rd.is_master():
        print(f"parameters in sync across {rd.get_world_size()} rank(s): {bool(in_sync)}")
    rd.finalize()


if __name__ == "__main__":
    main()
