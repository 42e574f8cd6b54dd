"""DistributedBatchIterator: the CyxWiz loop, equal counts, drop_last, resume via the sampler."""

from __future__ import annotations

import pytest

from rankwise.data import DistributedBatchIterator, DistributedSampler


def test_cyxwiz_loop_and_counts() -> None:
    sampler = DistributedSampler(dataset_size=10, num_replicas=2, rank=0, shuffle=False)
    it = DistributedBatchIterator(sampler, batch_size=2)
    assert it.num_batches() == 3 == len(it)
    got = []
    while it.has_next():
        got.append(it.next())
    assert got == [[0, 2], [4, 6], [8]]
    with pytest.raises(StopIteration):
        it.next()
    assert it.num_batches() == 3  # still the size of the pass, not what is left


def test_reset_changes_epoch_and_covers_each_rank_once() -> None:
    n, r = 103, 3
    for epoch in (0, 1):
        seen = []
        counts = set()
        for rank in range(r):
            it = DistributedBatchIterator(DistributedSampler(n, r, rank, seed=1), batch_size=8)
            it.reset(epoch=epoch)
            batches = list(it)
            counts.add(len(batches))
            seen += [i for b in batches for i in b]
        assert len(counts) == 1 and set(seen) == set(range(n)) and len(seen) == 105
    a = DistributedBatchIterator(DistributedSampler(n, 1, 0, seed=1), 8)
    first = list(a)
    a.reset(epoch=1)
    assert list(a) != first


def test_drop_last_batches() -> None:
    sampler = DistributedSampler(10, 2, 1, shuffle=False)
    it = DistributedBatchIterator(sampler, batch_size=2, drop_last=True)
    assert it.num_batches() == 2 and list(it) == [[1, 3], [5, 7]]
    assert sampler.state_dict()["consumed"] == 10  # the dropped tail counts as consumed


def test_batches_advance_the_sampler_for_resume() -> None:
    n = 50
    seen = []
    state = None
    for rank in range(4):
        sampler = DistributedSampler(n, 4, rank, seed=2)
        it = DistributedBatchIterator(sampler, batch_size=3)
        seen += it.next() + it.next()
        state = sampler.state_dict()
    assert state is not None and state["consumed"] == 24
    for rank in range(3):
        sampler = DistributedSampler(n, 3, rank)
        sampler.load_state_dict(state)
        it = DistributedBatchIterator(sampler, batch_size=3)
        assert it.num_batches() == 3  # 26 left -> 9 per rank (1 padded) -> 3 batches
        seen += [i for b in it for i in b]
    assert set(seen) == set(range(n)) and len(seen) == 51


def test_works_over_a_plain_torch_sampler() -> None:
    import torch.utils.data as tud

    it = DistributedBatchIterator(tud.DistributedSampler(range(9), 3, 0, shuffle=False), 2)
    assert list(it) == [[0, 3], [6]]


def test_bad_batch_size() -> None:
    sampler = DistributedSampler(10, 1, 0)
    with pytest.raises(ValueError, match=r"batch_size \(0\) must be >= 1"):
        DistributedBatchIterator(sampler, 0)
    with pytest.raises(ValueError, match=r"batch_size \(2.5\)"):
        DistributedBatchIterator(sampler, 2.5)  # type: ignore[arg-type]


def test_num_batches_after_reset_counts_the_next_pass() -> None:
    s = DistributedSampler(10, 1, 0, shuffle=False)
    it = DistributedBatchIterator(s, 4)
    assert it.next() == [0, 1, 2, 3]
    it.reset()  # same epoch: the next pass continues after the consumed batch
    assert it.num_batches() == 2 and list(it) == [[4, 5, 6, 7], [8, 9]]
    it.reset()  # the epoch is done: like torch, the next pass repeats it, with a warning
    assert it.num_batches() == 3
    with pytest.warns(UserWarning, match=r"epoch 0 is finished .*set_epoch\(epoch \+ 1\)"):
        assert [i for b in it for i in b] == list(range(10))
    it.reset(epoch=1)
    assert it.num_batches() == 3 and sorted(i for b in it for i in b) == list(range(10))
