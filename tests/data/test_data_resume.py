"""The sampler's cursor: stop anywhere, resume under any world size, see each sample once.

Pure simulations of worlds of 1..64 ranks (no processes), a hypothesis property, and real gloo
ranks (3 ranks stop, 2 ranks resume).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwise.data import DistributedBatchIterator, DistributedSampler
from rankwise.testing import run_distributed


def run_world(
    n: int, r: int, steps: int | None, state: dict[str, Any] | None = None, **kw: Any
) -> tuple[list[int], dict[str, Any]]:
    """Every rank takes `steps` samples (None: the rest of the epoch) and advances; returns
    the samples seen by all ranks together and the (common) state."""
    seen: list[int] = []
    states = []
    for rank in range(r):
        s = DistributedSampler(n, r, rank, **kw)
        if state is not None:
            s.load_state_dict(state)
        take = len(s) if steps is None else min(steps, len(s))
        if take:  # iter() on a finished epoch would start it again (torch's repeat)
            it = iter(s)
            seen += [next(it) for _ in range(take)]
        s.advance(take)
        states.append(s.state_dict())
    assert all(st_ == states[0] for st_ in states), "ranks must agree on the state"
    return seen, states[0]


def check_once(n: int, seen: list[int], last_world: int, drop_last: bool) -> None:
    """Each sample exactly once, plus fewer than `last_world` padding duplicates (drop_last:
    at most once, fewer than `last_world` dropped)."""
    counts = Counter(seen)
    assert set(counts) <= set(range(n))
    if drop_last:
        assert max(counts.values(), default=1) == 1 and n - len(counts) < last_world
    else:
        assert set(counts) == set(range(n))
        assert len(seen) - n < last_world  # only the final re-split pads


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [True, False])
def test_resize_1_to_64_every_pair(shuffle: bool, drop_last: bool) -> None:
    n = 997
    for old in (1, 2, 3, 4, 7, 8, 16, 64):
        for new in (1, 2, 3, 5, 8, 13, 32, 64):
            before, state = run_world(n, old, 5, shuffle=shuffle, drop_last=drop_last, seed=11)
            assert state["consumed"] == min(5 * old, n) and state["world_size"] == old
            after, end = run_world(n, new, None, state)
            assert end["consumed"] == n
            check_once(n, before + after, new, drop_last)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 300),
    worlds=st.lists(st.integers(1, 64), min_size=1, max_size=4),
    steps=st.lists(st.integers(0, 40), min_size=4, max_size=4),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_any_chain_of_resizes_sees_each_sample_once(
    n: int, worlds: list[int], steps: list[int], drop_last: bool, seed: int
) -> None:
    seen: list[int] = []
    state: dict[str, Any] | None = None
    for world, k in zip(worlds, steps, strict=False):
        part, state = run_world(n, world, k, state, drop_last=drop_last, seed=seed)
        seen += part
    part, state = run_world(n, worlds[-1] + 1, None, state)
    seen += part
    assert state["consumed"] == n
    # padding happens only in the one world that reaches the end of the epoch
    check_once(n, seen, max(worlds) + 1, drop_last)


def test_state_is_small_plain_and_validated() -> None:
    s = DistributedSampler(100, 4, 1, seed=3)
    s.set_epoch(2)
    s.advance(5)
    state = s.state_dict()
    assert state == {
        "version": 1,
        "epoch": 2,
        "seed": 3,
        "dataset_size": 100,
        "shuffle": True,
        "drop_last": False,
        "consumed": 20,
        "world_size": 4,
    }
    assert all(type(v) in (int, bool) for v in state.values())
    fresh = DistributedSampler(100, 2, 0, seed=99, shuffle=False)
    fresh.load_state_dict(state)
    assert (fresh.epoch, fresh.seed, fresh.shuffle, len(fresh)) == (2, 3, True, 40)
    fresh.set_epoch(2)  # the trainer's usual call at the top of the resumed epoch: no rewind
    assert len(fresh) == 40
    fresh.set_epoch(3)  # a new epoch rewinds
    assert len(fresh) == 50 and fresh.consumed == 0
    with pytest.raises(
        ValueError, match=r"saved for a dataset of 100 samples but this sampler has 99"
    ):
        DistributedSampler(99, 1, 0).load_state_dict(state)
    with pytest.raises(
        ValueError, match=r"consumed'\] \(101\) must be <= state\['dataset_size'\] \(100\)"
    ):
        DistributedSampler(100, 1, 0).load_state_dict({**state, "consumed": 101})
    with pytest.raises(ValueError, match=r"missing \['consumed'\]"):
        DistributedSampler(100, 1, 0).load_state_dict(
            {k: v for k, v in state.items() if k != "consumed"}
        )
    # N is "dataset_size": torch's num_samples attribute is the per-rank count, so a state
    # carrying N under that name is refused by the key's name, not misread.
    old = {("num_samples" if k == "dataset_size" else k): v for k, v in state.items()}
    with pytest.raises(ValueError, match=r"missing \['dataset_size'\]"):
        DistributedSampler(100, 1, 0).load_state_dict(old)
    with pytest.raises(ValueError, match=r"advance\(51\) passes the end of epoch 3: only 50"):
        fresh.advance(51)


def test_epoch_end_state_is_complete_even_with_drop_last() -> None:
    s = DistributedSampler(10, 4, 0, drop_last=True)
    s.advance(len(s))
    assert s.state_dict()["consumed"] == 10  # the trimmed tail is not handed to a resume
    t = DistributedSampler(10, 1, 0)
    t.load_state_dict(s.state_dict())
    assert t.remaining() == 0  # iterating now repeats the epoch, with a warning


@pytest.mark.parametrize("shuffle", [True, False])
def test_global_batches_do_not_depend_on_world_size(shuffle: bool) -> None:
    n, global_batch = 250, 12
    reference: list[list[int]] | None = None
    for r in (1, 2, 3, 4, 6, 12):
        iters = [
            DistributedBatchIterator(
                DistributedSampler(n, r, rank, shuffle=shuffle, seed=8), global_batch // r
            )
            for rank in range(r)
        ]
        per_rank = [list(it) for it in iters]
        assert len({len(b) for b in per_rank}) == 1
        # interleaving ranks strided rebuilds positions [kB, (k+1)B) in order
        batches = [
            [
                per_rank[i % r][k][i // r]
                for i in range(global_batch)
                if i // r < len(per_rank[i % r][k])
            ]
            for k in range(len(per_rank[0]))
        ]
        full = batches[: n // global_batch]
        assert all(len(b) == global_batch for b in full)
        if reference is None:
            reference = full
        assert full == reference, f"world size {r} assembled different global batches"
        # the last, partial global batch holds exactly the remaining samples (+ < r padding)
        rest = set(range(n)) - {i for b in reference for i in b}
        assert set(batches[-1]) >= rest and len(batches[-1]) - len(rest) < r


def _resume_on_gloo(
    n: int, steps: int, state: dict[str, Any] | None
) -> tuple[list[int], dict[str, Any]]:
    sampler = DistributedSampler(n, seed=21)  # world from the live process group
    if state is not None:
        sampler.load_state_dict(state)
        sampler.set_epoch(state["epoch"])
    else:
        sampler.set_epoch(1)
    it = iter(sampler)
    take = len(sampler) if steps < 0 else steps
    seen = [next(it) for _ in range(take)]
    sampler.advance(take)
    return seen, sampler.state_dict()


def test_stop_on_three_ranks_resume_on_two_gloo() -> None:
    n = 101
    first = run_distributed(_resume_on_gloo, 3, args=(n, 7, None), timeout=60)
    assert all(state == first[0][1] for _, state in first) and first[0][1]["world_size"] == 3
    second = run_distributed(_resume_on_gloo, 2, args=(n, -1, first[0][1]), timeout=60)
    seen = [i for part, _ in first + second for i in part]
    check_once(n, seen, 2, drop_last=False)
    assert second[0][1]["consumed"] == n and len(second[0][0]) == len(second[1][0])


def test_state_of_another_order_version_is_refused() -> None:
    state = DistributedSampler(100, 2, 0).state_dict()
    assert state["version"] == 1
    old = {k: v for k, v in state.items() if k != "version"}  # saved before versions existed
    with pytest.raises(ValueError, match=r"missing \['version'\].*reproduces order version 1"):
        DistributedSampler(100, 2, 0).load_state_dict(old)
    with pytest.raises(
        ValueError, match=r"order version 2, but this rankwise reproduces version 1"
    ):
        DistributedSampler(100, 2, 0).load_state_dict({**state, "version": 2})
    with pytest.raises(ValueError, match=r"order version '1'"):
        DistributedSampler(100, 2, 0).load_state_dict({**state, "version": "1"})


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 400),
    old=st.integers(1, 16),
    new=st.integers(1, 16),
    taken=st.integers(0, 60),
    drop_last=st.booleans(),
)
def test_a_pass_state_resumes_the_rest_under_any_world(
    n: int, old: int, new: int, taken: int, drop_last: bool
) -> None:
    # What torchdata saves: each rank's pass iterator after `taken` indices. Loaded into fresh
    # passes under another world size, the rest of the epoch follows, each sample once.
    seen: list[int] = []
    states = []
    for rank in range(old):
        it = iter(DistributedSampler(n, old, rank, seed=9, drop_last=drop_last))
        seen += [i for _, i in zip(range(taken), it, strict=False)]
        states.append(it.state_dict())
    assert all(s == states[0] for s in states)
    for rank in range(new):
        fresh = iter(DistributedSampler(n, new, rank, drop_last=drop_last))
        fresh.load_state_dict(states[0])
        seen += list(fresh)
    check_once(n, seen, max(old, new), drop_last)
