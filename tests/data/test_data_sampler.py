"""DistributedSampler: torch's rule, the shuffle, O(1) memory, errors; the cursor is in
test_data_resume.py."""

from __future__ import annotations

import tracemalloc
import warnings

import pytest
import torch
import torch.utils.data as tud

from rankwise.data import DistributedSampler, Permutation


def world(n: int, r: int, **kw: object) -> list[list[int]]:
    return [list(DistributedSampler(n, r, rank, **kw)) for rank in range(r)]  # type: ignore[arg-type]


@pytest.mark.parametrize("drop_last", [False, True])
def test_unshuffled_equals_torch(drop_last: bool) -> None:
    for n in range(0, 26):
        for r in range(1, 7):
            for rank in range(r):
                theirs = tud.DistributedSampler(
                    range(n), r, rank, shuffle=False, drop_last=drop_last
                )
                ours = DistributedSampler(n, r, rank, shuffle=False, drop_last=drop_last)
                assert list(ours) == list(theirs), (n, r, rank)
                assert len(ours) == len(theirs)


@pytest.mark.parametrize(("n", "r"), [(10, 4), (23, 4), (3, 5), (1, 8), (1000, 7), (64, 8)])
def test_shuffled_padding_rule(n: int, r: int) -> None:
    """Global order = perm + perm[:pad] (wrapping), dealt strided; drop_last trims."""
    sampler = DistributedSampler(n, r, 0, seed=5)
    sampler.set_epoch(2)
    perm = Permutation(n, 5, 2).take(0, n).tolist()
    padded = -(-n // r) * r
    order = [perm[p % n] for p in range(padded)]
    got = []
    for rank in range(r):
        s = DistributedSampler(n, r, rank, seed=5)
        s.set_epoch(2)
        part = list(s)
        assert part == order[rank::r] and len(s) == padded // r == s.num_samples
        got += part
    assert set(got) == set(range(n)) and len(got) == padded == sampler.total_size
    trimmed = world(n, r, seed=5, drop_last=True)
    flat = [i for part in trimmed for i in part]
    assert len(flat) == len(set(flat)) == n // r * r
    assert {len(p) for p in trimmed} == {n // r}


def test_epochs_reshuffle_and_are_reproducible() -> None:
    s = DistributedSampler(1000, 2, 0, seed=3)
    first = list(s)
    with pytest.warns(UserWarning, match=r"set_epoch\(epoch \+ 1\)"):
        assert list(s) == first  # iterating twice in an epoch gives the same order (torch's)
    s.set_epoch(1)
    assert list(s) != first and sorted(list(s)) != sorted(first)  # a different half, too
    s.set_epoch(0)
    assert list(s) == first
    assert list(DistributedSampler(1000, 2, 0, seed=4)) != first
    # seed 0 epoch 1 and seed 1 epoch 0 differ (no seed + epoch)
    a, b = DistributedSampler(1000, 1, 0, seed=0), DistributedSampler(1000, 1, 0, seed=1)
    a.set_epoch(1)
    assert list(a) != list(b)


def test_torch_attributes_with_torch_meaning() -> None:
    # Whatever the input (an int, a dataset), the attributes are torch's, with torch's values.
    for data in (10, range(10), torch.arange(10)):
        for drop_last in (False, True):
            ours = DistributedSampler(data, 4, 3, seed=42, drop_last=drop_last)  # type: ignore[arg-type]
            theirs = tud.DistributedSampler(range(10), 4, 3, seed=42, drop_last=drop_last)
            assert isinstance(ours, tud.DistributedSampler)
            for name in ("num_replicas", "rank", "epoch", "seed", "shuffle", "drop_last"):
                assert getattr(ours, name) == getattr(theirs, name), name
            for name in ("num_samples", "total_size"):
                assert type(getattr(ours, name)) is int, name
                assert getattr(ours, name) == getattr(theirs, name), name
            assert len(ours) == len(theirs) and len(ours.dataset) == 10
    assert DistributedSampler(10, 4, 3).dataset == range(10)  # an int N stands for range(N)
    data = tud.TensorDataset(torch.arange(7))
    assert DistributedSampler(dataset=data, num_replicas=2, rank=1).dataset is data


def test_torch_sizes_follow_a_loaded_drop_last() -> None:
    s = DistributedSampler(10, 4, 0, drop_last=True)
    t = DistributedSampler(10, 4, 0)
    t.load_state_dict(s.state_dict())
    assert (t.drop_last, t.num_samples, t.total_size) == (True, 2, 8)


def test_cyxwiz_methods_live_in_compat() -> None:
    from rankwise.compat import cyxwiz as cx

    s = cx.DistributedSampler(dataset_size=10, num_replicas=4, rank=3, shuffle=True, seed=42)
    assert (s.total_size(), s.padded_size(), s.local_size()) == (10, 12, 3)
    assert s.get_indices() == list(s) and len(s.get_indices()) == 3
    assert cx.DistributedSampler(10, 4, 3, drop_last=True).padded_size() == 8
    t = cx.DistributedSampler(dataset=torch.arange(7), num_replicas=2, rank=1)
    assert t.total_size() == 7 and t.num_samples == 4 and isinstance(t, DistributedSampler)
    assert not callable(DistributedSampler(7, 2, 1).total_size)  # the core stays torch-shaped


@pytest.mark.parametrize(("drop_last", "padded"), [(False, 12), (True, 8)])
def test_cyxwiz_padded_size_is_the_whole_epoch_also_after_a_resume(
    drop_last: bool, padded: int
) -> None:
    from rankwise.compat import cyxwiz as cx

    saved = DistributedSampler(10, 2, 0, drop_last=drop_last)
    saved.advance(1)  # 2 of 10 consumed in a world of 2 ...
    s = cx.DistributedSampler(dataset_size=10, num_replicas=4, rank=0, drop_last=drop_last)
    s.load_state_dict(saved.state_dict())  # ... resumed in a world of 4: 8 left, 2 per rank
    # The guide's padded size: N padded up (drop_last: trimmed) to a multiple of the world
    # size, a multiple of 4 still; local_size() is what the resume changes.
    assert s.padded_size() == padded and s.padded_size() % 4 == 0
    assert s.local_size() == len(s.get_indices()) == 2


def test_defaults_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    s = DistributedSampler(30)
    assert (s.rank, s.num_replicas) == (2, 3)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    s = DistributedSampler(30)
    assert (s.rank, s.num_replicas, len(s)) == (0, 1, 30)


def test_in_a_dataloader() -> None:
    data = tud.TensorDataset(torch.arange(20))
    sampler = DistributedSampler(data, num_replicas=2, rank=1, seed=9)
    loader = tud.DataLoader(data, batch_size=4, sampler=sampler)
    seen = torch.cat([b[0] for b in loader]).tolist()
    assert seen == sampler.rest_indices() and len(seen) == 10


def test_billion_samples_start_at_once_in_small_memory() -> None:
    # Memory is the check, not time (speed lives in benchmarks/sampler.py): a materialised
    # order of 1e9 int64s would be 8 GB, and even this rank's eighth 1 GB.
    tracemalloc.start()
    s = DistributedSampler(10**9, num_replicas=8, rank=3, seed=1)
    it = iter(s)
    head = [next(it) for _ in range(100_000)]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(s) == 125_000_000 and len(set(head)) == len(head)
    assert all(0 <= i < 10**9 for i in head)
    assert peak < 30_000_000  # the 100k ints themselves are ~4 MB


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: DistributedSampler(10, 4, 4), r"rank \(4\) must be < num_replicas \(4\)"),
        (lambda: DistributedSampler(10, 0, 0), r"num_replicas \(0\)"),
        (lambda: DistributedSampler(-5, 1, 0), r"dataset_size \(-5\)"),
        (lambda: DistributedSampler(10, 1, 0, seed=-1), r"seed \(-1\)"),
        (lambda: DistributedSampler(iter([1]), 1, 0), r"must be an int or have a len"),
        (lambda: DistributedSampler(10, 1, 0, dataset_size=3), r"exactly once"),
        (lambda: DistributedSampler(10, 1, 0).set_epoch(-1), r"epoch \(-1\)"),
    ],
)
def test_bad_input(call: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]


def test_empty_dataset() -> None:
    assert world(0, 3) == [[], [], []]
    s = DistributedSampler(0, 2, 1)
    assert s.state_dict()["consumed"] == 0 and len(s) == 0


def test_indices_are_numpy_free_python_ints() -> None:
    assert all(type(i) is int for i in DistributedSampler(50, 2, 0))
    assert sorted(i for part in world(50, 5) for i in part) == list(range(50))


def test_len_is_constant_during_a_pass_that_advances() -> None:
    # A loop that reads len(loader) at every step must see one number for the whole pass.
    s = DistributedSampler(100, 2, 0, seed=1)
    assert len(s) == 50
    lengths = []
    for _ in s:
        lengths.append(len(s))
        s.advance(1)
    assert set(lengths) == {50} and s.state_dict()["consumed"] == 100
    fresh = DistributedSampler(100, 2, 0, seed=1)
    fresh.advance(10)
    assert len(fresh) == 40  # before iter(): the next pass starts after the cursor
    assert len(list(fresh)) == len(fresh) == 40
    with pytest.raises(ValueError, match=r"advance\(41\) passes the end of epoch 0: only 40"):
        fresh.advance(41)


def test_len_holds_through_the_last_partial_batch_of_a_dataloader() -> None:
    # BatchSampler drains the sampler while assembling the last, partial batch, before the
    # loop body that reads len(loader) runs.
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    s = DistributedSampler(100, 2, 0, seed=3)
    loader = DataLoader(TensorDataset(torch.arange(100)), batch_size=8, sampler=s)
    lengths = []
    for (x,) in loader:
        lengths.append(len(loader))
        s.advance(len(x))
    assert lengths == [7] * 7 and s.remaining() == 0
    assert len(s) == 50  # still the pass just finished, until the next iter() / set_epoch
    s.set_epoch(1)
    assert len(s) == s.remaining() == 50


def test_epochs_beyond_int64_are_refused_by_name() -> None:
    # The epoch is shared with DataLoader workers through an int64 tensor.
    sampler = DistributedSampler(10, num_replicas=1, rank=0)
    sampler.shared_epoch()
    sampler.set_epoch(2**63 - 1)
    assert int(sampler.shared_epoch()) == 2**63 - 1
    with pytest.raises(ValueError, match=r"epoch \(9223372036854775808\) must be <="):
        sampler.set_epoch(2**63)


def test_a_finished_epoch_repeats_with_one_warning_instead_of_an_empty_pass() -> None:
    # Before: after advance() reached the end, iter() yielded nothing -- a loop that forgot
    # set_epoch "trained" on zero samples without a word.
    s = DistributedSampler(10, 2, 1, seed=4)
    s.set_epoch(3)
    whole = list(s)
    s.advance(len(whole))
    with pytest.warns(UserWarning, match=r"epoch 3 is finished.*set_epoch\(epoch \+ 1\)"):
        again = list(s)
    assert again == whole and s.consumed == 0  # torch's behaviour: the same epoch, whole
    s.advance(len(again))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per sampler
        assert list(s) == whole
    s.set_epoch(4)
    assert len(list(s)) == 5 and list(s) != whole


def test_a_dataloader_loop_without_set_epoch_warns_once() -> None:
    s = DistributedSampler(40, 2, 0, seed=1)
    loader = tud.DataLoader(tud.TensorDataset(torch.arange(40)), batch_size=8, sampler=s)
    first = [x.tolist() for (x,) in loader]
    with pytest.warns(UserWarning, match=r"epoch 0 was already iterated.*set_epoch"):
        second = [x.tolist() for (x,) in loader]
    assert first == second  # torch repeats the order when set_epoch is not called
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.set_epoch(1)  # a loop that calls set_epoch never warns
        for _ in range(2):
            list(loader)
            s.set_epoch(s.epoch + 1)
        unshuffled = DistributedSampler(40, 2, 0, shuffle=False)
        assert list(unshuffled) == list(unshuffled)  # evaluation passes: nothing to reshuffle
