"""The one failure classifier (rankwise.distributed.failures) on the errors torch really raises
and on a rank's own errors that merely mention a timeout or a socket."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import rankwise.distributed as rd

# Texts gloo raised in torch 2.13 (a 2-rank group, one peer killed / one frozen past 3 s),
# from a plain all_reduce and from DDP's gradient all-reduce alike.
GLOO_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [127.0.0.1]:9137. This is typically caused by a remote worker crashing."
)
GLOO_TIMEOUT = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
    "waiting 3000ms for recv operation to complete"
)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (RuntimeError(GLOO_CLOSED), "peer-lost"),
        (RuntimeError(GLOO_TIMEOUT), "timeout"),
        (dist.DistNetworkError("failed to connect to the store at 127.0.0.1:29500"), "peer-lost"),
        (dist.DistStoreError("wait timeout after 30000ms, keys: /x"), "timeout"),
        # A rank's own errors: its data, its storage, its model. Never a lost peer.
        (RuntimeError("DataLoader worker (pid 7) timed out after 5 seconds"), None),
        (TimeoutError("read of s3://bucket/ckpt timed out"), None),
        (TimeoutError("timed out"), None),
        (ConnectionResetError("connection reset by peer"), None),
        (RuntimeError("could not open socket to the metrics server: connection refused"), None),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 2x2)"), None),
        (ValueError("[gloo] looks like gloo but is a ValueError"), None),
    ],
)
def test_classify(exc: BaseException, expected: str | None) -> None:
    assert rd.classify(exc) == expected
    assert rd.is_peer_failure(exc) is (expected is not None)
    assert rd.is_timeout(exc) is (expected == "timeout")
