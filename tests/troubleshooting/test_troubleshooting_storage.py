"""docs/troubleshooting.md's rows for checkpoints in object storage, each provoked against the
real S3 server (SeaweedFS, conftest's ``s3_server``) in this process. The pairing of rows and
triggers is checked by tests/troubleshooting/test_troubleshooting.py."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from helpers.troubleshooting_table import check_row, raised
from rankwise.testing import free_port
from rankwise.testing.s3server import S3_KEY, S3_SECRET
from rankwise.train.checkpoint import (
    RemoteCheckpointManager,
    RetryPolicy,
    Storage,
    read_checkpoint,
)
from rankwise.train.checkpoint.backends import verify_object
from rankwise.train.checkpoint.writer import CheckpointWriter

pytestmark = pytest.mark.timeout(60)
_BUCKET: list[str] = []  # the test's bucket (s3://NAME), for the triggers


def _missing_s3fs() -> BaseException:
    saved = sys.modules.get("s3fs")
    sys.modules["s3fs"] = None  # type: ignore[assignment]  # import s3fs now fails
    try:
        return raised(Storage.for_url, "s3://bucket/run")
    finally:
        if saved is not None:
            sys.modules["s3fs"] = saved


def _check(url: str, options: dict[str, Any] | None = None) -> BaseException:
    return raised(Storage.for_url(url, options).check_writable)


def _retry_warning() -> BaseException:
    dead = f"http://127.0.0.1:{free_port()}"
    store = Storage.for_url(
        f"{_BUCKET[0]}/run", {"endpoint_url": dead}, retry=RetryPolicy(attempts=2, first_delay=0)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        raised(store.put, b"x", "ckpt-e000000-s000000001.pt")
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = caught[0].message
    assert isinstance(message, Warning)
    return message


def _no_manifest() -> BaseException:
    store = Storage.for_url(f"{_BUCKET[0]}/torn")
    store.put(b"data, no manifest", "ckpt-e000000-s000000001.pt")
    return raised(verify_object, store, "ckpt-e000000-s000000001.pt")


class _FailingManager:
    """A bucket manager whose background upload failed (the store gone past the retries)."""

    sharded = False

    def __init__(self) -> None:
        dead = f"http://127.0.0.1:{free_port()}"
        store = Storage.for_url(
            f"{_BUCKET[0]}/run", {"endpoint_url": dead}, retry=RetryPolicy(attempts=1)
        )
        self.inner = RemoteCheckpointManager(store)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _writer_lost_upload(final: bool) -> BaseException:
    manager = _FailingManager()
    writer = CheckpointWriter(
        manager,  # type: ignore[arg-type]
        writes=True,
        background=True,
        shared=True,
        saved=lambda path: None,
    )
    state = _State()
    writer.save(state)  # its upload fails in the background
    if final:
        return raised(writer.finish)
    manager.inner.pending().exception()  # wait for it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state.step = 2
        writer.save(state)
    manager.inner.pending().exception()
    said = [w.message for w in caught if "was not saved" in str(w.message)]
    assert len(said) == 1 and isinstance(said[0], Warning), [str(w.message) for w in caught]
    return said[0]


class _State:
    epoch, step = 0, 1

    def state_dict(self, *, sharded: bool = False) -> dict[str, Any]:
        return {"step": self.step}


TRIGGERS: dict[str, Callable[[], BaseException]] = {
    "storage-missing-backend": _missing_s3fs,
    "storage-malformed-url": lambda: raised(Storage.for_url, "s3:/bucket/run"),
    "storage-url-without-colon": lambda: raised(Storage.for_url, "s3//bucket/run"),
    "storage-no-bucket": lambda: raised(Storage.for_url, "s3://"),
    "storage-missing-bucket": lambda: _check(f"{_BUCKET[0]}-missing/run"),
    "storage-refused": lambda: _check(
        f"{_BUCKET[0]}/run", {"key": S3_KEY, "secret": "wrong-" + S3_SECRET}
    ),
    "storage-unreachable": lambda: _check(
        f"{_BUCKET[0]}/run", {"endpoint_url": f"http://127.0.0.1:{free_port()}"}
    ),
    "storage-retrying": _retry_warning,
    "checkpoint-remote-no-manifest": _no_manifest,
    "checkpoint-upload-lost": lambda: _writer_lost_upload(final=False),
    "checkpoint-last-not-durable": lambda: _writer_lost_upload(final=True),
    "checkpoint-url-no-file": lambda: raised(read_checkpoint, f"{_BUCKET[0]}/"),
}


@pytest.mark.parametrize("row_id", sorted(TRIGGERS))
def test_documented_message_is_the_one_raised(row_id: str, s3_bucket: str) -> None:
    _BUCKET[:] = [s3_bucket]
    check_row(row_id, TRIGGERS[row_id])
