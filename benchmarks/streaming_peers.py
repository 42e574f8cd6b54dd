"""Benchmark: rankwise's FetchDataset beside its peers on the same rows in object storage.

One SeaweedFS server (rankwise.testing.s3server), the dense ``.npy`` of benchmarks/streaming.py
(made by its ``make_files``; column 0 holds each row's id) and, for each reader:

- ``rankwise s3``: ``FetchDataset("s3://bench/x.npy", BlockShuffling(256))``, read in place;
- ``s3fs file object``: the same plan over an s3fs file object (streaming.py's ``S3fsRows``,
  s3fs's default read-ahead cache): what a user without rankwise reads through;
- ``LitData``: ``litdata.optimize`` (one item a row, ``chunk_bytes="64MB"``) to a local folder,
  uploaded; ``litdata.StreamingDataset(shuffle=True)`` + ``StreamingDataLoader``;
- ``MosaicML Streaming``: ``MDSWriter`` (shards of 64 MiB, its default) to a local folder,
  uploaded; ``streaming.StreamingDataset(shuffle=True)`` + its ``StreamingDataLoader``.

Columns: the conversion's seconds (write and upload; 0 where the file is read as it is), one
epoch's seconds at a world of one through ``--workers`` DataLoader workers (a fresh cache for the
peers, which download whole chunks), the GETs that sent bytes and the bytes, counted by the
server (``S3Server.traffic``: the one count that holds for every client), and a kill + resume
from 2 ranks to 3: ranks are simulated in this process through each reader's own API (rankwise's
``rank=`` / ``world_size=``; LitData's ``WORLD_SIZE`` / ``GLOBAL_RANK``; MosaicML's ``RANK`` /
``WORLD_SIZE`` with one rank a node). Each of 2 ranks reads half of its epoch, rank 0's state is
saved (rankwise: ``state_dict`` after ``advance``; the peers: their loader's ``state_dict``),
3 new ranks load it and read to the end; each row id's count over the epoch gives "exact" or
"repeats N / misses M". A peer that is not installed is skipped with how to install it (in a
venv of its own: see benchmarks/RESULTS.md). Prints a table, writes
benchmarks/out/streaming_peers.json.

    python benchmarks/streaming_peers.py                       # rankwise and s3fs only
    /work/peers-venv/bin/python benchmarks/streaming_peers.py  # with the peers installed there
    python benchmarks/streaming_peers.py --rows 2048 --cols 64 --workers 0   # smallest
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_header import run_header

HERE = Path(__file__).resolve().parent


def _load_streaming_bench() -> Any:
    """benchmarks/streaming.py under a name of its own: MosaicML's package is ``streaming``
    too, so this folder leaves ``sys.path`` once both are loaded."""
    spec = importlib.util.spec_from_file_location("rankwise_bench_streaming", HERE / "streaming.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
    return module


_bench = _load_streaming_bench()
KEY, OUT, SECRET = _bench.KEY, _bench.OUT, _bench.SECRET
S3fsRows, make_files = _bench.S3fsRows, _bench.make_files

BUCKET = "bench"
BLOCK, BATCH, FETCH_FACTOR = 256, 256, 4
INSTALL = {
    "litdata": "pip install -c constraints.txt litdata  (in a venv of its own: benchmarks/RESULTS.md)",
    "streaming": "pip install -c constraints.txt mosaicml-streaming  (a venv of its own, with "
    "benchmarks/peer_stubs/torchvision: benchmarks/RESULTS.md)",
    "datasets": "pip install -c constraints.txt datasets  (a venv of its own: its "
    "huggingface_hub conflicts with the other peers'; benchmarks/RESULTS.md)",
}


def resume_verdict(counts: Counter[int], rows: int, before: int, world: int = 3) -> str:
    """Whether every row id 0..rows-1 came once ("exact"), else how many repeats and misses.

    ``before`` rows were read before the kill; the rest, split over ``world`` equal ranks, may
    repeat up to ``world - 1`` rows as padding (as DistributedSampler pads): told apart.
    """
    repeats = sum(c - 1 for c in counts.values() if c > 1)
    misses = sum(1 for i in range(rows) if counts[i] == 0)
    strays = sum(1 for i in counts if not 0 <= i < rows)
    if strays:
        return f"{strays} ids outside 0..{rows - 1}"
    padding = -(rows - before) % world
    if not misses and repeats in (0, padding):
        return "exact" + (f" (+{repeats} padding rows)" if repeats else "")
    return f"repeats {repeats} / misses {misses}"


def ids_of(batch: Any) -> list[int]:
    """Row ids of a batch: column 0 of dense rows, or a peer's ``id`` field."""
    if isinstance(batch, dict):
        return [int(i) for i in np.asarray(batch["id"]).reshape(-1)]
    return [int(i) for i in np.asarray(batch)[:, 0]]


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set environment variables (a simulated rank's) for the block, then restore them."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def timed_epoch(batches: Callable[[], Iterable[Any]], server: Any) -> dict[str, Any]:
    """One pass over ``batches()``: seconds, rows, and the server's count of GETs and bytes."""
    before = server.traffic(BUCKET)
    t0 = time.perf_counter()
    rows = sum(len(ids_of(b)) for b in batches())
    seconds = time.perf_counter() - t0
    served = server.traffic(BUCKET) - before
    return {
        "epoch_s": round(seconds, 3),
        "rows_read": rows,
        "gets": served.gets,
        "other_get_class": served.reads - served.gets,
        "bytes": served.bytes_sent,
    }


def upload(store: Any, folder: Path, prefix: str) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            store.put(path, f"{prefix}/{path.relative_to(folder)}")


# -- rankwise and the s3fs baseline (FetchDataset's plan over either) ------------------------------


def fetch_reader(source: Any, args: argparse.Namespace, server: Any, rows: int) -> dict[str, Any]:
    from rankwise.data import BlockShuffling, FetchDataset

    def make(rank: int, world: int) -> FetchDataset:
        ds = FetchDataset(
            source,
            BlockShuffling(block_size=BLOCK),
            BATCH,
            fetch_factor=FETCH_FACTOR,
            rank=rank,
            world_size=world,
            seed=0,
        )
        ds.set_epoch(1)
        return ds

    def loader() -> Iterable[Any]:
        return torch.utils.data.DataLoader(make(0, 1), batch_size=None, num_workers=args.workers)

    row = {"conversion_s": 0.0} | timed_epoch(loader, server)
    counts: Counter[int] = Counter()
    two = [make(r, 2) for r in range(2)]
    half = len(two[0]) // 2
    for ds in two:
        for i, batch in enumerate(ds):
            if i == half:
                break
            counts.update(ids_of(batch))
    before = sum(counts.values())
    for ds in two:
        ds.advance(half)  # every rank consumed `half` batches
    state = two[0].state_dict()
    for r in range(3):
        ds = make(r, 3)
        ds.load_state_dict(state)
        for batch in ds:
            counts.update(ids_of(batch))
    row["resume_2_to_3"] = resume_verdict(counts, rows, before)
    return row


# -- LitData ---------------------------------------------------------------------------------------


def _lit_item(path: str, index: int) -> dict[str, Any]:
    x = np.load(path, mmap_mode="r")
    return {"id": index, "x": np.array(x[index])}


def _lit_allow_http() -> None:
    """LitData's obstore client refuses a plain-http endpoint (this local server) unless told,
    through a private option (set in this process; forked DataLoader workers inherit it)."""
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True  # type: ignore[index]


def litdata_reader(
    npy: Path, store: Any, args: argparse.Namespace, server: Any, rows: int
) -> dict[str, Any]:
    import litdata

    _lit_allow_http()
    work = Path(tempfile.mkdtemp(prefix="rankwise-peers-lit-"))
    t0 = time.perf_counter()
    # optimize() sets this process's start method to "spawn" for good (litdata's DataProcessor:
    # multiprocessing.set_start_method(..., force=True)); every DataLoader made after it in
    # the same process then spawns its workers, each importing torch, litdata and this script
    # again (seconds each, before the first batch). A training script that does not convert
    # keeps the platform's default (fork here), so it is put back once the conversion is done.
    start_method = multiprocessing.get_start_method(allow_none=True)
    litdata.optimize(
        fn=functools.partial(_lit_item, str(npy)),
        inputs=list(range(rows)),
        output_dir=str(work / "optimized"),
        chunk_bytes="64MB",
        num_workers=max(1, args.workers),
    )
    multiprocessing.set_start_method(start_method, force=True)
    upload(store, work / "optimized", "litdata")
    conversion = time.perf_counter() - t0
    options = {"endpoint_url": server.endpoint}
    caches = iter(range(1000))

    def dataset(cache: str = "") -> Any:
        # a fresh cache for each timed epoch; one for all simulated ranks of the resume (LitData
        # refuses a state saved under another cache path)
        return litdata.StreamingDataset(
            f"s3://{BUCKET}/litdata",
            cache_dir=str(work / (cache or f"cache-{next(caches)}")),
            shuffle=True,
            seed=0,
            storage_options=options,
        )

    def loader() -> Iterable[Any]:
        return litdata.StreamingDataLoader(dataset(), batch_size=BATCH, num_workers=args.workers)

    row = {"conversion_s": round(conversion, 3)} | timed_epoch(loader, server)
    counts: Counter[int] = Counter()
    state = None
    for r in range(2):
        with environment(WORLD_SIZE="2", GLOBAL_RANK=str(r)):
            dl = litdata.StreamingDataLoader(dataset("resume"), batch_size=BATCH, num_workers=0)
            half = len(dl) // 2
            for i, batch in enumerate(dl):
                counts.update(ids_of(batch))
                if i + 1 == half:
                    break
            if r == 0:
                state = dl.state_dict()
    before = sum(counts.values())
    try:
        for r in range(3):
            with environment(WORLD_SIZE="3", GLOBAL_RANK=str(r)):
                dl = litdata.StreamingDataLoader(dataset("resume"), batch_size=BATCH, num_workers=0)
                dl.load_state_dict(state)  # type: ignore[arg-type]
                for batch in dl:
                    counts.update(ids_of(batch))
        row["resume_2_to_3"] = resume_verdict(counts, rows, before)
    except Exception as error:  # the peer's own refusal is the finding
        row["resume_2_to_3"] = f"cannot resume on another world size: {error}".splitlines()[0]
    shutil.rmtree(work, ignore_errors=True)
    return row


# -- MosaicML Streaming ----------------------------------------------------------------------------


def mds_reader(
    npy: Path, store: Any, args: argparse.Namespace, server: Any, rows: int
) -> dict[str, Any]:
    from streaming import MDSWriter, StreamingDataLoader, StreamingDataset

    os.environ["S3_ENDPOINT_URL"] = server.endpoint
    work = Path(tempfile.mkdtemp(prefix="rankwise-peers-mds-"))
    x = np.load(npy, mmap_mode="r")
    cols = x.shape[1]
    t0 = time.perf_counter()
    with MDSWriter(
        out=str(work / "mds"), columns={"id": "int64", "x": f"ndarray:float32:{cols}"}
    ) as w:
        for i in range(rows):
            w.write({"id": i, "x": np.array(x[i])})
    upload(store, work / "mds", "mds")
    conversion = time.perf_counter() - t0
    locals_ = iter(range(1000))

    def dataset() -> Any:
        return StreamingDataset(
            remote=f"s3://{BUCKET}/mds",
            local=str(work / f"local-{next(locals_)}"),
            shuffle=True,
            shuffle_seed=0,
            batch_size=BATCH,
        )

    one_node = {"LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0"}

    def loader() -> Iterable[Any]:
        with environment(WORLD_SIZE="1", RANK="0", **one_node):
            return list(StreamingDataLoader(dataset(), batch_size=BATCH, num_workers=args.workers))

    row = {"conversion_s": round(conversion, 3)} | timed_epoch(loader, server)
    # MosaicML's ranks are processes (it starts a torch.distributed group when WORLD_SIZE > 1):
    # 2 real ranks on this host read half their epoch, rank 0 saves the state; 3 resume it.
    counts: Counter[int] = Counter()
    state_file = work / "state.json"
    before = 0
    for phase, world in (("kill", 2), ("resume", 3)):
        ids = mds_ranks(phase, world, work, state_file)
        if isinstance(ids, str):
            row["resume_2_to_3"] = f"cannot resume on another world size: {ids}"
            break
        counts.update(ids)
        before = before or sum(counts.values())
    else:
        row["resume_2_to_3"] = resume_verdict(counts, rows, before)
    shutil.rmtree(work, ignore_errors=True)
    return row


def mds_ranks(phase: str, world: int, work: Path, state_file: Path) -> list[int] | str:
    """Run ``world`` MosaicML ranks of ``phase`` as processes on this host (one node); the row
    ids they read, or the first failing rank's last error line."""
    import socket
    import subprocess

    from rankwise.testing import rank_env

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    procs = []
    for r in range(world):
        env = rank_env(r, world, port, {"LOCAL_WORLD_SIZE": str(world)})
        job = [sys.executable, __file__, "--mds-rank", phase, str(work), str(state_file)]
        procs.append(subprocess.Popen(job, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    ids: list[int] = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        if p.returncode != 0:
            return err.decode(errors="replace").strip().splitlines()[-1]
        ids += json.loads(out.decode().strip().splitlines()[-1])
    return ids


def mds_rank(phase: str, work: Path, state_file: Path) -> None:
    """One MosaicML rank (``--mds-rank``): ``kill`` reads half its batches (rank 0 saves the
    loader's state), ``resume`` loads it and reads the rest; prints the row ids as JSON."""
    from streaming import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(
        remote=f"s3://{BUCKET}/mds",
        local=str(work / f"local-{phase}"),
        shuffle=True,
        shuffle_seed=0,
        batch_size=BATCH,
    )
    dl = StreamingDataLoader(ds, batch_size=BATCH, num_workers=0)
    ids: list[int] = []
    if phase == "resume":
        dl.load_state_dict(json.loads(state_file.read_text()))
        for batch in dl:
            ids += ids_of(batch)
    else:
        half = len(dl) // 2
        for i, batch in enumerate(dl):
            ids += ids_of(batch)
            if i + 1 == half:
                break
        state = dl.state_dict()
        if os.environ["RANK"] == "0":
            state_file.write_text(json.dumps(state))
    print(json.dumps(ids), flush=True)


# -- Hugging Face datasets, streaming over Parquet -------------------------------------------------

HF_FILES = 12  # Parquet files: a multiple of 2 and 3, so split_dataset_by_node splits by file


def hf_reader(
    npy: Path, store: Any, args: argparse.Namespace, server: Any, rows: int
) -> dict[str, Any]:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.distributed import split_dataset_by_node

    work = Path(tempfile.mkdtemp(prefix="rankwise-peers-hf-"))
    x = np.load(npy, mmap_mode="r")
    t0 = time.perf_counter()
    (work / "hf").mkdir()
    for f, part in enumerate(np.array_split(np.arange(rows), HF_FILES)):
        values = pa.array(np.ascontiguousarray(x[part]).reshape(-1))
        table = pa.table(
            {
                "id": pa.array(part, pa.int64()),
                "x": pa.FixedSizeListArray.from_arrays(values, x.shape[1]),
            }
        )
        pq.write_table(table, work / "hf" / f"part-{f:02d}.parquet", row_group_size=BLOCK)
    upload(store, work / "hf", "hf")
    conversion = time.perf_counter() - t0

    def dataset(rank: int, world: int) -> Any:
        ds = datasets.load_dataset(
            "parquet",
            data_files=f"s3://{BUCKET}/hf/*.parquet",
            split="train",
            streaming=True,
            storage_options={"endpoint_url": server.endpoint, "key": KEY, "secret": SECRET},
        ).shuffle(seed=0, buffer_size=BATCH * FETCH_FACTOR)
        return split_dataset_by_node(ds, rank=rank, world_size=world) if world > 1 else ds

    def loader() -> Iterable[Any]:
        ds = dataset(0, 1).with_format("numpy")
        return torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=args.workers)

    row = {"conversion_s": round(conversion, 3)} | timed_epoch(loader, server)
    counts: Counter[int] = Counter()
    state = None
    for r in range(2):
        ds = dataset(r, 2)
        half = rows // 4  # each rank holds half the files: read half of them
        for i, example in enumerate(ds):
            counts[int(example["id"])] += 1
            if i + 1 == half:
                break
        if r == 0:
            state = ds.state_dict()
    before = sum(counts.values())
    try:
        for r in range(3):
            ds = dataset(r, 3)
            ds.load_state_dict(state)
            for example in ds:
                counts[int(example["id"])] += 1
        row["resume_2_to_3"] = resume_verdict(counts, rows, before)
    except Exception as error:
        row["resume_2_to_3"] = f"cannot resume on another world size: {error}".splitlines()[0]
    shutil.rmtree(work, ignore_errors=True)
    return row


# -- the run ---------------------------------------------------------------------------------------


READERS = (
    "rankwise s3",
    "s3fs file object (default cache), rankwise plan",
    "LitData",
    "MosaicML Streaming",
    "HF datasets (Parquet, streaming)",
)
NEEDS = {
    "LitData": "litdata",
    "MosaicML Streaming": "streaming",
    "HF datasets (Parquet, streaming)": "datasets",
}


def measure(name: str, args: argparse.Namespace, server: Any) -> dict[str, Any]:
    """One reader's row (``--reader``: run in a process of its own, so that no reader inherits
    another's clients: obstore's runtime, started in a parent, breaks a forked worker's)."""
    from rankwise.data.sources import open_source
    from rankwise.storage import Storage

    npy = make_files(OUT / "streaming_peers", args.rows, args.cols, 64, 8)["npy"]
    rows, url = args.rows, f"s3://{BUCKET}/{npy.name}"
    store = Storage.for_url(f"s3://{BUCKET}")
    if name == "rankwise s3":
        row = fetch_reader(url, args, server, rows)
    elif name.startswith("s3fs"):
        layout = open_source(url).layout  # type: ignore[attr-defined]
        meta = {"row_bytes": layout.row_bytes, "offset": layout.extents[0][2]}
        row = fetch_reader(S3fsRows(url, "npy", (rows, args.cols), meta), args, server, rows)
    elif name == "LitData":
        row = litdata_reader(npy, store, args, server, rows)
    elif name.startswith("HF"):
        row = hf_reader(npy, store, args, server, rows)
    else:
        row = mds_reader(npy, store, args, server, rows)
    return {"reader": name} | row | {"bytes_vs_data": round(row["bytes"] / npy.stat().st_size, 2)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import subprocess

    from rankwise.storage import Storage
    from rankwise.testing.s3server import start_server

    # streaming.py's files: the dense rows used here (and a tiny CSR it makes beside them).
    npy = make_files(OUT / "streaming_peers", args.rows, args.cols, 64, 8)["npy"]
    server = start_server(
        Path(tempfile.mkdtemp(prefix="rankwise-bench-s3-")), credentials=(KEY, SECRET)
    )
    os.environ.update(
        AWS_ENDPOINT_URL=server.endpoint,
        AWS_ACCESS_KEY_ID=KEY,
        AWS_SECRET_ACCESS_KEY=SECRET,
        AWS_REGION="us-east-1",
        AWS_DEFAULT_REGION="us-east-1",
    )
    results: list[dict[str, Any]] = []
    skipped: list[str] = []
    try:
        import s3fs

        s3fs.S3FileSystem(skip_instance_cache=True).mkdir(BUCKET)
        Storage.for_url(f"s3://{BUCKET}").put(npy, npy.name)
        for name in READERS:
            module = NEEDS.get(name)
            if name in args.skip:
                continue
            if module and importlib.util.find_spec(module) is None:
                line = f"{name}: not installed, skipped ({INSTALL[module]})"
                print(line, flush=True)
                skipped.append(line)
                continue
            job = [sys.executable, __file__, "--reader", name, json.dumps(server.ports)]
            job += ["--rows", str(args.rows), "--cols", str(args.cols)]
            job += ["--workers", str(args.workers)]
            done = subprocess.run(job, stdout=subprocess.PIPE, text=True, timeout=900)
            if done.returncode != 0:
                raise RuntimeError(f"{name}: its run failed (exit {done.returncode}; see above)")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            results.append(row)
            print(json.dumps(row), flush=True)
    finally:
        server.stop()
    return run_header(
        rows=args.rows,
        cols=args.cols,
        workers=args.workers,
        block=BLOCK,
        batch=BATCH,
        results=results,
        skipped=skipped,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=25_600)
    parser.add_argument("--cols", type=int, default=1_024)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT / "streaming_peers.json")
    parser.add_argument("--skip", nargs="*", default=[], help="reader names to leave out")
    parser.add_argument("--mds-rank", nargs=3, help=argparse.SUPPRESS)  # one MosaicML rank
    parser.add_argument("--reader", nargs=2, help=argparse.SUPPRESS)  # one reader: name, ports
    args = parser.parse_args()
    if args.reader:
        from rankwise.testing.s3server import S3Server

        name, ports = args.reader
        server = S3Server(Path(tempfile.gettempdir()), json.loads(ports))  # started by the parent
        print(json.dumps(measure(name, args, server)), flush=True)
        return
    if args.mds_rank:
        phase, work, state = args.mds_rank
        mds_rank(phase, Path(work), Path(state))
        return
    if args.rows < 4 * BLOCK or args.cols < 1:
        parser.error(
            f"--rows {args.rows} --cols {args.cols}: give at least {4 * BLOCK} rows (4 blocks) "
            "and one column"
        )
    report = run(args)
    print()
    print(
        "| reader | conversion s | epoch s | GETs | bytes / file | kill at 2 ranks, resume at 3 |"
    )
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for r in report["results"]:
        print(
            f"| {r['reader']} | {r['conversion_s']} | {r['epoch_s']} | {r['gets']} | "
            f"{r['bytes_vs_data']} | {r['resume_2_to_3']} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
