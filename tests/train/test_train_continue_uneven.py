"""Uneven shares of the global batch under ``--on-failure continue`` (no processes): which
positions each rank takes (GlobalBatchShares, TrainBatches), how the cursor moves, the loss
weights that make DDP's average the global mean, and which worlds are refused.
tests/train/test_train_continue.py runs the same end to end on real ranks."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from rankwise.data import DistributedSampler
from rankwise.data.partition import global_batch_end
from rankwise.data.shares import GlobalBatchShares
from rankwise.distributed.membership import RegroupError
from rankwise.train.continuing import check_split, fits, shares_text
from rankwise.train.data import TensorPairs, TrainBatches


def world_batches(n: int, batch: int, world: int, cursor: int = 0, shuffle: bool = True):
    """Every rank's index arrays of each global batch from ``cursor``: [rank][k]."""
    out = []
    for rank in range(world):
        sampler = DistributedSampler(n, num_replicas=world, rank=rank, shuffle=shuffle, seed=3)
        sampler.advance_positions(cursor)
        out.append([a.tolist() for a in GlobalBatchShares(sampler, batch).arrays()])
    return out


def order(n: int) -> list[int]:
    """The epoch's global order (a world of one takes every position in turn)."""
    return DistributedSampler(n, num_replicas=1, rank=0, shuffle=True, seed=3).rest_indices()


@pytest.mark.parametrize(
    ("n", "batch", "world", "cursor"),
    [(192, 15, 2, 60), (192, 15, 2, 75), (100, 7, 3, 0), (90, 24, 5, 24), (50, 8, 3, 16)],
)
def test_each_global_batch_is_shared_within_one_and_keeps_its_samples(n, batch, world, cursor):
    got = world_batches(n, batch, world, cursor)
    assert len({len(rank) for rank in got}) == 1  # every rank runs the same number of steps
    end = global_batch_end(cursor, n, world, batch)  # n, or a tail padded to one per rank
    full = [order(n)[p % n] for p in range(end)]
    for k in range(len(got[0])):
        lo = cursor + k * batch
        positions = full[lo : lo + batch]
        shares = [got[r][k] for r in range(world)]
        # Rank r takes positions lo + r, lo + r + world, ...: the sizes differ by at most one.
        assert [len(s) for s in shares] == [len(positions[r::world]) for r in range(world)]
        if len(positions) == batch:
            assert [len(s) for s in shares] == [
                batch // world + (r < batch % world) for r in range(world)
            ]
        # The k-th global batch holds the same samples as for any other world (3 divides 24
        # and 15: that is the even split, the sampler's own).
        assert sorted(i for share in shares for i in share) == sorted(positions)
    taken = sorted(i for rank in got for batch_ids in rank for i in batch_ids)
    assert taken == sorted(full[cursor:])  # the rest of the epoch, each sample exactly once
    if end == n:  # ... with no padding wherever the last global batch has a sample per rank
        assert len(set(taken)) == len(taken) == n - cursor


def test_even_shares_are_the_samplers_own_split():
    even = world_batches(192, 15, 3, 45, shuffle=False)
    for rank in range(3):
        sampler = DistributedSampler(192, num_replicas=3, rank=rank, shuffle=False)
        sampler.advance(15)
        rest = sampler.rest_indices()
        assert [i for ids in even[rank] for i in ids] == rest
        assert even[rank][0] == rest[:5]


def test_a_tail_shorter_than_the_world_is_padded_one_sample_per_rank():
    assert global_batch_end(0, 31, 2, 15) == 32 and global_batch_end(0, 30, 2, 15) == 30
    assert global_batch_end(2, 31, 2, 15) == 31  # from cursor 2 the tail is 14
    got = world_batches(31, 15, 2, shuffle=False)
    assert [rank[-1] for rank in got] == [[30], [0]]  # position 31 wraps to sample 0
    # From cursor 15: [15, 30) as 5 + 5 + 5, then the tail 30 for 3 ranks: 30, 31 -> 0, 32 -> 1.
    assert [rank[-1] for rank in world_batches(31, 15, 3, 15, shuffle=False)] == [[30], [0], [1]]


def test_the_cursor_moves_by_the_whole_global_batch_and_ends_at_n():
    sampler = DistributedSampler(192, num_replicas=2, rank=1, shuffle=True, seed=0)
    shares = GlobalBatchShares(sampler, 15)
    assert len(shares) == 13  # 12 batches of 15 and one of 12
    seen = []
    for k, ids in enumerate(shares):
        seen.append(len(ids))
        assert shares.current() == (15 if k < 12 else 12)
        shares.advance()
        assert sampler.state_dict()["consumed"] == min((k + 1) * 15, 192)
    assert seen == [7] * 12 + [6]
    assert len(shares) == 0 and list(shares) == []
    resumed = DistributedSampler(192, num_replicas=3, rank=0)  # a checkpoint's cursor, any world
    resumed.load_state_dict({**sampler.state_dict(), "consumed": 75})
    assert resumed.consumed == 75


def _train_batches(monkeypatch, dataset, rank, world, **kw):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    return TrainBatches(dataset, 7, shuffle=True, seed=5, record_ids=True, **kw)


def test_train_batches_take_uneven_shares_in_memory_and_through_a_loader(monkeypatch):
    x, y = torch.arange(60.0).view(30, 2), torch.arange(30)
    in_memory, loaded = TensorPairs(x, y), TensorDataset(x, y)
    for rank in (0, 1):
        a = _train_batches(monkeypatch, in_memory, rank, 2, global_batch=15)
        b = _train_batches(monkeypatch, loaded, rank, 2, global_batch=15)
        assert a.uneven and b.uneven and len(a) == len(b) == 2
        a.set_epoch(1), b.set_epoch(1)
        got = []
        for (batch, ids), (batch_b, ids_b) in zip(a, b, strict=True):
            assert torch.equal(ids, ids_b) and torch.equal(batch[1], batch_b[1])
            assert a.loss_weight(len(ids)) == pytest.approx(len(ids) * 2 / 15)
            a.advance(len(ids))
            got.append(len(ids))
        assert got == ([8, 8] if rank == 0 else [7, 7])  # each global batch: 8 + 7
        assert a.sampler.consumed == 30


def test_train_batches_keep_the_even_split_where_the_world_divides(monkeypatch):
    x, y = torch.arange(84.0).view(42, 2), torch.arange(42)
    plain = _train_batches(monkeypatch, TensorPairs(x, y), 1, 3)
    split = _train_batches(monkeypatch, TensorPairs(x, y), 1, 3, global_batch=21)
    assert not split.uneven and split.loss_weight(7) == 1.0
    for (batch, ids), (batch_s, ids_s) in zip(plain, split, strict=True):
        assert torch.equal(ids, ids_s) and torch.equal(batch[0], batch_s[0])


def _grads(model, loss) -> torch.Tensor:
    model.zero_grad()
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize(
    ("n", "batch", "world", "accum"), [(15, 15, 2, 1), (31, 15, 4, 1), (42, 12, 5, 2)]
)
def test_weighted_share_losses_average_to_the_global_mean_gradient(n, batch, world, accum):
    """DDP averages the ranks' gradients: the weighted shares' average must be the gradient of
    the mean over each global micro-batch (divided by the accumulation window), as an even
    split gives -- including the short last global batch."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    x, y = torch.randn(n, 4), torch.randint(0, 3, (n,))
    loss_fn = torch.nn.CrossEntropyLoss()
    ranks = [DistributedSampler(n, num_replicas=world, rank=r, shuffle=False) for r in range(world)]
    shares = [GlobalBatchShares(s, batch) for s in ranks]
    batches = [list(s.arrays()) for s in shares]
    for start in range(0, len(batches[0]), accum):
        window = min(accum, len(batches[0]) - start)
        averaged = torch.zeros(())
        wanted = torch.zeros(())
        for k in range(start, start + window):
            per_rank = []
            for r in range(world):
                rows = torch.from_numpy(batches[r][k])
                weight = shares[r].weight(len(rows))
                loss = loss_fn(model(x[rows]), y[rows]) * weight / window
                per_rank.append(_grads(model, loss))
            averaged = averaged + torch.stack(per_rank).mean(0)
            lo = k * batch  # the global batch, with the padded tail's wrapped positions
            rows = torch.arange(lo, min(lo + batch, global_batch_end(0, n, world, batch))) % n
            wanted = wanted + _grads(model, loss_fn(model(x[rows]), y[rows]) / window)
            for s in shares:
                s.advance()
        assert torch.allclose(averaged, wanted, atol=1e-6), (averaged - wanted).abs().max()


def test_only_a_world_larger_than_a_micro_step_is_refused():
    check_split(15, 2, 1, "left")  # 8 + 7: fine
    check_split(24, 5, 1, "left")  # 5 + 5 + 5 + 5 + 4
    assert fits(8, 4, 2) and not fits(8, 5, 2)
    with pytest.raises(RegroupError, match=r"global batch 8 \(2 accumulation step\(s\) of 4"):
        check_split(8, 5, 2, "now")
    assert shares_text(15, 2, 1) == "1 x 8 + 1 x 7" and shares_text(24, 3, 1) == "3 x 8"
    assert shares_text(30, 2, 2) == "1 x 16 + 1 x 14"
