"""The real S3 server's own count of a bucket's traffic (``S3Server.traffic``, from SeaweedFS's
metrics) against rankwise's storage counters: the count benchmarks/streaming_peers.py trusts
for readers that do not go through rankwise's ``Storage``."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rankwise.storage import Storage
from rankwise.testing.s3server import S3Server, Traffic

pytestmark = pytest.mark.timeout(120)

SIZE = 200_000
# Up to 12 ranges anywhere in the object, each up to 20 KB; max_gap 0 or 4 KB (merging).
ranges = st.lists(
    st.integers(0, SIZE - 1).flatmap(
        lambda a: st.integers(a + 1, min(SIZE, a + 20_000)).map(lambda b: (a, b))
    ),
    min_size=1,
    max_size=12,
)


@pytest.mark.parametrize("fork_safe", [True, False], ids=["s3fs", "obstore"])
@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(wanted=ranges, max_gap=st.sampled_from([0, 4096]))
def test_the_server_counts_the_gets_and_bytes_storage_counts(
    s3_server: S3Server,
    s3_bucket: str,
    fork_safe: bool,
    wanted: list[tuple[int, int]],
    max_gap: int,
):
    if not fork_safe:
        pytest.importorskip("obstore")
    store = Storage.for_url(f"{s3_bucket}/traffic")
    if not store.exists("x.bin"):
        store.put(os.urandom(SIZE), "x.bin")
    before, asked, got = s3_server.traffic(s3_bucket), store.requests, store.bytes_read
    data = store.read_ranges("x.bin", wanted, max_gap=max_gap, fork_safe=fork_safe)
    served = s3_server.traffic(s3_bucket) - before
    assert [len(d) for d in data] == [b - a for a, b in wanted]
    assert served == Traffic(
        reads=store.requests - asked,  # ranged reads make no HEAD
        gets=store.requests - asked,
        bytes_sent=store.bytes_read - got,
    )
    assert served.gets > 0


def test_traffic_counts_heads_and_whole_gets_per_bucket(s3_server: S3Server, s3_bucket: str):
    store = Storage.for_url(f"{s3_bucket}/whole")
    store.put(b"x" * 1000, "a.bin")
    before, other = s3_server.traffic(s3_bucket), s3_server.traffic("some-other-bucket")
    assert store.size("a.bin") == 1000  # a HEAD: a read of the GET class, no bytes
    assert store.read("a.bin") == b"x" * 1000
    served = s3_server.traffic(s3_bucket.removeprefix("s3://")) - before
    assert served.gets == 1 and served.bytes_sent == 1000 and served.reads > served.gets
    assert s3_server.traffic("some-other-bucket") == other


@pytest.mark.parametrize("bad", ["s3://bucket/key", "gs://bucket", "Bucket_1", "", "ab"])
def test_traffic_names_a_bad_bucket_and_the_fix(s3_server: S3Server, bad: str):
    with pytest.raises(ValueError, match=r"give a bucket, as 'name' or 's3://name'") as caught:
        s3_server.traffic(bad)
    assert repr(bad) in str(caught.value)
