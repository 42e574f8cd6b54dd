"""FetchDataset resumes: stop after any number of batches, resume under other ranks and other
DataLoader worker counts, and every row is yielded exactly once (plus the padding each world's
equal split adds, counted exactly). Pure simulations of worlds and workers, a hypothesis
property, and real gloo ranks reading a backed .h5ad through DataLoader workers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import rankwise.data.blocks as blocks
from rankwise.data import BlockShuffling, FetchDataset, Streaming
from rankwise.data.fetch_plan import Work, delivered, fold
from rankwise.testing import run_distributed


def rows_of(batches: list[Any]) -> list[int]:
    return [int(v) for b in batches for v in np.asarray(b).reshape(-1)]


def loader_order(ds: FetchDataset, workers: int, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What ``DataLoader(ds, batch_size=None, num_workers=workers)`` yields on this rank,
    modelled directly: the workers asked in turn, each skipped once it has run out."""
    per_worker = []
    for w in range(workers):
        info = SimpleNamespace(id=w, num_workers=workers)
        monkeypatch.setattr(blocks, "get_worker_info", lambda info=info: info)
        per_worker.append(list(ds))
    monkeypatch.setattr(blocks, "get_worker_info", lambda: None)
    out: list[Any] = []
    for t in range(max(map(len, per_worker))):
        out += [batches[t] for batches in per_worker if t < len(batches)]
    return out


def run_world(
    kw: dict[str, Any],
    world: int,
    workers: int,
    take: int | None,
    state: dict[str, Any] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[int], dict[str, Any], int]:
    """Every rank takes `take` batches (None: the whole pass) and advances; returns the rows of
    all ranks, the common state, and the batches per rank."""
    rows: list[int] = []
    states, counts = [], []
    for rank in range(world):
        ds = FetchDataset(rank=rank, world_size=world, **kw)
        if state is not None:
            ds.load_state_dict(state)
        batches = loader_order(ds, workers, monkeypatch)
        counts.append(len(batches))
        assert len(batches) == len(ds)
        k = len(batches) if take is None else min(take, len(batches))
        rows += rows_of(batches[:k])
        ds.advance(k)
        states.append(ds.state_dict())
    assert len(set(counts)) == 1, f"unequal batch counts {counts} would hang DDP"
    assert all(s == states[0] for s in states), "ranks must agree on the state"
    return rows, states[0], counts[0]


def check_chain(
    kw: dict[str, Any],
    chain: list[tuple[int, int, int | None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Run worlds `(ranks, workers, batches)` one after the other, each resuming the last."""
    n = len(kw["source"])
    length = kw["strategy"].epoch_length(n)
    seen: list[int] = []
    padding, state, consumed, dropped = 0, None, 0, 0
    for world, workers, take in [*chain, (chain[-1][0], chain[-1][1], None)]:
        rows, state, _ = run_world(kw, world, workers, take, state, monkeypatch)
        seen += rows
        # rows beyond the real progress of the epoch are this world's padding duplicates
        extra = len(rows) - (state["consumed"] - consumed)
        if take is None and kw.get("drop_last"):  # the end of the epoch drops, never pads
            assert -world * kw["batch_size"] < extra <= 0
            dropped, extra = -extra, 0
        assert 0 <= extra < world
        padding, consumed = padding + extra, state["consumed"]
        if consumed == length:  # a finished epoch would repeat: the chain ends here
            break
    assert state is not None and state["consumed"] == length and state["pieces"] == []
    counts = Counter(seen)
    assert sum(counts.values()) == consumed + padding - dropped
    if kw.get("drop_last"):
        assert padding == 0 and max(counts.values(), default=1) == 1
        return
    assert set(counts) == set(kw["strategy"].order(n, np.arange(length), seed=0, epoch=0))
    assert sum(c - 1 for c in counts.values()) == padding


STRATEGIES = [BlockShuffling(4), Streaming(), Streaming(shuffle=True), BlockShuffling(3)]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(
    "chain",
    [
        [(3, 1, 2)],
        [(3, 2, 3)],
        [(3, 2, 5), (2, 3, 1)],
        [(1, 1, 7), (4, 2, 2), (3, 1, 1)],
        [(2, 4, 9)],
        [(3, 2, 11)],  # inside the last round: padding already read
    ],
)
def test_stop_and_resume_each_row_once(
    strategy: Any, chain: list[tuple[int, int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    kw = {"source": np.arange(101), "strategy": strategy, "batch_size": 3, "fetch_factor": 2}
    check_chain(kw, chain, monkeypatch)


def test_drop_last_resume_never_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    kw = {
        "source": np.arange(103),
        "strategy": BlockShuffling(5),
        "batch_size": 4,
        "fetch_factor": 2,
        "drop_last": True,
    }
    check_chain(kw, [(3, 2, 4), (2, 1, 3)], monkeypatch)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 120),
    block=st.integers(1, 9),
    batch=st.integers(1, 5),
    fetch_factor=st.integers(1, 4),
    shuffle=st.booleans(),
    chain=st.lists(
        st.tuples(st.integers(1, 5), st.integers(1, 3), st.integers(0, 12)), min_size=1, max_size=3
    ),
)
def test_any_chain_of_stops_sees_each_row_once(
    n: int,
    block: int,
    batch: int,
    fetch_factor: int,
    shuffle: bool,
    chain: list[tuple[int, int, int]],
) -> None:
    strategy = BlockShuffling(block) if shuffle else Streaming()
    kw = {"source": np.arange(n), "strategy": strategy, "batch_size": batch}
    kw["fetch_factor"] = fetch_factor
    with pytest.MonkeyPatch.context() as mp:
        check_chain(kw, chain, mp)


def test_delivered_matches_round_robin() -> None:
    for counts in ([3, 1, 2], [0, 4], [5], [2, 2, 2, 2], [1, 0, 3]):
        order = [(t, w) for t in range(max(counts)) for w, c in enumerate(counts) if t < c]
        for k in range(len(order) + 1):
            assert delivered(counts, k) == [
                sum(1 for _, w in order[:k] if w == i) for i in range(len(counts))
            ]
    with pytest.raises(ValueError, match="hold only 4"):
        delivered([3, 1], 5)


def test_fold_keeps_the_unread_rest_of_begun_fetches() -> None:
    # 2 ranks, 1 worker, fetches of 4: rank 0 half-read 0-3, rank 1 half-read 4-7
    rest = fold(Work(12, 0), 2, 1, 1, batch_size=2, fetch_factor=2)
    assert rest == Work(12, 8, ((0, 4, 2, 4), (4, 8, 2, 4)))
    assert rest.total == 8
    # the rest folds again, under 3 ranks: the pieces first, then fresh rows
    again = fold(rest, 3, 1, 1, batch_size=2, fetch_factor=1)
    assert again.total == 2 and again.next == 10 and again.pieces == ()


def test_state_is_small_plain_and_validated() -> None:
    ds = FetchDataset(
        np.arange(50), BlockShuffling(4), batch_size=5, fetch_factor=2, rank=0, world_size=2
    )
    ds.set_epoch(3)
    list(ds)
    ds.advance(1)
    state = ds.state_dict()
    assert set(state) == {
        "version", "epoch", "seed", "num_rows", "length", "consumed", "next", "pieces",
        "world_size", "num_workers",
    }  # fmt: skip
    assert (state["epoch"], state["consumed"], state["world_size"], state["num_workers"]) == (
        3,
        10,
        2,
        1,
    )
    assert all(type(v) is int for k, v in state.items() if k != "pieces")
    assert all(type(x) is int for p in state["pieces"] for x in p)
    other = FetchDataset(
        np.arange(50), BlockShuffling(4), batch_size=5, rank=0, world_size=1, seed=9
    )
    other.load_state_dict(state)
    assert (other.epoch, other.seed, len(other)) == (3, 0, 8)
    other.set_epoch(3)  # the usual call at the top of the resumed epoch: no rewind
    assert len(other) == 8
    other.set_epoch(4)
    assert len(other) == 10
    bad = [
        ({**state, "version": 999}, r"order version 999"),
        ({**state, "num_rows": 49}, r"source of 49 rows but this one has 50"),
        ({**state, "length": 48}, r"epochs of 48 positions"),
        ({**state, "pieces": [[0, 10, 5, 11]]}, r"lo < hi <= stop - start"),
        ({**state, "next": 51}, r"next'\] \(51\) must be <= 50"),
        ({k: v for k, v in state.items() if k != "pieces"}, r"missing \['pieces'\]"),
    ]
    for broken, match in bad:
        with pytest.raises(ValueError, match=match):
            FetchDataset(
                np.arange(50), BlockShuffling(4), batch_size=5, rank=0, world_size=1
            ).load_state_dict(broken)
    with pytest.raises(ValueError, match=r"advance\(11\) passes the end of the pass: 10 of 10"):
        other.advance(11)


def test_a_finished_epoch_repeats_with_a_warning_instead_of_an_empty_pass() -> None:
    ds = FetchDataset(np.arange(12), Streaming(), batch_size=3, rank=0, world_size=1)
    assert len(list(ds)) == 4
    ds.advance(4)
    assert ds.state_dict()["consumed"] == 12
    with pytest.warns(UserWarning, match=r"call set_epoch\(1\) before each epoch"):
        again = list(ds)
    assert rows_of(again) == list(range(12))
    ds.advance(2)  # counts in the repeated pass
    assert ds.state_dict()["consumed"] == 6
    fresh = FetchDataset(np.arange(12), Streaming(), batch_size=3, rank=0, world_size=1)
    fresh.load_state_dict({**ds.state_dict(), "consumed": 12, "next": 12, "pieces": []})
    with pytest.warns(UserWarning, match="already consumed"):
        assert rows_of(list(fresh)) == list(range(12))


def test_advance_needs_an_iterated_dataset() -> None:
    ds = FetchDataset(np.arange(12), Streaming(), batch_size=3, rank=0, world_size=1)
    ds.advance(1)
    with pytest.raises(RuntimeError, match="never iterated"):
        ds.state_dict()


# -- real gloo ranks, DataLoader workers, a backed .h5ad -------------------------------------


def read_ids(adata: Any, rows: np.ndarray) -> np.ndarray:
    return np.asarray(adata.X[rows])[:, 0].astype(np.int64)


def _pass(
    adata: Any, workers: int, take: int | None, state: dict[str, Any] | None
) -> tuple[list[int], dict[str, Any], int, int]:
    """One pass of a DataLoader over a fresh dataset (after loading `state`): rows read, state
    after them, batches the loader yields on this rank, batches taken."""
    ds = FetchDataset(
        adata, BlockShuffling(4), batch_size=5, fetch_factor=2, fetch_callback=read_ids
    )
    if state is not None:
        ds.load_state_dict(state)
    ds.set_epoch(2)  # a new epoch the first time; after load_state_dict, a mid-epoch resume
    context = "fork" if workers else None  # fork: no second forkserver inside a rank
    loader = DataLoader(ds, batch_size=None, num_workers=workers, multiprocessing_context=context)
    length, taken = len(loader), 0
    rows: list[int] = []
    for batch in loader:
        if taken == take:
            break
        rows += batch.tolist()
        ds.advance(1)
        taken += 1
    del loader  # stops the workers
    return rows, ds.state_dict(), length, taken


def _world(path: str, phases: list[tuple[int, int | None, Any]]) -> list[Any]:
    """Run passes one after the other on this rank; a phase's state is a state, or the index
    of an earlier phase whose state it resumes."""
    import anndata as ad

    adata = ad.read_h5ad(path, backed="r")
    out: list[Any] = []
    for workers, take, state in phases:
        out.append(_pass(adata, workers, take, out[state][1] if isinstance(state, int) else state))
    adata.file.close()
    return out


@pytest.fixture(scope="module")
def h5ad_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ad = pytest.importorskip("anndata")
    path = tmp_path_factory.mktemp("resume") / "cells.h5ad"
    x = np.repeat(np.arange(157, dtype=np.float32)[:, None], 3, axis=1)
    ad.AnnData(X=x).write_h5ad(path)
    return path


def check_resumed(stopped: list[Any], resumed: list[Any]) -> None:
    """`stopped`/`resumed`: each rank's pass results. Every rank yields the same number of
    batches; 157 rows, 45 before the stop: each row once plus the final split's padding."""
    assert len({(n, taken) for _, _, n, taken in resumed}) == 1
    assert all(n == taken for _, _, n, taken in resumed)  # the loop took the whole pass
    seen = Counter(v for r, _, _, _ in stopped + resumed for v in r)
    world = len(resumed)
    padding = -(-112 // world) * world - 112  # 112 rows left: 2 x 56, or 3 x 38 with 2 padded
    assert set(seen) == set(range(157)) and sum(seen.values()) == 157 + padding
    assert all(st["consumed"] == 157 for _, st, _, _ in resumed)


@pytest.mark.slow
@pytest.mark.timeout(330)  # two runs of up to 150 s each on a loaded machine (~35 s idle)
def test_gloo_ranks_stop_and_resume_on_a_backed_h5ad(h5ad_file: Path) -> None:
    """3 ranks stop after 3 batches (DataLoader workers 0, and 2); the rest is read by the same
    3 ranks with the other worker count, and by 2 ranks with the other worker count."""
    path = str(h5ad_file)
    phases = [(0, 3, None), (2, None, 0), (2, 3, None), (0, None, 2)]
    three = run_distributed(_world, 3, args=(path, phases), timeout=150)
    for stop in (0, 2):
        stopped = [rank[stop] for rank in three]
        assert all(len(r) == 15 and taken == 3 for r, _, _, taken in stopped)
        assert len({n for _, _, n, _ in stopped}) == 1
        state = stopped[0][1]
        assert all(s == state for _, s, _, _ in stopped) and state["consumed"] == 45
        assert state["num_workers"] == max(1, phases[stop][0]) and state["world_size"] == 3
        check_resumed(stopped, [rank[stop + 1] for rank in three])
    states = [three[0][0][1], three[0][2][1]]  # stopped with 0 workers, with 2 workers
    two = run_distributed(
        _world, 2, args=(path, [(2, None, states[0]), (0, None, states[1])]), timeout=150
    )
    for i, stop in enumerate((0, 2)):
        check_resumed([rank[stop] for rank in three], [rank[i] for rank in two])


def test_persistent_workers_resume_and_refuse_a_stale_start() -> None:
    """Persistent workers copy the dataset once: a state loaded before they start is resumed;
    one loaded after is refused with the fix, never silently ignored."""

    def make() -> FetchDataset:
        return FetchDataset(np.arange(60), BlockShuffling(4), batch_size=3, rank=0, world_size=1)

    ds = make()
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    first = [b.tolist() for _, b in zip(range(5), loader, strict=False)]
    ds.advance(5)
    state = ds.state_dict()
    assert state["num_workers"] == 2 and state["consumed"] == 15
    ds.set_epoch(1)  # a new epoch reaches the persistent workers
    assert sorted(rows_of(list(loader))) == list(range(60))
    resumed = make()
    resumed.load_state_dict(state)
    loader = DataLoader(resumed, batch_size=None, num_workers=2, persistent_workers=True)
    rest = rows_of(list(loader))
    assert sorted(rows_of(first) + rest) == list(range(60))
    resumed.load_state_dict(state)  # the same start again: the workers' copy still holds
    assert sorted(rows_of(first) + rows_of(list(loader))) == list(range(60))
    other = make()
    list(other)
    other.advance(2)
    resumed.load_state_dict(other.state_dict())  # another start, after the workers copied it
    with pytest.raises(RuntimeError, match="build the DataLoader after load_state_dict"):
        list(loader)
    loader = DataLoader(resumed, batch_size=None, num_workers=2, persistent_workers=True)
    list(loader)
    resumed.load_state_dict({**make().state_dict(), "seed": 5})  # a fresh epoch, reseeded
    with pytest.raises(RuntimeError, match="build the DataLoader after load_state_dict"):
        list(loader)


def test_stateful_dataloader_worker_state_is_refused_not_misread() -> None:
    """torchdata's StatefulDataLoader saves and restores a dataset per worker, where the
    consumed count is unknown: restoring that must fail with the fix, never replay rows."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    ds = FetchDataset(np.arange(40), Streaming(), batch_size=4, rank=0, world_size=1)
    loader = stateful.StatefulDataLoader(ds, batch_size=None, num_workers=2)
    it = iter(loader)
    next(it)
    saved = loader.state_dict()
    del it
    again = stateful.StatefulDataLoader(ds, batch_size=None, num_workers=2)
    again.load_state_dict(saved)
    with pytest.raises(ValueError, match=r"call ds.load_state_dict\(state\) before building"):
        list(again)


def test_a_drop_last_rest_too_small_for_a_batch_is_an_empty_pass_with_a_warning() -> None:
    one = FetchDataset(np.arange(20), Streaming(), 4, drop_last=True, rank=0, world_size=1)
    list(one)
    one.advance(4)  # 16 rows read, 4 left
    two = FetchDataset(np.arange(20), Streaming(), 4, drop_last=True, rank=1, world_size=2)
    two.load_state_dict(one.state_dict())
    assert len(two) == 0
    with pytest.warns(UserWarning, match=r"4 rows left of epoch 0 make no full batch of 4"):
        assert list(two) == []
