"""The one store interface (``rankwise.storage.Storage``) on each backend: a local folder,
``memory://`` and a real S3 server (SeaweedFS). The same calls give the same answers; a local
write is atomic; a forked DataLoader worker reads through a client of its own."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch.utils.data
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rankwise.storage import RetryPolicy, Storage, StorageError
from rankwise.storage.ranges import merge_ranges

pytestmark = pytest.mark.timeout(60)


def test_every_backend_answers_the_same_calls(store_root: str, tmp_path: Path):
    store = Storage.for_url(f"{store_root}/run")
    assert store.names() == [] and store.names(folders=True) == []
    assert store.put(b"abc", "a.bin") == 3
    source = tmp_path / "source.bin"
    source.write_bytes(b"x" * 1000)
    reported: list[int] = []
    assert store.put(source, "b.bin", uploaded=reported.append) == 1000
    assert sum(reported) == 1000
    store.child("part.dcp").put(b"shard", "__0_0.distcp")

    assert store.names() == ["a.bin", "b.bin"]
    assert store.names(folders=True) == ["part.dcp"]
    assert store.read("a.bin") == b"abc" and store.size("b.bin") == 1000
    assert store.exists("a.bin") and not store.exists("nothing.bin")
    with store.open_read("b.bin") as f:
        assert f.read(4) == b"xxxx"
    assert store.download("a.bin", tmp_path / "got.bin").read_bytes() == b"abc"
    with pytest.raises(FileNotFoundError, match=r"/run/nothing\.bin does not exist"):
        store.read("nothing.bin")

    store.delete("a.bin", "nothing.bin")  # a missing key is fine
    store.child("part.dcp").delete("__0_0.distcp")
    store.delete("part.dcp")  # the folder's own entry, where a store keeps one
    assert store.names() == ["b.bin"]
    assert store.abort_uploads() == []
    store.check_writable()


def test_stat_gives_the_size_and_a_version_that_changes_with_every_write(store_root: str):
    store = Storage.for_url(f"{store_root}/stat")
    store.put(b"abc", "x.bin")
    first = store.stat("x.bin")
    assert first.size == 3 and first.version
    if not store.is_remote:  # a file written just now: its tag holds for one call only
        assert store.stat("x.bin").version != first.version
        old = time.time_ns() - 86_400 * 10**9
        os.utime(store.local_path / "x.bin", ns=(old, old))
        first = store.stat("x.bin")
    assert store.stat("x.bin") == first  # nothing written: the same tag
    store.put(b"abd", "x.bin")  # the same size, other bytes
    second = store.stat("x.bin")
    assert second.size == 3 and second.version and second.version != first.version
    with pytest.raises(FileNotFoundError, match=r"/stat/nothing\.bin does not exist"):
        store.stat("nothing.bin")


def test_a_local_write_is_atomic_and_leaves_no_temporary_file(tmp_path: Path):
    store = Storage.for_url(tmp_path / "run")
    store.put(b"old", "x.bin")
    with pytest.raises(FileNotFoundError):
        store.put(tmp_path / "missing.pt", "x.bin")  # the source vanished mid-save
    assert store.read("x.bin") == b"old"
    store.put(b"new", "x.bin")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["x.bin"]
    assert store.read("x.bin") == b"new"


def test_a_local_storage_has_a_local_path_and_a_remote_one_none(tmp_path: Path):
    for url in (str(tmp_path / "run"), f"file://{tmp_path}/run"):
        store = Storage.for_url(url)
        assert not store.is_remote and store.local_path == tmp_path / "run"
        store.check_writable()
        assert (tmp_path / "run").is_dir()
    with pytest.raises(TypeError, match="is remote storage; it has no local path"):
        _ = Storage.for_url("memory://rankwise-doc/x").local_path


class _Objects(torch.utils.data.Dataset[bytes]):
    def __init__(self, store: Storage, keys: list[str]) -> None:
        self.store, self.keys = store, keys

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> tuple[int, bytes]:
        return os.getpid(), self.store.read(self.keys[i])


def test_forked_dataloader_workers_read_through_their_own_client(store_root: str):
    store = Storage.for_url(f"{store_root}/data")
    keys = [f"{i}.bin" for i in range(6)]
    for i, key in enumerate(keys):
        store.put(bytes([i]) * 10, key)
    assert store.read(keys[0]) == bytes(10)  # the parent's client is made and used first
    loader = torch.utils.data.DataLoader(
        _Objects(store, keys),
        batch_size=None,
        num_workers=2,
        multiprocessing_context="fork",
    )
    got = list(loader)
    assert [data for _, data in got] == [bytes([i]) * 10 for i in range(6)]
    assert os.getpid() not in {pid for pid, _ in got}
    assert store.read(keys[5]) == bytes([5]) * 10  # and the parent's still works


def test_a_storage_error_names_the_url_and_never_the_secret():
    secret = "s3cr3t-never-shown"
    store = Storage.for_url(
        "s3://rankwise-nowhere/run",
        {"endpoint_url": "http://127.0.0.1:9", "key": "AKIAEXAMPLE", "secret": secret},
    )
    with pytest.raises(StorageError) as caught:
        store.check_writable()
    assert "s3://rankwise-nowhere/run" in str(caught.value)
    assert secret not in str(caught.value) and caught.value.reason == "unreachable"


def test_ranged_reads_merge_adjacent_ranges_on_every_backend(store_root: str):
    store = Storage.for_url(f"{store_root}/ranges")
    blob = bytes(range(256)) * 64  # 16 KiB
    store.put(blob, "x.bin")
    wanted = [(4000, 4100), (0, 10), (10, 20), (16000, 16384), (4100, 4101)]
    got = store.read_ranges("x.bin", wanted)
    assert got == [blob[a:b] for a, b in wanted]
    assert store.requests == 3 and store.bytes_read == 20 + 101 + 384  # touching ones merged
    assert store.read_ranges("x.bin", [(0, 4), (8, 12)], max_gap=4) == [blob[:4], blob[8:12]]
    assert store.requests == 4
    with pytest.raises(FileNotFoundError, match=r"/ranges/nothing\.bin does not exist"):
        store.read_ranges("nothing.bin", [(0, 4)])


BLOB = bytes(range(256)) * 64  # 16 KiB
# ranges anywhere in it, in any order: empty, touching and overlapping ones too
SOME_RANGES = st.lists(
    st.integers(0, len(BLOB)).flatmap(
        lambda a: st.integers(a, min(len(BLOB), a + 3000)).map(lambda b: (a, b))
    ),
    max_size=10,
)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(wanted=SOME_RANGES)
def test_ranges_read_into_one_buffer_are_the_ranges_read_apart(store_root: str, wanted):
    # read_ranges_into (a FetchDataset's one buffer per fetch; a local file's read straight
    # into it) gives exactly the bytes read_ranges gives, end to end, on every backend.
    store = Storage.for_url(f"{store_root}/into")
    if not store.exists("x.bin"):
        store.put(BLOB, "x.bin")
    out = bytearray(sum(b - a for a, b in wanted))
    before = store.bytes_read
    store.read_ranges_into("x.bin", wanted, out)
    assert bytes(out) == b"".join(BLOB[a:b] for a, b in wanted)
    # a remote store reads the merged ranges (overlaps once); a local file each range
    merged = sum(b - a for a, b in merge_ranges(wanted))
    assert store.bytes_read - before == (merged if store.is_remote else len(out))


def test_a_read_into_a_buffer_refuses_a_wrong_size_a_missing_key_and_a_short_object(
    store_root: str,
):
    store = Storage.for_url(f"{store_root}/into-errors")
    store.put(b"0123456789", "x.bin")
    with pytest.raises(ValueError, match="into holds 3 bytes; the ranges hold 4"):
        store.read_ranges_into("x.bin", [(0, 4)], bytearray(3))
    with pytest.raises(FileNotFoundError, match=r"/into-errors/nothing\.bin does not exist"):
        store.read_ranges_into("nothing.bin", [(0, 4)], bytearray(4))
    with pytest.raises(StorageError, match=r"got \d+ bytes for ranges of 8; the object is shorter"):
        store.read_ranges_into("x.bin", [(6, 14)], bytearray(8))
    store.read_ranges_into("nothing.bin", [(4, 4)], bytearray(0))  # nothing read, nothing asked
    assert store.requests == 0


@pytest.mark.parametrize("fork_safe", [True, False], ids=["s3fs", "obstore"])
def test_ranged_reads_from_a_store_that_never_answers_time_out_naming_the_url(
    silent_endpoint: str, fork_safe: bool
):
    if not fork_safe:
        pytest.importorskip("obstore")
    options = {
        "endpoint_url": silent_endpoint,
        "key": "rankwise-test-key",
        "secret": "rankwise-test-secret",
        "config_kwargs": {"read_timeout": 1},
    }
    store = Storage.for_url("s3://frozen-bucket/data", options, retry=RetryPolicy(attempts=1))
    started = time.monotonic()
    with pytest.raises(StorageError, match=r"read s3://frozen-bucket/data/x\.npy failed") as caught:
        store.read_ranges("x.npy", [(0, 10)], fork_safe=fork_safe)
    assert caught.value.reason == "unreachable" and "rankwise-test-secret" not in str(caught.value)
    assert time.monotonic() - started < 10


def test_obstore_ranged_reads_equal_s3fs_ones(s3_bucket: str):
    pytest.importorskip("obstore")
    store = Storage.for_url(f"{s3_bucket}/fast")
    blob = os.urandom(64 << 10)
    store.put(blob, "x.bin")
    wanted = [(100, 200), (200, 300), (5000, 5001), (60000, 65536)]
    assert store.read_ranges("x.bin", wanted, fork_safe=False) == [blob[a:b] for a, b in wanted]
    assert store.requests == 3
    with pytest.raises(FileNotFoundError, match=r"/fast/nothing\.bin does not exist"):
        store.read_ranges("nothing.bin", [(0, 4)], fork_safe=False)


def test_obstore_reads_only_where_it_authenticates_as_s3fs_would(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch
):
    pytest.importorskip("obstore")
    from rankwise.storage import fast_ranges

    # The real server's set-up (keys and endpoint in the environment): obstore reads.
    assert Storage.for_url(f"{s3_bucket}/run")._make_ranged is not None
    keys = {"key": "k", "secret": "s"}
    env = {"AWS_REGION": "eu-west-1"}
    assert fast_ranges.available("s3", {**keys, "config_kwargs": {"read_timeout": 5}}, env)
    assert fast_ranges.available("s3", {**keys, "endpoint_url": "http://h:1"}, {})
    # Anything only botocore knows how to follow: s3fs reads.
    assert not fast_ranges.available("s3", keys, {})  # no region, no endpoint
    assert not fast_ranges.available("s3", {**keys, "session": object()}, env)
    assert not fast_ranges.available("s3", {**keys, "profile": "p"}, env)
    assert not fast_ranges.available("s3", {**keys, "client_kwargs": {"verify": False}}, env)
    assert not fast_ranges.available("s3", {**keys, "config_kwargs": {"retries": {}}}, env)
    assert not fast_ranges.available("s3", {}, {"AWS_PROFILE": "p", **env})  # ~/.aws, SSO
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_PROFILE", "rankwise-profile")
    assert Storage.for_url(f"{s3_bucket}/run")._make_ranged is None


def test_prefetch_threads_make_one_ranged_client(s3_bucket: str):
    import copy
    import threading

    pytest.importorskip("obstore")
    store = Storage.for_url(f"{s3_bucket}/run")
    gate, got = threading.Barrier(8), []

    def first_read() -> None:
        gate.wait()
        got.append(store._ranged_store())

    threads = [threading.Thread(target=first_read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got[0] is not None and len({id(c) for c in got}) == 1
    child = store.child("sub")  # a copy: a lock of its own, never the same one
    assert child._ranged_lock is not store._ranged_lock
    assert copy.copy(store)._ranged_store() is got[0]
