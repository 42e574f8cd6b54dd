"""The scDataset guide on rankwise: ``rankwise.compat.scdataset`` holds the guide's names (and
the released package's constructor and strategies), every example of the guide runs from
examples/seeds/scdataset/ as the guide launches it (plain python, or ``torchrun`` on 2 ranks
over a backed .h5ad with DataLoader workers), and where the released ``scdataset`` 0.3.0
gives ranks unequal batch counts, which breaks DDP, rankwise gives every rank the same.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import re
import runpy
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import helpers.seed_ports as seed_ports
import rankwise.data as rd
from helpers.paths import EXAMPLES
from helpers.seed_ports import NUM
from rankwise.compat import scdataset as sc
from rankwise.compat.scdataset.transforms import fetch_transform_adata
from rankwise.testing import RankFailedError, child_env, free_port, run_distributed, run_isolated

SC = EXAMPLES / "seeds" / "scdataset"


def run_plain(name: str) -> str:
    """Run a one-process example as ``python name`` would, here; return what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(SC / name), run_name="__main__")
    return out.getvalue()


def torchrun(script: str, cwd: Path, nproc: int = 2, *, tmp: Path | None = None) -> str:
    """``torchrun --nproc_per_node=N script`` in ``cwd`` on a free port; its ranks' stdout. The ports
    write their data to ``cwd`` (SCDATASET_EXAMPLE_DIR) or, with ``tmp``, to a temporary
    folder there (TMPDIR), as a user's run without the variable would."""
    # Each rank's stdout goes to a file of its own (--redirects 1): the ports print long lines,
    # and two ranks' writes to one pipe interleave past PIPE_BUF (4096 bytes), cutting a line.
    logs = cwd / "torchrun-logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    cmd += [f"--log-dir={logs}", "--redirects=1", f"--master_port={free_port()}", str(SC / script)]
    shell = f"cd {shlex.quote(str(cwd))} && exec {shlex.join(cmd)}"
    extra = {"TMPDIR": str(tmp)} if tmp else {"SCDATASET_EXAMPLE_DIR": str(cwd)}
    env = {k: v for k, v in child_env(extra).items() if not (tmp and k == "SCDATASET_EXAMPLE_DIR")}
    proc = run_isolated(["sh", "-c", shell], env=env, timeout=270)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return "".join(log.read_text() for log in sorted(logs.glob("**/stdout.log")))


def epochs_of(out: str) -> dict[int, dict[int, tuple[int, list[int]]]]:
    """``{epoch: {rank: (batches, rows)}}`` from the ports' "rank r ... epoch e" lines (rows
    as a list, or as runs ``[(first, stop), ...]``)."""
    found: dict[int, dict[int, tuple[int, list[int]]]] = {}
    line = r"rank (\d+)(?:/\d+)? epoch (\d+) batches (\d+) rows (\[[\d, ()]*\])"
    for rank, epoch, batches, text in re.findall(line, out):
        rows = eval(text)
        if rows and isinstance(rows[0], tuple):
            rows = [r for a, b in rows for r in range(a, b)]
        found.setdefault(int(epoch), {})[int(rank)] = (int(batches), rows)
    return found


# ------------------------------------------------------------------------------ the names


def test_the_names_are_rankwise_core_objects() -> None:
    assert issubclass(sc.scDataset, rd.FetchDataset)
    assert sc.Streaming is rd.Streaming and sc.BlockShuffling is rd.BlockShuffling
    assert sc.BlockWeightedSampling is rd.BlockWeightedSampling
    assert sc.ClassBalancedSampling is rd.ClassBalancedSampling
    assert fetch_transform_adata is rd.dense_tensor
    ds = sc.scDataset(np.zeros((10, 2)), sc.Streaming(), batch_size=2, fetch_factor=3)
    assert ds.collection is ds.source and ds.fetch_size == 6


@pytest.mark.parametrize(
    "name",
    ["scDataset", "Streaming", "BlockShuffling", "BlockWeightedSampling", "ClassBalancedSampling"],
)
def test_signatures_match_the_released_package(name: str) -> None:
    # A user's code ports with only the import changed: same parameters, order and defaults
    # (scDataset's seed=None means seed 0 here; docs/seeds/scdataset.md says why).
    released = pytest.importorskip("scdataset")

    def params(obj: Any) -> list[tuple[str, Any]]:
        return [(p.name, p.default) for p in inspect.signature(obj).parameters.values()]

    assert params(getattr(sc, name)) == params(getattr(released, name))


def test_fetch_transform_adata_makes_a_dense_tensor_from_backed_rows(tmp_path: Path) -> None:
    ad = pytest.importorskip("anndata")
    sparse = pytest.importorskip("scipy.sparse")
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    x[x % 3 == 0] = 0
    for name, matrix in (("dense", x), ("sparse", sparse.csr_matrix(x))):
        ad.AnnData(X=matrix).write_h5ad(tmp_path / f"{name}.h5ad")
        adata = ad.read_h5ad(tmp_path / f"{name}.h5ad", backed="r")
        batch = fetch_transform_adata(adata[np.array([1, 4, 5])])
        assert batch.dtype == torch.float32 and batch.layout == torch.strided  # dense
        assert batch.numpy().tolist() == x[[1, 4, 5]].tolist(), name
        adata.file.close()


# ------------------------------------------------------------- equal batches on every rank


def counts(make: Any, n: int, world: int, **kw: Any) -> list[int]:
    """Batches each rank of ``world`` actually yields (iterated, not len())."""
    data = np.arange(n)
    return [
        sum(1 for _ in make(data, rank=r, world_size=world, seed=0, **kw)) for r in range(world)
    ]


def test_released_scdataset_gives_unequal_batch_counts_rankwise_equal() -> None:
    released = pytest.importorskip("scdataset")
    # The example: 10,000 rows, batch 64, 4 ranks (fetch_factor 16: 10 fetches of
    # 1,024 rows dealt round-robin, so ranks 0-1 get 3 fetches and ranks 2-3 get 2).
    for name in ("Streaming", "BlockShuffling"):
        strategy = getattr(released, name)()

        def make_released(d: Any, strategy: Any = strategy, **kw: Any) -> Any:
            return released.scDataset(d, strategy, batch_size=64, **kw)

        def make_rankwise(d: Any, name: str = name, **kw: Any) -> Any:
            return sc.scDataset(d, getattr(sc, name)(), batch_size=64, **kw)

        assert counts(make_released, 10_000, 4) == [48, 45, 32, 32]
        assert counts(make_rankwise, 10_000, 4) == [40] * 4  # ceil(2,500 / 64)
    # Weighted strategies, same inputs: the released counts differ again, rankwise's do not.
    weights = np.arange(10_000) % 7 + 1.0
    make_w = lambda d, **kw: released.scDataset(  # noqa: E731
        d, released.BlockWeightedSampling(weights=weights), batch_size=64, **kw
    )
    assert len(set(counts(make_w, 10_000, 4))) > 1
    for strategy in (sc.BlockWeightedSampling(weights=weights), sc.ClassBalancedSampling(weights)):
        make = lambda d, s=strategy, **kw: sc.scDataset(d, s, batch_size=64, **kw)  # noqa: E731
        assert counts(make, 10_000, 4) == [40] * 4


def ddp_loop(package: str) -> int:
    """One epoch of DDP steps over a 3,000-row scDataset (batch 64, 2 ranks): the released
    package gives 31 and 16 batches (fetches of 1,024 rows: rank 0 reads two of the three),
    so rank 1 stops while rank 0 still all-reduces."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    mod = __import__(package, fromlist=["scDataset"])
    data = np.random.default_rng(0).random((3_000, 4), dtype=np.float32)
    ds = mod.scDataset(data, mod.BlockShuffling(block_size=8), batch_size=64, seed=0)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    steps = 0
    for batch in torch.utils.data.DataLoader(ds, batch_size=None):
        model(torch.as_tensor(batch)).pow(2).mean().backward()
        steps += 1
    return steps


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_ddp_loop_finishes_on_rankwise_and_breaks_on_the_released_package() -> None:
    steps = run_distributed(ddp_loop, 2, args=("rankwise.compat.scdataset",), timeout=120)
    assert steps == [24, 24]  # ceil(1,500 / 64) on each rank
    pytest.importorskip("scdataset")
    # Unequal counts: the rank with fewer batches leaves while its peer waits in an
    # all-reduce, which fails (the peer's connection closes) or hangs until the timeout.
    with pytest.raises((RankFailedError, TimeoutError)):
        run_distributed(ddp_loop, 2, args=("scdataset",), timeout=60)


# ------------------------------------------------------------------------------ the ports


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_basic_ddp_splits_each_epoch_over_two_ranks(tmp_path: Path) -> None:
    # A short TMPDIR: the DataLoader workers' AF_UNIX sockets live under it, and a path past
    # 108 bytes (pytest's numbered, per-worker folders grow) makes them fail and the run hang.
    with tempfile.TemporaryDirectory(prefix="sc-") as short:
        epochs = epochs_of(torchrun("basic_ddp.py", tmp_path, tmp=Path(short)))
        assert not list(Path(short).glob("**/*.h5ad"))  # the temporary data set was deleted
    assert sorted(epochs) == [0, 1, 2]
    orders = []
    for per_rank in epochs.values():
        assert sorted(per_rank) == [0, 1]
        (b0, r0), (b1, r1) = per_rank[0], per_rank[1]
        assert b0 == b1 == 4  # 500 rows each in batches of 128: equal, so DDP cannot hang
        assert sorted(r0 + r1) == list(range(1000))  # each cell once per epoch
        orders.append(r0)
    assert len({tuple(o) for o in orders}) == 3  # set_epoch: a new order every epoch


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_complete_training_trains_in_sync(tmp_path: Path) -> None:
    out = torchrun("complete_training.py", tmp_path)
    epochs = epochs_of(out)
    assert sorted(epochs) == list(range(10))
    for per_rank in epochs.values():
        (b0, r0), (b1, r1) = per_rank[0], per_rank[1]
        assert b0 == b1 == 2  # 1,000 rows per rank in batches of 512
        assert sorted(r0 + r1) == list(range(2000))
    losses = [float(x) for x in re.findall(rf"Epoch \d+, Batch 0, Loss: ({NUM})", out)]
    assert len(losses) == 10 and losses[-1] < 0.5 * losses[0]  # printed on rank 0 only
    checksums = re.findall(rf"rank (\d) parameter checksum ({NUM})", out)
    assert len(checksums) == 2 and checksums[0][1] == checksums[1][1]  # DDP kept them equal


@pytest.mark.timeout(150)
def test_manual_rank_reads_its_quarter() -> None:
    out = run_plain("manual_rank.py").splitlines()
    assert out[0] == "rank 2 of 4: 2 batches, 250 rows"
    rows = eval(out[1].removeprefix("rows "))
    # The other three ranks, built the same way, read the rest: together each row once.
    ad = pytest.importorskip("anndata")
    x = np.arange(1000, dtype=np.float32)[:, None]
    others = []
    for rank in (0, 1, 3):
        ds = sc.scDataset(
            ad.AnnData(X=x),
            sc.BlockShuffling(block_size=64),
            batch_size=128,
            fetch_callback=lambda a, idx: fetch_transform_adata(a[idx]),
            rank=rank,
            world_size=4,
        )
        others += [int(v) for b in ds for v in b[:, 0]]
    assert sorted(rows + others) == list(range(1000))


@pytest.mark.timeout(150)
def test_partitioning_prints_the_guides_round_robin() -> None:
    out = run_plain("partitioning.py").splitlines()
    assert out[:4] == [
        f"Rank {r}: samples at positions {r}, {r + 4}, {r + 8}, ... (250 samples)" for r in range(4)
    ]
    assert out[4:] == [
        f"batch_size=128, fetch_factor=16, rank {r}: 2 batches, 250 samples" for r in range(4)
    ]


@pytest.mark.timeout(150)
def test_set_epoch_gives_a_new_order_each_epoch() -> None:
    assert run_plain("set_epoch.py").splitlines() == [
        "epochs 100, each a permutation of the 64 rows: True",
        "distinct orders: 100",
        "without set_epoch: the order of epoch 99 again: True",
    ]


# ------------------------------------------------------------------ ports vs the guide

GUIDE = "scdataset-distributed-guide.rst"
SWAP = {
    "from scdataset import scDataset, BlockShuffling": (
        "from rankwise.compat.scdataset import scDataset, BlockShuffling"
    ),
    "from scdataset.transforms import fetch_transform_adata": (
        "from rankwise.compat.scdataset.transforms import fetch_transform_adata"
    ),
}
# What runs on one GPU per rank in the guide runs on gloo and the CPU without CUDA: the ports
# replace these statements with marked lines of their own (see each port's docstring).
ON_GPU = [
    "dist.init_process_group(backend='nccl')",
    "torch.cuda.set_device(local_rank)",
    "model = DDP(model, device_ids=[local_rank])",
    "batch = batch.to(local_rank)",
]
# port: (guide section, the import its snippet needs, the statements the port replaces)
PORTS: dict[str, tuple[str, str, list[str]]] = {
    "basic_ddp.py": (
        "Basic DDP Setup",
        "from rankwise.compat.scdataset import scDataset, BlockShuffling",
        [*ON_GPU, "model = YourModel().to(local_rank)", "pass"],  # pass: one DDP step
    ),
    "manual_rank.py": (
        "Manual Rank Configuration",
        "from rankwise.compat.scdataset import scDataset, BlockShuffling",
        [],
    ),
    "partitioning.py": (
        "Data Partitioning",
        "from rankwise.compat.scdataset import scDataset, Streaming",
        [],
    ),
    "set_epoch.py": (
        "The ``set_epoch()`` Method",
        "from rankwise.compat.scdataset import scDataset, BlockShuffling",
        [],
    ),
    "complete_training.py": (
        "Complete Training Example",
        "from rankwise.compat.scdataset import scDataset, BlockShuffling",
        [
            *ON_GPU,
            "model = nn.Sequential(nn.Linear(adata.n_vars, 256), nn.ReLU(), "
            "nn.Linear(256, 128)).to(local_rank)",
            "print(f'Epoch {epoch}, Batch {batch_idx}, Loss: {loss.item():.4f}')",  # flushed
        ],
    ),
}


def test_every_port_is_listed() -> None:
    assert sorted(PORTS) == sorted(p.name for p in SC.glob("*.py"))


@pytest.mark.skipif(not seed_ports.SEEDS.exists(), reason="the seed guides are not here")
@pytest.mark.parametrize("port", sorted(PORTS))
def test_ports_change_only_the_imports(port: str) -> None:
    # The port's unmarked code, statement by statement, is the guide's with the imports swapped.
    section, needed, replaced = PORTS[port]
    heading = f"{section}\n{'-' * len(section)}"
    guide = seed_ports.guide_code(GUIDE, heading)
    expected = seed_ports.expected_units(guide, SWAP, replaced, needed)
    assert seed_ports.units((SC / port).read_text()) == expected
