"""FetchDataset: splits over ranks and workers, strategies, callbacks, h5py / backed AnnData,
set_epoch inside DataLoader workers, real gloo ranks, and the flags of benchmarks/blocks.py."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import rankwise.data.blocks as blocks
from helpers.paths import REPO
from rankwise.data import BlockShuffling, FetchDataset, Permutation, Streaming, rank_fetches
from rankwise.data.blocks import fetch_permutation
from rankwise.testing import child_env, run_distributed, run_isolated

ROOT = REPO


def rows_of(batches: list[Any]) -> list[int]:
    return [int(v) for b in batches for v in np.asarray(b).reshape(-1)]


def simulate(
    ds_kwargs: dict[str, Any], world: int, workers: int, monkeypatch: pytest.MonkeyPatch
) -> list[list[Any]]:
    """Batches of every (rank, worker) pair, without processes: rank-major, worker-minor."""
    out = []
    for rank in range(world):
        for w in range(workers):
            monkeypatch.setattr(
                blocks, "get_worker_info", lambda w=w: SimpleNamespace(id=w, num_workers=workers)
            )
            ds = FetchDataset(rank=rank, world_size=world, **ds_kwargs)
            out.append(list(ds))
    return out


@pytest.mark.parametrize(
    "strategy", [Streaming(), BlockShuffling(4), BlockShuffling(1), Streaming(shuffle=True)]
)
@pytest.mark.parametrize(
    ("n", "world", "workers"), [(96, 1, 1), (96, 4, 2), (96, 8, 3), (120, 3, 4), (64, 64, 1)]
)
def test_each_row_once_when_rows_divide(
    strategy: Any, n: int, world: int, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    kw = {"source": np.arange(n), "strategy": strategy, "batch_size": 2, "fetch_factor": 3}
    parts = simulate(kw, world, workers, monkeypatch)
    assert sorted(rows_of([b for p in parts for b in p])) == list(range(n))
    per_rank = [sum(len(p) for p in parts[r * workers : (r + 1) * workers]) for r in range(world)]
    expected = len(
        FetchDataset(np.arange(n), strategy, 2, fetch_factor=3, rank=0, world_size=world)
    )
    assert per_rank == [expected] * world


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("n", "world"), [(101, 4), (7, 3), (5, 8), (1000, 7)])
def test_equal_batch_counts_when_rows_do_not_divide(
    n: int, world: int, drop_last: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    kw = {
        "source": np.arange(n),
        "strategy": BlockShuffling(3),
        "batch_size": 4,
        "fetch_factor": 2,
        "drop_last": drop_last,
    }
    if drop_last and n // world < 4:
        # fewer than batch_size rows per rank: every rank would silently get no batch at all
        with pytest.raises(ValueError, match="drop_last=True leaves no batch"):
            FetchDataset(**kw, rank=0, world_size=world)  # type: ignore[arg-type]
        return
    parts = simulate(kw, world, 2, monkeypatch)
    counts = [len(parts[2 * r]) + len(parts[2 * r + 1]) for r in range(world)]
    assert len(set(counts)) == 1, f"unequal batch counts {counts} would hang DDP"
    rows = Counter(rows_of([b for p in parts for b in p]))
    if drop_last:
        assert max(rows.values(), default=1) == 1 and all(len(b) == 4 for p in parts for b in p)
    else:
        assert set(rows) == set(range(n)) and sum(rows.values()) - n < world


def test_rank_fetches_simulated_worlds() -> None:
    for length in (0, 1, 17, 96, 1000):
        for world in (1, 2, 7, 22, 64):
            plan = [f for r in range(world) for f in rank_fetches(length, world, r, 4, 8)]
            positions = sorted(p for f in plan for p in range(f.start, f.stop))
            assert positions == list(range(-(-length // world) * world))
            assert len({f.fetch_id for f in plan}) == len(plan)


def test_streaming_order_and_block_shuffling_mixes() -> None:
    ds = FetchDataset(np.arange(40), Streaming(), batch_size=4, fetch_factor=2)
    assert rows_of(list(ds)) == list(range(40)) and len(ds) == 10
    reads: list[list[int]] = []

    def fetch(source: np.ndarray, idx: np.ndarray) -> np.ndarray:
        reads.append(idx.tolist())
        return source[idx]

    ds = FetchDataset(
        np.arange(1000), BlockShuffling(10), batch_size=20, fetch_factor=5, fetch_callback=fetch
    )
    batches = list(ds)
    assert sorted(rows_of(batches)) == list(range(1000))
    assert all(r == sorted(r) for r in reads) and len(reads) == 10
    blocks_per_batch = [len({int(v) // 10 for v in b}) for b in batches]
    assert np.mean(blocks_per_batch) > 5  # rows of one batch come from many blocks
    first = rows_of(batches)
    ds.set_epoch(1)
    assert rows_of(list(ds)) != first
    ds.set_epoch(0)
    assert rows_of(list(ds)) == first  # reproducible


def test_callbacks_and_transforms_are_applied() -> None:
    calls: dict[str, int] = Counter()

    def fetch_cb(source: np.ndarray, idx: np.ndarray) -> np.ndarray:
        calls["fetch"] += 1
        return source[idx] * 10

    def batch_cb(data: np.ndarray, rows: np.ndarray) -> np.ndarray:
        calls["batch"] += 1
        return data[rows]

    ds = FetchDataset(
        np.arange(12),
        Streaming(),
        batch_size=3,
        fetch_factor=2,
        fetch_callback=fetch_cb,
        fetch_transform=lambda d: d + 1,
        batch_callback=batch_cb,
        batch_transform=torch.as_tensor,
    )
    batches = list(ds)
    assert all(isinstance(b, torch.Tensor) for b in batches)
    assert torch.cat(batches).tolist() == [10 * i + 1 for i in range(12)]
    assert calls == {"fetch": 2, "batch": 4}


def test_subset_indices() -> None:
    keep = np.array([9, 3, 5, 7])
    assert rows_of(list(FetchDataset(np.arange(10), Streaming(indices=keep), batch_size=2))) == [
        9,
        3,
        5,
        7,
    ]
    got = rows_of(list(FetchDataset(np.arange(10), BlockShuffling(2, indices=keep), batch_size=2)))
    assert sorted(got) == [3, 5, 7, 9]


def test_h5py_dataset(tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py")
    data = np.arange(300 * 3, dtype=np.float32).reshape(300, 3)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["X"] = data
    with h5py.File(tmp_path / "x.h5", "r") as f:
        ds = FetchDataset(
            f["X"], BlockShuffling(16), batch_size=32, fetch_factor=4, rank=1, world_size=2
        )
        batches = list(ds)
        other = list(
            FetchDataset(
                f["X"], BlockShuffling(16), batch_size=32, fetch_factor=4, rank=0, world_size=2
            )
        )
    got = np.concatenate(batches + other)
    assert got.shape == (300, 3) and len(batches) == len(other) == len(ds) == 5
    assert np.array_equal(got[np.argsort(got[:, 0])], data)


def test_backed_anndata(tmp_path: Path) -> None:
    ad = pytest.importorskip("anndata")
    x = np.repeat(np.arange(200, dtype=np.float32)[:, None], 4, axis=1)
    ad.AnnData(X=x).write_h5ad(tmp_path / "a.h5ad")
    adata = ad.read_h5ad(tmp_path / "a.h5ad", backed="r")
    ds = FetchDataset(adata, BlockShuffling(8), batch_size=16, fetch_factor=4)
    batches = list(ds)
    assert all(isinstance(b, ad.AnnData) and not b.isbacked for b in batches)
    assert sorted(int(v) for b in batches for v in np.asarray(b.X)[:, 0]) == list(range(200))
    # the guide's style: a fetch_callback that turns the fetched rows into a tensor
    ds = FetchDataset(
        adata,
        BlockShuffling(8),
        batch_size=16,
        fetch_callback=lambda d, idx: torch.as_tensor(np.asarray(d[idx].X)),
    )
    tensors = list(ds)
    assert sorted(torch.cat(tensors)[:, 0].int().tolist()) == list(range(200))
    adata.file.close()


@pytest.mark.parametrize(
    ("context", "persistent"), [("fork", True), ("fork", False), ("forkserver", True)]
)
def test_set_epoch_reaches_dataloader_workers(context: str, persistent: bool) -> None:
    """Workers hold copies of the dataset (forkserver: unpickled ones); the epoch must still
    reach them, persistent or not."""
    ds = FetchDataset(
        np.arange(64), BlockShuffling(4), batch_size=4, fetch_factor=2, rank=0, world_size=1
    )
    loader = DataLoader(
        ds,
        batch_size=None,
        num_workers=2,
        persistent_workers=persistent,
        multiprocessing_context=context,
    )
    assert len(loader) == 16

    def reference(epoch: int) -> list[tuple[int, ...]]:
        local = FetchDataset(
            np.arange(64), BlockShuffling(4), batch_size=4, fetch_factor=2, rank=0, world_size=1
        )
        local.set_epoch(epoch)
        return sorted(tuple(b.tolist()) for b in local)

    for epoch in (0, 1, 2):
        ds.set_epoch(epoch)
        got = [tuple(b.tolist()) for b in loader]
        assert len(got) == 16 and sorted(r for b in got for r in b) == list(range(64))
        assert sorted(got) == reference(epoch), f"epoch {epoch} did not reach the workers"
    assert reference(1) != reference(2)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: FetchDataset(np.arange(4), Streaming(), batch_size=0), r"batch_size \(0\)"),
        (
            lambda: FetchDataset(np.arange(4), Streaming(), batch_size=2, fetch_factor=0),
            r"fetch_factor \(0\)",
        ),
        (lambda: BlockShuffling(block_size=0), r"block_size \(0\) must be >= 1"),
        (
            lambda: FetchDataset(np.arange(4), Streaming(), 2, rank=2, world_size=2),
            r"rank \(2\) must be < world_size \(2\)",
        ),
        (
            lambda: FetchDataset(np.arange(4), "blocks", 2),
            r"strategy \('blocks'\) must be a Strategy",
        ),  # type: ignore[arg-type]
        (
            lambda: FetchDataset(np.arange(4), Streaming(indices=[1, 9]), 2),
            r"reach row 9 but the source has only 4",
        ),
        (lambda: FetchDataset(iter([1]), Streaming(), 2), r"must have a len\(\) or a shape"),
        (lambda: FetchDataset(np.arange(4), Streaming(), 2).set_epoch(-1), r"epoch \(-1\)"),
    ],
)
def test_bad_input(call: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def _ranks_and_workers(n: int) -> tuple[list[int], int]:
    ds = FetchDataset(
        np.arange(n), BlockShuffling(5), batch_size=4, fetch_factor=2
    )  # world detected
    ds.set_epoch(3)
    # fork: a forkserver-started rank would otherwise start a fresh forkserver (and import
    # torch again) for its workers, which takes seconds.
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    batches = list(loader)
    assert len(batches) == len(ds) == len(loader)
    return [int(v) for b in batches for v in b], ds.world_size


def test_two_gloo_ranks_with_two_workers_each() -> None:
    results = run_distributed(_ranks_and_workers, 2, args=(120,), timeout=90)
    assert [w for _, w in results] == [2, 2]
    assert len(results[0][0]) == len(results[1][0]) == 60
    assert sorted(results[0][0] + results[1][0]) == list(range(120))


def test_a_source_numpy_cannot_index_fails_at_construction() -> None:
    with pytest.raises(ValueError, match=r"source \(list\) cannot be read by an array of row"):
        FetchDataset(list(range(10)), BlockShuffling(4), batch_size=2, rank=0, world_size=1)
    # with a fetch_callback the caller reads rows, so any source is fine
    ds = FetchDataset(
        list(range(10)),
        Streaming(),
        batch_size=5,
        rank=0,
        world_size=1,
        fetch_callback=lambda src, rows: np.array([src[i] for i in rows]),
    )
    assert [b.tolist() for b in ds] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


# First 8 rows (rank 0 of 1, batch_size 4) for (N, block_size, fetch_factor, seed, epoch). They
# come from rankwise's own counter-based permutations only (block order and in-fetch shuffle),
# so a numpy or torch upgrade must not move them; a change here is a new ORDER_VERSION.
GOLDEN = {
    (100, 4, 2, 0, 0): [79, 78, 71, 69, 76, 70, 68, 77],
    (100, 4, 2, 0, 1): [1, 3, 37, 39, 36, 38, 2, 0],
    (1000, 16, 4, 7, 3): [517, 526, 527, 518, 512, 522, 525, 513],
    (10007, 1, 8, 123, 0): [2918, 5655, 1353, 2986, 6055, 9385, 1104, 9681],
    (5000, 64, 2, 2**40, 9): [641, 647, 643, 645, 646, 640, 644, 642],
}


@pytest.mark.parametrize(("case", "rows"), list(GOLDEN.items()))
def test_golden_orders(case: tuple[int, int, int, int, int], rows: list[int]) -> None:
    n, block_size, fetch_factor, seed, epoch = case
    ds = FetchDataset(
        np.arange(n), BlockShuffling(block_size), 4, fetch_factor, rank=0, world_size=1, seed=seed
    )
    ds.set_epoch(epoch)
    assert rows_of(list(ds))[:8] == rows
    if case == (100, 4, 2, 0, 0):  # spelled out: the fetch's shuffle of positions 0-7, then
        # each position's block (shuffled block order) and its row within the block
        positions = fetch_permutation(8, seed=0, epoch=0, start=0).take(0, 8)
        assert (Permutation(25, 0, 0)[positions // 4] * 4 + positions % 4).tolist() == rows


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("plot", "drawn"), [("", []), ("chart.png", ["chart.png"])])
def test_blocks_benchmark_plot_flag(plot: str, drawn: list[str], tmp_path: Path) -> None:
    """benchmarks/blocks.py: ``--plot ''`` draws nothing (it once wrote ``.png``: ``Path('')``
    is ``'.'``, and matplotlib names a suffix-less ``'.'`` ``.png``); a path draws there."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("anndata")
    # A copy, so its out/ folder (next to the script) and the plot land in tmp_path.
    script = tmp_path / "blocks.py"
    script.write_text((ROOT / "benchmarks" / "blocks.py").read_text())
    cmd = [sys.executable, str(script), "--rows", "256", "--cols", "4", "--batch-size", "8"]
    cmd += ["--random-samples", "32", "--block-sizes", "4", "--fetch-factors", "2"]
    cmd += ["--ranks", "0", "--plot", plot]
    result = run_isolated(cmd, env=child_env(), timeout=100, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert (tmp_path / "out" / "blocks.json").exists()
    assert sorted(p.name for p in tmp_path.rglob("*.png")) == drawn
