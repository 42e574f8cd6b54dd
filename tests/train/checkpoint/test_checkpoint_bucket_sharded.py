"""Checkpoints in object storage beyond one writer, against a real S3 server (SeaweedFS):
FSDP2's sharded (DCP) folders in a bucket, each rank uploading its shards (a rank's failed
upload fails the save on every rank); a run saved by 2 ranks mid-epoch and resumed from the
bucket on 1 rank, the global batch kept, every sample trained exactly once (ddp and fsdp);
per-rank folders (``save_on_master_only=False``), each rank resuming from its own; a real kill
mid-upload. The one-process rules of sharded folders run on every backend in
``test_checkpoint_sharded.py``."""

from __future__ import annotations

import contextlib
import json
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import rankwise.distributed as rd
from helpers.trainer_stops import Stop, fit_starts, stop_in_step
from helpers.training import ADAM, classification, make_trainer, mlp
from rankwise.distributed.config import MemberConfig
from rankwise.testing import RankFailedError, assert_exactly_once, run_distributed
from rankwise.testing.s3server import S3_KEY, S3_SECRET, S3Server
from rankwise.train import AuditLog, DistributedTrainer, DistributedTrainingConfig
from rankwise.train import checkpoint as ck
from rankwise.train.checkpoint import (
    RemoteCheckpointManager,
    Storage,
    StorageError,
    load_resume,
    manager_for,
)
from rankwise.train.checkpoint.sharded import MANIFEST, REST

pytestmark = pytest.mark.timeout(120)
N, EPOCHS = 96, 2  # samples, epochs: a global batch of 16 makes 6 optimizer steps an epoch


def _cfg(url: str | None, **kw: Any) -> DistributedTrainingConfig:
    base: dict[str, Any] = dict(
        epochs=EPOCHS,
        batch_size=8,
        verbose=False,
        checkpoint_dir=url,
        checkpoint_every_n_steps=4,
        checkpoint_every_n_epochs=0,
        keep_last_checkpoints=2,
    )
    return DistributedTrainingConfig(**{**base, **kw})


def _fit(url: str | None, audit: Path | None = None, stop_at: int | None = None, **kw: Any) -> Any:
    callbacks = [] if audit is None else [AuditLog(audit)]
    trainer = make_trainer(mlp(16, 32, 4, activation=nn.ReLU), ADAM, callbacks=callbacks)
    started = fit_starts(trainer)
    stop_in_step(trainer, stop_at)
    with contextlib.suppress(Stop):
        trainer.fit(*classification(N, 16, 4, seed=7), _cfg(url, **kw))
    trainer.started_at = started[0]  # type: ignore[attr-defined]
    return trainer


def _params(trainer: DistributedTrainer) -> dict[str, torch.Tensor]:
    return ck.model_state_dict(trainer.model, all_ranks=True)  # gathered from FSDP2's shards


# -- 2 ranks: mid-epoch saves (ddp, fsdp), per-rank folders, a rank's failed upload ----------


def _two_ranks(bucket: str, audit: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for strategy in ("ddp", "fsdp"):  # stopped in step 9: the newest checkpoint is step 8
        _fit(f"{bucket}/{strategy}", Path(audit, strategy), stop_at=9, strategy=strategy)
    store = Storage.for_url(f"{bucket}/fsdp")  # as the 2 ranks left it
    out["fsdp"] = {
        "checkpoints": RemoteCheckpointManager(store, sharded=True).checkpoints(),
        "pointer": json.loads(store.read("ckpt-latest.json")),
        "files": store.child("ckpt-e000001-s000000008.dcp").names(),
        "manifest": json.loads(store.child("ckpt-e000001-s000000008.dcp").read(MANIFEST)),
    }
    out["per_rank"] = _per_rank(f"{bucket}/per-rank")
    out["failed_upload"] = _failed_upload(f"{bucket}/failing")
    return out


def _per_rank(url: str) -> dict[str, Any]:
    loaded: list[str | None] = []
    original = RemoteCheckpointManager.load_latest

    def spy(self: RemoteCheckpointManager) -> Any:
        found = original(self)
        loaded.append(None if found is None else found[0])
        return found

    _fit(url, save_on_master_only=False, epochs=1)  # saves at steps 4 and 6 (the end)
    own = Storage.for_url(f"{url}/rank-{rd.get_rank()}").names()
    RemoteCheckpointManager.load_latest = spy  # type: ignore[method-assign]  # this process
    try:
        resumed = _fit(url, save_on_master_only=False, resume="auto")
    finally:
        RemoteCheckpointManager.load_latest = original  # type: ignore[method-assign]
    return {"own": own, "loaded": loaded, "started_at": resumed.started_at}


def _failed_upload(url: str) -> dict[str, Any]:
    """Rank 1's shard upload fails past the retries: no rank vouches for the folder."""
    trainer = _fit(None, strategy="fsdp", epochs=1)
    manager = RemoteCheckpointManager(Storage.for_url(url), sharded=True)
    state = trainer.state.state_dict(sharded=True)
    manager.save(state, epoch=1, step=6)
    real = Storage.put
    if rd.get_rank() == 1:

        def put(self: Storage, source: Any, key: str, **kw: Any) -> int:
            if key.endswith(".distcp"):
                raise StorageError(f"upload to {self.url_of(key)} failed: gone", url="", reason="x")
            return real(self, source, key, **kw)

        Storage.put = put  # type: ignore[method-assign]  # this process only
    try:
        manager.save(state, epoch=1, step=7)
        said = "saved"
    except StorageError as e:
        said = str(e)
    finally:
        Storage.put = real  # type: ignore[method-assign]
    rd.barrier()
    # a resume from the bucket on the same 2 ranks (rank 0 picks, both download and load)
    saved = _params(trainer)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.zero_()
    found = load_resume("auto", manager, per_rank=False)
    assert found is not None
    trainer.state.load_state_dict(found[1], found[0])
    equal = all(torch.equal(v, saved[k]) for k, v in _params(trainer).items())
    return {"said": said, "latest": manager.latest(), "resumed": (found[0], equal)}


@pytest.fixture(scope="module")
def saved_by_two(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One launch of 2 ranks for the tests below (seconds of start-up each): the bucket it
    wrote, its audit folder and each rank's results."""
    import s3fs

    tmp = tmp_path_factory.mktemp("two")
    with pytest.MonkeyPatch.context() as env:
        _reach(env, s3_server)
        bucket = "s3://rankwise-two-ranks"
        s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket[5:])
        results = run_distributed(_two_ranks, 2, args=(bucket, str(tmp)), timeout=240)
    return bucket, tmp, results


def _reach(env: pytest.MonkeyPatch, server: S3Server) -> None:
    env.setenv("AWS_ENDPOINT_URL", server.endpoint)
    env.setenv("AWS_ACCESS_KEY_ID", S3_KEY)
    env.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    env.setenv("AWS_REGION", "us-east-1")


@pytest.mark.slow  # 2 processes
@pytest.mark.timeout(300)
def test_fsdp_saves_each_rank_s_shards_to_the_bucket(saved_by_two: Any, s3_bucket: str) -> None:
    _, _, results = saved_by_two
    saved = results[0]["fsdp"]
    newest = "ckpt-e000001-s000000008.dcp"  # saves at steps 4 and 8 (keep_last=2)
    assert saved["checkpoints"] == ["ckpt-e000000-s000000004.dcp", newest]
    assert saved["pointer"] == {"file": newest, "epoch": 1, "step": 8}
    files = saved["files"]  # each rank's shards, rank 0's index, rest and manifest
    assert files == sorted([".metadata", "__0_0.distcp", "__1_0.distcp", REST, MANIFEST])
    assert sorted(saved["manifest"]["files"]) == sorted(set(files) - {MANIFEST})
    assert saved["manifest"]["meta"] == {"epoch": 1, "step": 8, "world_size": 2}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_run_saved_by_two_ranks_resumes_from_the_bucket_on_one(
    saved_by_two: Any, s3_bucket: str, strategy: str
) -> None:
    bucket, audit, _ = saved_by_two
    url = f"{bucket}/{strategy}"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="strategy='fsdp' in a world of one")
        # A world of one, the same global batch: 1 x 16 == 2 x 8.
        resumed = _fit(url, audit / strategy, strategy=strategy, batch_size=16, resume="auto")
    assert resumed.started_at == 8  # mid-epoch 1, from the bucket's step-8 checkpoint
    assert assert_exactly_once(audit / strategy, 2, N, EPOCHS) == [0, 8]
    single = _params(_fit(None, batch_size=16))  # the uninterrupted run on one rank
    for name, value in _params(resumed).items():
        assert float((value - single[name]).abs().max()) < 1e-4, name
    latest = RemoteCheckpointManager(Storage.for_url(url)).latest()
    suffix = ".dcp" if strategy == "fsdp" else ".pt"
    assert latest == f"{url}/ckpt-e000002-s000000012{suffix}"  # it went on saving there


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_per_rank_folders_in_the_bucket_are_each_rank_s_own(
    saved_by_two: Any, s3_bucket: str
) -> None:
    bucket, _, results = saved_by_two
    for rank, result in enumerate(results):
        own = result["per_rank"]
        checkpoints = [n for n in own["own"] if not n.endswith(".json")]
        assert checkpoints == ["ckpt-e000000-s000000004.pt", "ckpt-e000001-s000000006.pt"]
        assert "ckpt-latest.json" in own["own"]
        # resume='auto': from the rank's own folder, and only there
        assert own["loaded"] == [f"{bucket}/per-rank/rank-{rank}/ckpt-e000001-s000000006.pt"]
        assert own["started_at"] == 6
    assert Storage.for_url(f"{bucket}/per-rank").names() == []  # nothing shared above them


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_rank_s_failed_upload_fails_the_save_on_every_rank(
    saved_by_two: Any, s3_bucket: str
) -> None:
    bucket, _, results = saved_by_two
    folder = f"{bucket}/failing/ckpt-e000001-s000000007.dcp"
    said = [r["failed_upload"]["said"] for r in results]
    assert said[0].startswith(f"rank 1 could not write its part of {folder}: upload to ")
    assert said[1].startswith(f"upload to {folder}/__1_0.distcp failed")
    previous = f"{bucket}/failing/ckpt-e000001-s000000006.dcp"
    for result in results:  # the folder has no manifest: the previous save is the latest
        assert result["failed_upload"]["latest"] == previous
        assert result["failed_upload"]["resumed"] == (previous, True)  # and what resumes
    store = Storage.for_url(folder)
    assert MANIFEST not in store.names() and "__0_0.distcp" in store.names()


@pytest.mark.slow  # a process of its own, killed
def test_a_kill_mid_shard_upload_leaves_the_previous_folder_and_is_cleaned(
    s3_bucket: str,
) -> None:
    """A real SIGKILL after the first part of a shard's 3-part upload: the folder gets no
    manifest, the previous folder is the latest, the next manager's start aborts the upload."""
    url = f"{s3_bucket}/mpu"
    with pytest.raises(RankFailedError, match=r"without a result"):
        run_distributed(_save_twice_killed_mid_shard, 1, args=(url,), timeout=60)
    store = Storage.for_url(url)
    manager = RemoteCheckpointManager(store, sharded=True)
    assert MANIFEST not in store.child("ckpt-e000000-s000000002.dcp").names()
    assert manager.latest() == f"{url}/ckpt-e000000-s000000001.dcp"
    assert manager.start() == ["ckpt-e000000-s000000002.dcp/__0_0.distcp"]
    assert store.abort_uploads() == []


def _save_twice_killed_mid_shard(url: str) -> None:
    from rankwise.testing import kill_at_checkpoint

    manager = RemoteCheckpointManager(Storage.for_url(url, part_size=5 << 20), sharded=True)
    plain = {"optimizer": {"state": {}, "param_groups": []}, "world_size": 1}
    manager.save({**plain, "model": {"w": torch.zeros(4)}}, epoch=0, step=1)
    kill_at_checkpoint("mid-upload", after=1)  # .metadata goes up, the shard is cut
    manager.save({**plain, "model": {"w": torch.zeros(3 << 20)}}, epoch=0, step=2)  # 12 MiB


def test_per_rank_bucket_folders_follow_the_slot_under_continue(s3_bucket: str) -> None:
    cfg = MemberConfig(slot=2, world_size=3, host="h", port=1, local_world_size=0)
    # A restarted slot 2 runs its set-up as rank 0 of a world of one: its folder is rank-2/.
    roles = rd.Roles(types.SimpleNamespace(cfg=cfg, pending=True))  # type: ignore[arg-type]
    config = DistributedTrainingConfig(checkpoint_dir=f"{s3_bucket}/run", save_on_master_only=False)
    manager = manager_for(config, roles)
    assert isinstance(manager, RemoteCheckpointManager)
    assert manager.directory == f"{s3_bucket}/run/rank-2"
