"""Checkpoint files in object storage, through the manager ``fit`` uses, against a real S3
server (SeaweedFS, from conftest's ``s3_server``): multipart uploads whose manifest is a local
one, stale multipart uploads aborted, each failure named with its URL and fix but never the
secret (retries across a server lost and back, and giving up after them:
``test_checkpoint_bucket_fit.py``, whose fits meet them). The manager's rules on every backend
(a folder, ``memory://`` and S3: torn, corrupt and unfinished checkpoints never trusted,
pruning manifest first after the pointer) are ``test_checkpoint_catalogue.py``'s."""

from __future__ import annotations

import json
import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import s3fs
import torch

from rankwise.storage import is_remote_url
from rankwise.testing import free_port
from rankwise.testing.s3server import S3_KEY, S3_SECRET
from rankwise.train import checkpoint as files
from rankwise.train.checkpoint import (
    RemoteCheckpointManager,
    RetryPolicy,
    Storage,
    StorageError,
)
from rankwise.train.checkpoint.backends import verify_object
from rankwise.train.checkpoint.catalogue import Catalogue

pytestmark = pytest.mark.timeout(60)

MiB = 1 << 20
FAST = RetryPolicy(attempts=1)


def _manager(root: str, **kw: Any) -> Any:
    """The manager ``fit`` builds for ``root`` (a folder, or a store's URL)."""
    if is_remote_url(root):
        return RemoteCheckpointManager(Storage.for_url(root), **kw)
    return files.CheckpointManager(root, **kw)


def _state(step: int, words: int = 4) -> dict[str, Any]:
    return {"step": step, "epoch": 0, "w": torch.arange(words, dtype=torch.float32)}


def _fs() -> s3fs.S3FileSystem:
    """A plain s3fs client on the test's AWS_* variables (for what rankwise does not do)."""
    return s3fs.S3FileSystem(skip_instance_cache=True)


def test_a_multipart_checkpoint_verifies_with_a_local_manifest(s3_bucket: str, tmp_path: Path):
    store = Storage.for_url(f"{s3_bucket}/run", part_size=5 * MiB)
    manager = RemoteCheckpointManager(store, keep_last=None)
    manager.start()
    assert store.is_remote and manager.latest() is None
    manager.save(_state(1), epoch=0, step=1)
    big = _state(2, words=3 * MiB)  # 12 MiB of tensor: 3 parts of 5 MiB, a multipart upload
    saved = manager.save(big, epoch=0, step=2)

    name = "ckpt-e000000-s000000002.pt"
    assert saved == manager.latest() == f"{s3_bucket}/run/{name}"
    manifest = verify_object(store, name)
    assert manifest["size"] == store.size(name) > 12 * MiB
    assert manifest["meta"] == {"epoch": 0, "step": 2}
    assert json.loads(store.read("ckpt-latest.json")) == {"file": name, "epoch": 0, "step": 2}
    assert torch.equal(manager.read(saved)["w"], big["w"])
    # The manifest is a local one: the local verifier accepts the object and its manifest.
    local = files.save_file({"x": 1}, tmp_path / "local" / "ckpt.pt")
    local_manifest = json.loads(files.manifest_path(local).read_text())
    assert sorted(manifest) == sorted(local_manifest)
    got = store.download(name, tmp_path / name)
    (tmp_path / f"{name}.sha256.json").write_bytes(store.read(f"{name}.sha256.json"))
    assert files.verify_file(got)["xxh3_128"] == manifest["xxh3_128"]


def test_stale_multipart_uploads_are_aborted(s3_bucket: str):
    fs, bucket = _fs(), s3_bucket[5:]
    left = fs.call_s3(
        "create_multipart_upload", Bucket=bucket, Key="run/ckpt-e000000-s000000009.pt"
    )
    part = {"Bucket": bucket, "Key": "run/ckpt-e000000-s000000009.pt", "UploadId": left["UploadId"]}
    fs.call_s3("upload_part", PartNumber=1, Body=b"x" * (5 * MiB), **part)
    elsewhere = fs.call_s3(
        "create_multipart_upload", Bucket=bucket, Key="other/ckpt-e000000-s000000001.pt"
    )
    store = Storage.for_url(f"{s3_bucket}/run")
    assert Catalogue(store).names() == []  # an unfinished upload is never an object

    assert store.abort_uploads(older_than=3600) == []  # too young: may be in flight
    assert RemoteCheckpointManager(store).start() == ["ckpt-e000000-s000000009.pt"]
    remaining = fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", [])
    assert [(u["Key"], u["UploadId"]) for u in remaining] == [
        ("other/ckpt-e000000-s000000001.pt", elsewhere["UploadId"])
    ]
    assert RemoteCheckpointManager(Storage.for_url("memory://rankwise-test/run")).start() == []


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("s3:/bucket/run", "write s3://bucket/run"),
        ("s3://", "names no bucket: write s3://BUCKET/PATH"),
        ("s3:///run", "write s3://run"),
    ],
)
def test_a_malformed_url_is_named_with_the_fix(url: str, said: str):
    with pytest.raises(StorageError, match=r"malformed|names no bucket") as e:
        Storage.for_url(url)
    assert e.value.reason == "bad-url" and repr(url) in str(e.value) and said in str(e.value)


STORES = ["s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oci", "hf"]


@pytest.mark.parametrize("scheme", STORES)
@pytest.mark.parametrize("slip", ["{p}//bucket/run", "{p}/bucket/run", "{p}///bucket/run"])
def test_a_store_url_without_its_colon_is_refused_naming_the_url_meant(scheme: str, slip: str):
    # s3//bucket/run silently wrote ./s3/bucket/run: every object store, every way of
    # leaving the colon out, in either case, is refused with the URL it probably means.
    for written in (slip.format(p=scheme), slip.format(p=scheme.upper())):
        with pytest.raises(StorageError) as e:
            is_remote_url(written)
        assert e.value.reason == "bad-url"
        assert f"Write {scheme}://bucket/run for the bucket, or ./{written} for a local" in str(
            e.value
        )


@pytest.mark.parametrize(
    "path", ["./s3/bucket/run", "s3-runs/a", "s3x/a", "runs/s3/a", "s3", "gsutil/a", "/s3/a"]
)
def test_a_local_path_that_only_looks_like_a_store_is_a_local_path(path: str):
    assert is_remote_url(path) is False


def test_fit_refuses_a_colonless_store_url_before_writing_anything(tmp_path, monkeypatch):
    import torch

    from rankwise.train import DistributedTrainer, DistributedTrainingConfig

    monkeypatch.chdir(tmp_path)
    model = torch.nn.Linear(4, 2)
    trainer = DistributedTrainer(
        model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1)
    )
    cfg = DistributedTrainingConfig(epochs=1, batch_size=4, verbose=False)
    cfg.checkpoint_dir = "s3//bucket/run"
    with pytest.raises(StorageError, match=r"Write s3://bucket/run for the bucket"):
        trainer.fit(torch.randn(8, 4), torch.randint(0, 2, (8,)), cfg)
    assert trainer.state.step == 0 and list(tmp_path.iterdir()) == []


def test_missing_s3fs_names_the_extra(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "s3fs", None)  # import s3fs now raises ImportError
    with pytest.raises(StorageError) as e:
        Storage.for_url("s3://bucket/run", {"secret": "x-" + S3_SECRET})
    assert e.value.reason == "missing-backend"
    assert 'pip install "rankwise[s3]"' in str(e.value) and "s3://bucket/run" in str(e.value)


def _failures(bucket: str, wrong_secret: str) -> dict[str, StorageError]:
    """Each failure a user can meet at start, from check_writable."""
    out = {}
    cases = {
        "missing-bucket": (f"{bucket}-missing/run", {}),
        "refused": (f"{bucket}/run", {"key": S3_KEY, "secret": wrong_secret}),
        "unreachable": (f"{bucket}/run", {"endpoint_url": f"http://127.0.0.1:{free_port()}"}),
    }
    for reason, (url, options) in cases.items():
        store = Storage.for_url(url, options)
        started = time.monotonic()
        with pytest.raises(StorageError) as e:
            store.check_writable()
        assert time.monotonic() - started < 4, f"{reason} took too long to fail"
        assert e.value.reason == reason, str(e.value)
        assert url in str(e.value)
        out[reason] = e.value
    return out


def test_each_failure_at_start_names_the_url_and_the_fix(s3_bucket: str):
    failures = _failures(s3_bucket, "wrong-" + S3_SECRET)
    assert "the bucket does not exist: create it" in str(failures["missing-bucket"])
    assert "AWS_SECRET_ACCESS_KEY" in str(failures["refused"])
    assert "signature" in str(failures["refused"])
    assert "check the endpoint (AWS_ENDPOINT_URL" in str(failures["unreachable"])


def test_a_secret_never_appears_in_errors_warnings_or_logs(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    secret = "Sup3rSecretValue-rankwise-canary"
    caplog.set_level(logging.DEBUG)  # botocore, s3fs and aiobotocore log at DEBUG
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        messages += [str(e) + repr(e) for e in _failures(s3_bucket, secret).values()]
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)  # refused, from the environment
        store = Storage.for_url(f"{s3_bucket}/run")
        with pytest.raises(StorageError, match="refused") as e:
            store.check_writable()
        messages.append(str(e.value) + repr(store))
        dead = Storage.for_url(
            f"{s3_bucket}/run",
            {"key": S3_KEY, "secret": secret, "endpoint_url": f"http://127.0.0.1:{free_port()}"},
            retry=RetryPolicy(attempts=2, first_delay=0.01),
        )
        with pytest.raises(StorageError) as e:
            dead.put(b"x", "ckpt-e000000-s000000001.pt")
        messages.append(str(e.value) + repr(dead))
        monkeypatch.setitem(sys.modules, "s3fs", None)
        with pytest.raises(StorageError) as e:
            Storage.for_url(f"s3://k:{secret}@bucket/run", {"secret": secret})
        messages.append(str(e.value))
    messages += [str(w.message) for w in caught]
    assert any("retrying" in m for m in messages)  # the retry warning was seen
    assert all(secret not in m for m in messages), [m for m in messages if secret in m]
    assert secret not in caplog.text
