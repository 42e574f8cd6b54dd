"""The local cache of FetchDataset (rankwise.data.cache) as a whole, by stateful testing: a
machine rewrites the object (same size or not, in place or by rename, a local file aged or
fresh), runs passes with a random cap, block size, plan and worker count, and deletes or
truncates random cache files; after every step every batch equals what reading the current
object directly gives, the bytes under cache_dir never exceed the last cap (marker files
aside), and nothing raises. On a local folder and memory://, and, smaller, on the real
SeaweedFS S3 server (ETags)."""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from rankwise.data import BlockShuffling, FetchDataset, Streaming, blocks
from rankwise.data.cache import MARKER
from rankwise.storage import Storage

pytestmark = pytest.mark.timeout(300)

COLS = 3
KEY = "x.npy"


def disk_bytes(folder: Path) -> int:
    """Bytes of every file under ``folder`` but the markers."""
    return sum(
        (Path(top) / name).stat().st_size
        for top, _, names in os.walk(folder)
        for name in names
        if name != MARKER
    )


def cache_files(folder: Path) -> list[Path]:
    return sorted(
        Path(top) / name for top, _, names in os.walk(folder) for name in names if name != MARKER
    )


def passes(ds: FetchDataset, workers: int) -> list[list[Any]]:
    """Each worker's batches of one pass, the workers run one after another in this process."""
    out = []
    with pytest.MonkeyPatch.context() as patch:
        for w in range(workers):
            info = SimpleNamespace(id=w, num_workers=workers)
            patch.setattr(blocks, "get_worker_info", lambda info=info: info)
            out.append(list(ds))
    return out


class CacheMachine(RuleBasedStateMachine):
    def __init__(self, folder_url: str, local: Path | None) -> None:
        super().__init__()
        self.store = Storage.for_url(folder_url)
        self.url = f"{folder_url}/{KEY}"
        self.local = local  # the object's path, for a local folder
        self.cache_dir = Path(tempfile.mkdtemp(prefix="rankwise-cache-machine-"))
        self.cap = 0  # the cap of the last pass that cached
        self.rows = 0
        self.aged = 0
        self.last: dict[str, Any] = {}

    def teardown(self) -> None:
        shutil.rmtree(self.cache_dir, ignore_errors=True)

    def write(self, rows: int, seed: int, in_place: bool) -> None:
        values = np.random.default_rng(seed).standard_normal((rows, COLS)).astype(np.float32)
        buffer = io.BytesIO()
        np.save(buffer, values)
        data = buffer.getvalue()
        if in_place and self.local is not None and rows == self.rows:
            with open(self.local, "r+b") as f:  # same inode, same size: only mtime differs
                f.write(data)
        else:
            self.store.put(data, KEY)
        self.rows = rows

    @initialize(rows=st.integers(8, 40), seed=st.integers(0, 2**16))
    def first(self, rows: int, seed: int) -> None:
        self.write(rows, seed, in_place=False)

    @rule(
        same_size=st.booleans(),
        rows=st.integers(8, 40),
        seed=st.integers(0, 2**16),
        in_place=st.booleans(),
    )
    def rewrite(self, same_size: bool, rows: int, seed: int, in_place: bool) -> None:
        self.write(self.rows if same_size else rows, seed, in_place)

    @precondition(lambda self: self.local is not None)
    @rule()
    def age(self) -> None:
        """The file as one written long ago (each time another old mtime): its tag is then
        trusted across opens, so later passes reuse the folder."""
        self.aged += 1
        old = time.time_ns() - 10 * 86_400 * 10**9 + self.aged * 10**9
        assert self.local is not None
        os.utime(self.local, ns=(old, old))

    @rule(
        cap_per_mille=st.integers(0, 2500),
        shuffle=st.booleans(),
        block_size=st.sampled_from([1, 2, 3, 4, 8]),
        batch_size=st.integers(1, 6),
        fetch_factor=st.integers(1, 3),
        workers=st.integers(1, 3),
        epoch=st.integers(0, 2),
        seed=st.integers(0, 3),
    )
    def run_pass(
        self,
        cap_per_mille: int,
        shuffle: bool,
        block_size: int,
        batch_size: int,
        fetch_factor: int,
        workers: int,
        epoch: int,
        seed: int,
    ) -> None:
        self.last = {
            "cap_per_mille": cap_per_mille,
            "shuffle": shuffle,
            "block_size": block_size,
            "batch_size": batch_size,
            "fetch_factor": fetch_factor,
            "workers": workers,
            "epoch": epoch,
            "seed": seed,
        }
        current = np.load(io.BytesIO(self.store.read(KEY)))  # the object, read directly
        cap = len(self.store.read(KEY)) * cap_per_mille // 1000
        kw: dict[str, Any] = {
            "strategy": BlockShuffling(block_size=block_size) if shuffle else Streaming(),
            "batch_size": batch_size,
            "fetch_factor": fetch_factor,
            "seed": seed,
            "rank": 0,
            "world_size": 1,
        }
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*has no version tag")
            ds = FetchDataset(self.url, cache_dir=self.cache_dir, cache_bytes=cap, **kw)
        want_ds = FetchDataset(current, **kw)
        ds.set_epoch(epoch)
        want_ds.set_epoch(epoch)
        got, want = passes(ds, workers), passes(want_ds, workers)
        assert [len(g) for g in got] == [len(w) for w in want]
        for g, w in zip(got, want, strict=True):
            for a, b in zip(g, w, strict=True):
                np.testing.assert_array_equal(a, b)
        if cap:
            self.cap = cap
            assert ds.cache is not None and ds.cache.held <= cap // workers

    @precondition(lambda self: self.last)
    @rule()
    def run_the_last_pass_again(self) -> None:
        """The last pass's plan once more: what a rewrite's stale entries would be served to."""
        self.run_pass(**self.last)

    @rule(pick=st.integers(0, 10**6), delete=st.booleans(), keep=st.floats(0, 0.99))
    def damage(self, pick: int, delete: bool, keep: float) -> None:
        files = cache_files(self.cache_dir)
        if not files:
            return
        victim = files[pick % len(files)]
        if delete:
            victim.unlink()
        else:
            data = victim.read_bytes()
            victim.write_bytes(data[: int(len(data) * keep)])

    @invariant()
    def within_the_cap(self) -> None:
        assert disk_bytes(self.cache_dir) <= self.cap


FAST = settings(
    max_examples=15,
    stateful_step_count=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_the_cache_serves_the_current_object_within_its_cap_local(tmp_path: Path) -> None:
    def machine() -> CacheMachine:
        folder = tmp_path / uuid.uuid4().hex[:8]
        return CacheMachine(str(folder), local=folder / KEY)

    run_state_machine_as_test(machine, settings=FAST)


def test_the_cache_serves_the_current_object_within_its_cap_memory() -> None:
    def machine() -> CacheMachine:
        return CacheMachine(f"memory://rankwise-cache-machine/{uuid.uuid4().hex[:8]}", None)

    run_state_machine_as_test(machine, settings=FAST)


def test_the_cache_serves_the_current_object_within_its_cap_s3(s3_bucket: str) -> None:
    def machine() -> CacheMachine:
        return CacheMachine(f"{s3_bucket}/machine-{uuid.uuid4().hex[:8]}", None)

    run_state_machine_as_test(
        machine,
        settings=settings(FAST, max_examples=3, stateful_step_count=6),
    )


def test_a_folder_removed_while_its_pass_reads_costs_only_store_reads(tmp_path: Path) -> None:
    """A pass of 2 workers is under way when a pass of 1 worker (another layout: its worker
    removes the 2-worker folders) runs over the same cache_dir: the first pass's batches stay
    right, nothing raises, and its later writes do not bring the removed folder back."""
    path = tmp_path / KEY
    np.save(path, np.arange(64 * COLS, dtype=np.float32).reshape(64, COLS))
    old = time.time_ns() - 86_400 * 10**9
    os.utime(path, ns=(old, old))  # an old file: its version tag holds across opens
    cache = tmp_path / "cache"
    kw: dict[str, Any] = {"batch_size": 4, "fetch_factor": 2, "rank": 0, "world_size": 1}
    strategy = BlockShuffling(block_size=4)
    two = FetchDataset(
        str(path), strategy, cache_dir=cache, cache_bytes=1 << 20, prefetch_bytes=0, **kw
    )
    want = passes(FetchDataset(np.load(path), strategy, **kw), 2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(blocks, "get_worker_info", lambda: SimpleNamespace(id=0, num_workers=2))
        reading = iter(two)
        got = [next(reading)]  # worker 0 of 2 has its folder, and reads
    assert two.cache is not None
    folder = two.cache.folder
    assert folder.is_dir()
    one = FetchDataset(str(path), strategy, cache_dir=cache, cache_bytes=1 << 20, **kw)
    list(one)  # worker 0 of 1: removes the folders of 2 workers
    assert not folder.exists()
    got += list(reading)  # the rest of worker 0's pass: from the store, its writes dropped
    for a, b in zip(got, want[0], strict=True):
        np.testing.assert_array_equal(a, b)
    assert not folder.exists()
    assert disk_bytes(cache) <= 1 << 20
