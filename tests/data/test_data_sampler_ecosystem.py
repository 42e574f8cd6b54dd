"""The sampler among its peers, on real gloo ranks: Lightning Fabric recognises it as a torch
DistributedSampler and leaves it alone; torchdata's StatefulDataLoader saves and restores its
position mid-epoch in O(1), with 0 and 2 workers."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
import torch.utils.data as tud

from rankwise.data import DistributedSampler
from rankwise.data.permutation import DEFAULT_CHUNK
from rankwise.testing import run_distributed

pytestmark = pytest.mark.slow


class Identity(tud.Dataset[int]):
    """Sample i is the int i: what a loader yields is the indices it was given."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        return torch.tensor(indices)  # a whole batch in one call: fast loaders in tests


def as_is(batch: torch.Tensor) -> torch.Tensor:
    return batch


def _fabric_epoch(n: int) -> tuple[list[int], str]:
    from lightning_fabric import Fabric

    fabric = Fabric(accelerator="cpu", strategy="ddp", devices=2)
    fabric.launch()  # LOCAL_RANK is set: Fabric joins the group instead of spawning ranks
    data = Identity(n)
    sampler = DistributedSampler(data, seed=3)  # world from Fabric's process group
    sampler.set_epoch(1)
    loader = tud.DataLoader(data, batch_size=4, sampler=sampler, collate_fn=as_is)
    loader = fabric.setup_dataloaders(loader)
    seen = [int(i) for batch in loader for i in batch]
    return seen, type(loader.sampler).__name__


def test_fabric_leaves_the_sampler_alone() -> None:
    # Before rankwise's sampler was a torch DistributedSampler, Fabric wrapped it in its own
    # DistributedSamplerWrapper and every rank saw a quarter of its half: 1/R**2 of the data.
    n = 64
    results = run_distributed(_fabric_epoch, 2, args=(n,), timeout=150, init_group=False)
    (a, kind_a), (b, kind_b) = results
    assert len(a) == len(b) == n // 2 and len(set(a)) == len(a)  # not n // 4
    assert sorted(a + b) == list(range(n))
    assert kind_a == kind_b == "DistributedSampler"


class CountingSampler(DistributedSampler):
    """Counts the positions whose indices it computes: a replay would compute every skipped one."""

    computed = 0

    def _indices(self, positions: Any) -> Any:
        self.computed += len(positions)
        return super()._indices(positions)


def _stateful_resume(n: int, batch: int, workers: int, stop: int) -> tuple[list[int], ...]:
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader() -> tuple[Any, CountingSampler]:
        sampler = CountingSampler(n, seed=5)
        sampler.set_epoch(2)
        kw: dict[str, Any] = {"num_workers": workers, "collate_fn": as_is}
        if workers:
            kw["multiprocessing_context"] = "fork"
        return StatefulDataLoader(Identity(n), batch_size=batch, sampler=sampler, **kw), sampler

    first_loader, first_sampler = loader()
    expected = first_sampler.rest_indices()  # this rank's whole epoch, for comparison
    it = iter(first_loader)
    before = [int(i) for _ in range(stop) for i in next(it)]
    state = first_loader.state_dict()
    del it, first_loader

    fresh, sampler = loader()
    fresh.load_state_dict(state)
    resumed = iter(fresh)
    after = [int(i) for i in next(resumed)]
    computed_for_first_batch = sampler.computed
    after += [int(i) for b in resumed for i in b]
    return before, after, expected, [computed_for_first_batch]


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_mid_epoch_in_o1(workers: int) -> None:
    n, batch, stop = 2 * 200_000, 4096, 40  # 163,840 indices per rank yielded before the stop
    results = run_distributed(_stateful_resume, 2, args=(n, batch, workers, stop), timeout=170)
    seen: Counter[int] = Counter()
    for before, after, expected, (computed,) in results:
        assert len(before) == stop * batch
        assert before + after == expected  # the rest of this rank's order, exactly once
        # O(1): the resumed pass computed at most two chunks (the one holding the resume point
        # and a prefetch), not the 163,840 positions a replay would have walked through.
        assert computed <= 2 * DEFAULT_CHUNK < stop * batch
        seen.update(before + after)
    assert set(seen) == set(range(n)) and set(seen.values()) == {1}


def test_sampler_iterator_is_stateful_for_torchdata() -> None:
    from torchdata.stateful_dataloader import Stateful

    sampler = DistributedSampler(10**12, num_replicas=4, rank=1, seed=7)
    it = iter(sampler)
    assert isinstance(it, Stateful) and isinstance(sampler, Stateful)
    head = [next(it) for _ in range(3)]
    deep = dict(it.state_dict(), consumed=9 * 10**11)  # a state deep in a huge epoch
    fresh = iter(DistributedSampler(10**12, num_replicas=4, rank=1, seed=7))
    fresh.load_state_dict(deep)  # O(1): no walk over 2.25e11 skipped indices
    assert next(fresh) == int(sampler._permutation()[9 * 10**11 + 1])
    assert head == [int(i) for i in sampler._permutation()[[1, 5, 9]]]
    it.load_state_dict(it.state_dict())  # a live pass can be moved too
    assert next(it) == int(sampler._permutation()[13])


def test_torch_dataloader_over_a_resumed_sampler() -> None:
    # The plain DataLoader path: the sampler's own state (advance + state_dict) resumes.
    sampler = DistributedSampler(100, num_replicas=2, rank=0, seed=1)
    loader = tud.DataLoader(Identity(100), batch_size=8, sampler=sampler, collate_fn=as_is)
    first = next(iter(loader))
    sampler.advance(len(first))
    fresh = DistributedSampler(100, num_replicas=2, rank=0)
    fresh.load_state_dict(sampler.state_dict())
    rest = torch.cat(list(tud.DataLoader(Identity(100), 8, sampler=fresh, collate_fn=as_is)))
    whole = DistributedSampler(100, num_replicas=2, rank=0, seed=1).rest_indices()
    assert first.tolist() + rest.tolist() == whole
