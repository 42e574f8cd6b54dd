"""Benchmark: reading a backed .h5ad by random single rows vs FetchDataset strategies.

Writes a dense .h5ad (default 100,000 x 128 float32) under benchmarks/out/, then measures
samples/s for: random single-row reads (``adata.X[i]``, the baseline), Streaming, and
BlockShuffling at several block sizes and fetch factors. Diversity of a batch = entropy (bits)
of which batch-sized segment of the file its rows come from: log2(batch_size) for a uniform
shuffle, 0 for rows read in order. Prints a table, writes benchmarks/out/blocks.json.

Then, when the released ``scdataset`` is installed (the ``dev`` extra), the same epoch with
``scdataset.scDataset`` and ``rankwise.compat.scdataset.scDataset`` side by side, for every rank
of ``--ranks`` (simulated with ``rank=`` / ``world_size=``, one after the other), both reading
rows through the same callback: samples/s and the batches each rank yields.

    python benchmarks/blocks.py                       # 100k rows, a few minutes at most
    python benchmarks/blocks.py --rows 1000000 --cols 256
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

OUT = Path(__file__).resolve().parent / "out"


def make_file(path: Path, rows: int, cols: int) -> None:
    import anndata as ad

    if path.exists():
        return
    x = np.random.default_rng(0).random((rows, cols), dtype=np.float32)
    x[:, 0] = np.arange(rows)  # column 0 holds the row id, to measure diversity
    ad.AnnData(X=x).write_h5ad(path)


def entropy_bits(row_ids: np.ndarray, segment: int) -> float:
    _, counts = np.unique(row_ids.astype(np.int64) // segment, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def random_rows(adata: Any, count: int, batch_size: int) -> dict[str, float]:
    rng = np.random.default_rng(1)
    ids = rng.choice(adata.n_obs, size=count, replace=False)
    t0 = time.perf_counter()
    rows = [np.asarray(adata.X[int(i)]) for i in ids]
    seconds = time.perf_counter() - t0
    ids_read = np.stack(rows)[:, 0]
    batches = ids_read[: len(ids_read) // batch_size * batch_size].reshape(-1, batch_size)
    return {
        "samples_per_s": count / seconds,
        "diversity_bits": float(np.mean([entropy_bits(b, batch_size) for b in batches])),
    }


def fetch_dataset(
    adata: Any, strategy: Any, batch_size: int, fetch_factor: int
) -> dict[str, float]:
    from rankwise.data import FetchDataset, default_fetch

    # Read X through the h5py dataset (one slice per contiguous run); AnnData views are slower.
    ds = FetchDataset(
        adata,
        strategy,
        batch_size,
        fetch_factor=fetch_factor,
        fetch_callback=lambda a, idx: default_fetch(a.X, idx),
        rank=0,
        world_size=1,
    )
    ds.set_epoch(1)
    t0 = time.perf_counter()
    entropies, count = [], 0
    for batch in ds:
        count += len(batch)
        entropies.append(entropy_bits(batch[:, 0], batch_size))
    seconds = time.perf_counter() - t0
    return {"samples_per_s": count / seconds, "diversity_bits": float(np.mean(entropies))}


def read_rows(adata: Any, indices: np.ndarray) -> np.ndarray:
    """Rows of X, one h5py slice per run; repeated rows (the released package's weighted
    draws reach the callback with repeats, which h5py refuses) are read once."""
    from rankwise.data import default_fetch

    unique, where = np.unique(indices, return_inverse=True)
    data = default_fetch(adata.X, unique)
    return data if len(unique) == len(indices) else data[where]


def per_rank(
    module: Any, adata: Any, strategy: Any, batch_size: int, fetch_factor: int, ranks: int
) -> dict[str, Any]:
    """One epoch of ``module.scDataset`` on each of ``ranks`` ranks: samples/s, batches."""
    batches, count, seconds = [], 0, 0.0
    for rank in range(ranks):
        ds = module.scDataset(
            adata,
            strategy,
            batch_size,
            fetch_factor=fetch_factor,
            fetch_callback=read_rows,  # the same reads for both
            rank=rank,
            world_size=ranks,
            seed=0,
        )
        t0 = time.perf_counter()
        got = [len(b) for b in ds]
        seconds += time.perf_counter() - t0
        batches.append(len(got))
        count += sum(got)
    return {"samples_per_s": count / seconds, "batches_per_rank": batches}


def compare_released(
    adata: Any, rows: int, batch_size: int, ranks: int, repeats: int = 3
) -> list[dict[str, Any]]:
    """The released scdataset and rankwise's compat scDataset on the same file and strategies."""
    try:
        import scdataset
    except ImportError:
        print("\nscdataset is not installed: no comparison (pip install scDataset==0.3.0)")
        return []
    import rankwise.compat.scdataset as rw

    weights = np.random.default_rng(2).random(rows) + 0.1
    cases = []
    for name, block, args in (
        ("Streaming", 0, {}),
        ("BlockShuffling", 16, {"block_size": 16}),
        ("BlockWeightedSampling", 16, {"block_size": 16, "weights": weights}),
    ):
        best: dict[str, dict[str, Any]] = {}
        for _ in range(repeats):  # interleaved, best of `repeats`: the machine's load varies
            for package, module in (("scdataset 0.3.0", scdataset), ("rankwise", rw)):
                strategy = getattr(module, name)(**args)
                res = per_rank(module, adata, strategy, batch_size, 16, ranks)
                if package not in best or res["samples_per_s"] > best[package]["samples_per_s"]:
                    best[package] = res
        for package, res in best.items():
            cases.append({"package": package, "strategy": name, "block_size": block, **res})
    print(
        f"\nthe same epoch on each of {ranks} ranks, fetch_factor 16, batch_size {batch_size}, "
        f"rows read by the same callback; best of {repeats} interleaved runs\n"
    )
    print("| package | strategy | block size | samples/s | batches per rank |")
    print("|---|---|---|---|---|")
    for c in cases:
        counts = ", ".join(map(str, c["batches_per_rank"]))
        flag = "" if len(set(c["batches_per_rank"])) == 1 else " (unequal: DDP hangs)"
        print(
            f"| {c['package']} | {c['strategy']} | {c['block_size'] or '-'} | "
            f"{c['samples_per_s']:,.0f} | {counts}{flag} |"
        )
    return cases


def plot_path(text: str) -> Path | None:
    """``--plot``'s value: ``''`` means no plot (``Path('')`` is ``'.'``, which is truthy)."""
    return Path(text) if text else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--cols", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--random-samples", type=int, default=5_000, help="rows read by the baseline"
    )
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--fetch-factors", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument(
        "--ranks", type=int, default=4, help="ranks of the scdataset comparison (0 to skip)"
    )
    parser.add_argument(
        "--plot",
        type=plot_path,
        default=Path(__file__).resolve().parent / "blocks.png",
        help="where to draw throughput against diversity (needs matplotlib; '' to skip)",
    )
    args = parser.parse_args()

    import anndata as ad

    from rankwise.data import BlockShuffling, Streaming

    OUT.mkdir(exist_ok=True)
    path = OUT / f"bench_{args.rows}x{args.cols}.h5ad"
    make_file(path, args.rows, args.cols)
    adata = ad.read_h5ad(path, backed="r")
    b = args.batch_size
    cases = [
        {
            "method": "random single rows",
            "block_size": 1,
            "fetch_factor": 0,
            **random_rows(adata, args.random_samples, b),
        }
    ]
    cases.append(
        {
            "method": "Streaming",
            "block_size": 0,
            "fetch_factor": 16,
            **fetch_dataset(adata, Streaming(), b, 16),
        }
    )
    for bs in args.block_sizes:
        for ff in args.fetch_factors:
            res = fetch_dataset(adata, BlockShuffling(bs), b, ff)
            cases.append({"method": "BlockShuffling", "block_size": bs, "fetch_factor": ff, **res})
            print(
                f"block_size={bs:4d} fetch_factor={ff:3d}: {res['samples_per_s']:12,.0f} samples/s",
                flush=True,
            )
    base = cases[0]["samples_per_s"]
    print(
        f"\nfile {path.name}: {args.rows:,} rows x {args.cols} float32, batch_size {b}; "
        "diversity of a uniform shuffle = the random-rows row\n"
    )
    print("| method | block size | fetch factor | samples/s | vs random rows | diversity (bits) |")
    print("|---|---|---|---|---|---|")
    for c in cases:
        c["speedup"] = c["samples_per_s"] / base
        print(
            f"| {c['method']} | {c['block_size'] or '-'} | {c['fetch_factor'] or '-'} | "
            f"{c['samples_per_s']:,.0f} | {c['speedup']:.0f}x | {c['diversity_bits']:.2f} |"
        )
    released = compare_released(adata, args.rows, b, args.ranks) if args.ranks else []
    meta = {"rows": args.rows, "cols": args.cols, "batch_size": b, "cpus": os.cpu_count()}
    result = {"meta": meta, "cases": cases, "released": released}
    (OUT / "blocks.json").write_text(json.dumps(result, indent=2))
    print(f"\nwrote {OUT / 'blocks.json'}")
    if args.plot is not None:
        plot(cases, meta, args.plot)
    adata.file.close()


def plot(cases: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    """Samples/s against batch diversity: one line per fetch factor through the block sizes."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    shuffled = [c for c in cases if c["method"] == "BlockShuffling"]
    for ff in sorted({c["fetch_factor"] for c in shuffled}):
        line = sorted(
            (c for c in shuffled if c["fetch_factor"] == ff), key=lambda c: c["block_size"]
        )
        xs = [c["diversity_bits"] for c in line]
        ys = [c["samples_per_s"] for c in line]
        ax.plot(xs, ys, marker="o", label=f"BlockShuffling, fetch_factor={ff}")
        for c in line:
            ax.annotate(
                f"b={c['block_size']}",
                (c["diversity_bits"], c["samples_per_s"]),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=7,
            )
    # The baseline sits at the right edge: label it to the left of its marker.
    for c, marker, offset in ((cases[0], "X", (-115, 8)), (cases[1], "s", (8, -12))):
        ax.scatter(
            [c["diversity_bits"]],
            [c["samples_per_s"]],
            marker=marker,
            s=70,
            color="black",
            zorder=3,
        )
        ax.annotate(
            c["method"],
            (c["diversity_bits"], c["samples_per_s"]),
            textcoords="offset points",
            xytext=offset,
            fontsize=8,
        )
    ax.axhline(100 * cases[0]["samples_per_s"], color="grey", linestyle="--", linewidth=0.8)
    ax.text(
        0.05,
        100 * cases[0]["samples_per_s"] * 1.1,
        "100x random rows (goal)",
        fontsize=8,
        color="grey",
    )
    ax.set_yscale("log")
    ax.set_xlabel(f"batch diversity (bits; uniform shuffle = {cases[0]['diversity_bits']:.2f})")
    ax.set_ylabel("samples / s (log)")
    ax.set_title(
        f"Backed .h5ad, {meta['rows']:,} x {meta['cols']} float32, batch {meta['batch_size']}: "
        "faster reads vs better mixing",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
