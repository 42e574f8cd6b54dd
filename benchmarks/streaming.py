"""Benchmark: FetchDataset reading a file in place from object storage (a local SeaweedFS).

Starts ``weed mini`` (rankwise.testing.s3server) on free ports, writes two files under
benchmarks/out/streaming/ and uploads them: a dense ``.npy`` (default 25,600 x 1,024 float32,
100 MiB; 1 MiB blocks of 256 rows) and a CSR ``.h5ad`` (default 20,480 x 2,000, ~20 nonzeros a
row; 16-row blocks). For each, one epoch of block-shuffled batches, world of one, through a
DataLoader with ``--workers`` workers, read:

- ``local``: the local file as users pass it today (``np.load(mmap_mode="r")``, page-cached;
  ``anndata.read_h5ad(backed="r")``), through ``default_fetch``: the baseline;
- ``rankwise path``: ``FetchDataset("/local/x.npy")``, rankwise's own ranged reader on disk;
- ``rankwise s3``: ``FetchDataset("s3://bucket/x.npy")``;
- ``anndata / h5py over s3fs``: the same rows through an s3fs file object (its default
  read-ahead cache), what a user without rankwise would write;
- ``rankwise s3, warm cache``: ``cache_dir=`` / ``cache_bytes=`` (twice the file), after an
  untimed epoch 0 filled it; the timed epoch is epoch 1 (another order).

"server CPU s" is what the SeaweedFS server itself spent during the best epoch (psutil): it
runs on the same cores as the readers, so on a 2-core machine an ``s3://`` epoch's floor is
about (the local epoch's CPU + the server's + the client's GETs') / 2. GETs and bytes are
counted by rankwise's storage (``Storage.requests`` / ``bytes_read``) in an in-process pass (no
workers: the same reads); "before 1st batch" is what opening costs. Prints a
table, writes benchmarks/out/streaming.json.

    python benchmarks/streaming.py                 # ~1-2 minutes on 2 cores
    python benchmarks/streaming.py --rows 51200 --workers 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_header import run_header

OUT = Path(__file__).resolve().parent / "out"
KEY, SECRET = "rankwise-bench", "rankwise-bench-secret"


def make_files(folder: Path, rows: int, cols: int, csr_rows: int, csr_cols: int) -> dict[str, Path]:
    import anndata
    import scipy.sparse

    folder.mkdir(parents=True, exist_ok=True)
    npy, h5ad = folder / f"dense-{rows}x{cols}.npy", folder / f"csr-{csr_rows}x{csr_cols}.h5ad"
    if not npy.exists():
        x = np.random.default_rng(0).random((rows, cols), dtype=np.float32)
        x[:, 0] = np.arange(rows)
        np.save(npy, x)
    if not h5ad.exists():
        x = scipy.sparse.random(
            csr_rows, csr_cols, density=0.01, format="csr", dtype=np.float32, random_state=0
        )
        anndata.AnnData(X=x).write_h5ad(h5ad)
    return {"npy": npy, "h5ad": h5ad}


def epoch(ds: Any, workers: int) -> tuple[float, int, float]:
    """Seconds for one epoch, batches, and seconds to the first batch."""
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    t0 = time.perf_counter()
    first, count = 0.0, 0
    for _ in loader:
        count += 1
        if count == 1:
            first = time.perf_counter() - t0
    return time.perf_counter() - t0, count, first


def server_cpu(server: Any) -> float:
    """CPU seconds the S3 server's processes have used so far (it runs on the same cores as
    the readers: what it spends serving an epoch is not the readers' to spend)."""
    import psutil

    root = psutil.Process(server.process.pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


class S3fsRows:
    """Rows of a file read through an s3fs file object (s3fs's default block cache): the
    baseline a user without rankwise writes. Opened lazily, per process."""

    def __init__(self, url: str, kind: str, shape: tuple[int, ...], meta: dict[str, Any]):
        self.url, self.kind, self.shape, self.meta = url, kind, shape, meta
        self._handle: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return self.shape[0]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handle": None}

    def _open(self) -> Any:
        if self._handle is None or self._pid != os.getpid():
            # per process: an s3fs instance used before a fork fails in the child with
            # "This class is not fork-safe" (FetchDataset probes the source in the parent)
            self._pid = os.getpid()
            import s3fs

            f = s3fs.S3FileSystem(skip_instance_cache=True).open(self.url, "rb")
            if self.kind == "h5ad":
                import anndata
                import h5py

                self._handle = anndata.io.sparse_dataset(h5py.File(f, "r")["X"])
            else:
                self._handle = f
        return self._handle

    def __getitem__(self, rows: np.ndarray) -> Any:
        h = self._open()
        if self.kind == "h5ad":
            return h[rows]
        row_bytes, offset = self.meta["row_bytes"], self.meta["offset"]
        from rankwise.data.sources import row_runs

        out = []
        for a, b in row_runs(rows):
            h.seek(offset + a * row_bytes)
            out.append(h.read((b - a) * row_bytes))
        return np.frombuffer(b"".join(out), np.float32).reshape(-1, *self.shape[1:])


def run(args: argparse.Namespace) -> dict[str, Any]:
    import anndata

    from rankwise.data import BlockShuffling, FetchDataset
    from rankwise.storage import Storage
    from rankwise.testing.s3server import start_server

    files = make_files(OUT / "streaming", args.rows, args.cols, args.csr_rows, args.csr_cols)
    server = start_server(
        Path(tempfile.mkdtemp(prefix="rankwise-bench-s3-")), credentials=(KEY, SECRET)
    )
    os.environ.update(
        AWS_ENDPOINT_URL=server.endpoint,
        AWS_ACCESS_KEY_ID=KEY,
        AWS_SECRET_ACCESS_KEY=SECRET,
        AWS_REGION="us-east-1",
    )
    results: list[dict[str, Any]] = []
    try:
        import s3fs

        s3fs.S3FileSystem(skip_instance_cache=True).mkdir("bench")
        store = Storage.for_url("s3://bench")
        urls = {}
        for kind, path in files.items():
            store.put(path, path.name)
            urls[kind] = f"s3://bench/{path.name}"
        settings = {
            "npy": {"block": 256, "batch": 256, "fetch_factor": 4},
            "h5ad": {"block": 16, "batch": 64, "fetch_factor": 16},
        }
        for kind, path in files.items():
            s = settings[kind]

            def make(source: Any, s: dict[str, int] = s, **extra: Any) -> FetchDataset:
                ds = FetchDataset(
                    source,
                    BlockShuffling(block_size=s["block"]),
                    s["batch"],
                    fetch_factor=s["fetch_factor"],
                    rank=0,
                    world_size=1,
                    seed=0,
                    **extra,
                )
                ds.set_epoch(1)
                return ds

            local: Any = (
                np.load(path, mmap_mode="r")
                if kind == "npy"
                else anndata.read_h5ad(path, backed="r")
            )
            if kind == "npy":
                np.asarray(local).sum()  # page-cache the file: the fair local baseline
            opened = make(urls[kind])
            meta_gets, meta_bytes = opened.source.storage.requests, opened.source.storage.bytes_read
            rows_used = opened.source.nbytes(np.arange(len(opened.source)))
            blocks = -(-len(opened.source) // s["block"])
            # GETs and bytes of one epoch, in-process (the same reads the workers make)
            t0 = time.perf_counter()
            for _ in opened:
                pass
            inproc = time.perf_counter() - t0
            gets = opened.source.storage.requests - meta_gets
            got = opened.source.storage.bytes_read - meta_bytes
            layout = getattr(opened.source, "layout", None)
            meta = {"row_bytes": getattr(layout, "row_bytes", 0)}
            if layout is not None:
                meta["offset"] = layout.extents[0][2]
            baseline_rows = S3fsRows(urls[kind], kind, tuple(opened.source.shape), meta)
            cases = [
                ("local file (today)", local),
                ("rankwise path", str(path)),
                ("rankwise s3", urls[kind]),
                ("anndata over s3fs" if kind == "h5ad" else "s3fs file", baseline_rows),
                ("rankwise s3, warm cache", urls[kind]),
            ]
            cache = {"cache_dir": tempfile.mkdtemp(prefix="rankwise-bench-cache-")}
            cache["cache_bytes"] = 2 * path.stat().st_size
            # The readers take turns, one epoch each per round, so that every reader's best
            # epoch comes from the same minutes (a shared machine's load drifts by +-30%).
            timed: dict[str, list[tuple[float, int, float, float]]] = {n: [] for n, _ in cases}
            warm = make(urls[kind], **cache)  # epoch 0 fills the cache; the timed ones differ
            warm.set_epoch(0)
            epoch(warm, args.workers)
            for _ in range(args.repeats):
                for name, source in cases:
                    ds = make(source, **(cache if name.endswith("warm cache") else {}))
                    before = server_cpu(server)
                    seconds, count, first = epoch(ds, args.workers)
                    timed[name].append((seconds, count, first, server_cpu(server) - before))
            baseline = min(timed[cases[0][0]])[0]
            for name, _ in cases:
                best, count, first, served = min(timed[name])
                row = {
                    "file": kind,
                    "reader": name,
                    "epoch_s": round(best, 3),
                    "vs_local": round(baseline / best, 2),
                    "batches": count,
                    "first_batch_s": round(first, 3),
                    "server_cpu_s": round(served, 2),
                }
                if name == "rankwise s3":
                    row |= {
                        "gets": gets,
                        "gets_per_block_per_array": round(
                            gets / blocks / (2 if kind == "h5ad" else 1), 2
                        ),
                        "bytes": got,
                        "bytes_vs_rows": round(got / rows_used, 2),
                        "gets_before_first_batch": meta_gets,
                        "in_process_epoch_s": round(inproc, 3),
                    }
                results.append(row)
                print(json.dumps(row), flush=True)
    finally:
        server.stop()
    return run_header(
        rows=args.rows,
        cols=args.cols,
        csr_rows=args.csr_rows,
        csr_cols=args.csr_cols,
        workers=args.workers,
        repeats=args.repeats,
        results=results,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=25_600)
    parser.add_argument("--cols", type=int, default=1_024)
    parser.add_argument("--csr-rows", type=int, default=20_480)
    parser.add_argument("--csr-cols", type=int, default=2_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="epochs per reader; best kept")
    args = parser.parse_args()
    report = run(args)
    print()
    print(
        "| file | reader | epoch s | x local | server CPU s | GETs/block/array "
        "| bytes / rows' bytes | GETs before 1st batch |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in report["results"]:
        print(
            f"| {r['file']} | {r['reader']} | {r['epoch_s']} | {r['vs_local']} | "
            f"{r['server_cpu_s']} | {r.get('gets_per_block_per_array', '')} | "
            f"{r.get('bytes_vs_rows', '')} | {r.get('gets_before_first_batch', '')} |"
        )
    OUT.mkdir(exist_ok=True)
    (OUT / "streaming.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
