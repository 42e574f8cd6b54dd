"""``DistributedTrainer.fit`` inside Ray Train's ``TorchTrainer``, on a real local Ray cluster.

The example's trainer (examples/ray_train.py: digits, 2 workers, 2 epochs, step checkpoints,
an ``AuditLog``, ``RayReport``) runs on Ray, and its rank 1 dies mid-epoch (``os._exit``):
Ray's ``FailureConfig`` restarts the group, which resumes from rankwise's checkpoint. The run
must train each sample exactly once, end with the weights (bit for bit) and last loss of the
same config on 2 spawned gloo ranks, and hand Ray one report per epoch, none twice, whose
pointer names that epoch's rankwise checkpoint. (Rank 1 dies a few of Ray's polls after epoch
0's report: a report Ray has not collected yet dies with its worker, a limit of Ray's that
docs/ray.md names.)

Ray starts once for the module (about 10 s; its one ``TorchTrainer.fit`` adds about 25-40 s of
worker start-up on 2 cores) and is shut down at its end, with a check that none of its
processes outlives it. It starts as examples/ray_train.py starts it, with
``quiet_ray_workers`` as the workers' setup hook, and the run's logs (every worker's output,
the driver's console) hold none of Ray Train's "Failed to query Ray Train Controller" warnings
(without the hook, about one a second of training: issue 33).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import ray_runs
from helpers.paths import EXAMPLES, REPO
from rankwise.testing import assert_exactly_once, run_distributed
from rankwise.train import rankwise_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")
psutil = pytest.importorskip("psutil")

EPOCHS = 2
SAMPLES = 1500  # the example trains on digits[:1500]
# Ray Train's settings for this cluster (the driver's values reach the controller), restored
# at the end: the controller collects reports (and notices that a run ended) every 0.5 s, not
# 2 s; and no preemption watcher, an actor of its own (a process of ~5 s CPU here) that asks a
# cloud's metadata service about spot instances, which a local cluster has none of.
POLL_S = 0.5
RAY_SETTINGS = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": str(POLL_S),
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}
# What Ray Train's placement-group cleaner logs each second without Ray's State API, unless
# quiet_ray_workers quiets it (docs/ray.md).
CONTROLLER_NOISE = "Failed to query Ray Train Controller"
QUIET = "rankwise.train.ray_report.quiet_ray_workers"


def _ray_processes(folder: str) -> list[Any]:
    """Processes of the Ray cluster whose session lives under ``folder`` (their command lines
    name it): GCS, raylet, workers, agents."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(folder in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _logged(folder: Path, text: str) -> list[str]:
    """The lines of the Ray session's logs under ``folder`` (each worker's and actor's output,
    which Ray also forwards to the driver's console) that hold ``text``."""
    found = []
    for log in sorted(folder.glob("session_*/logs/**/*")):
        if log.is_file() and not log.is_symlink():
            lines = log.read_text(errors="replace").splitlines()
            found += [f"{log.name}: {line}" for line in lines if text in line]
    return found


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Path]:
    """A local Ray cluster of 2 CPUs for this module, started as examples/ray_train.py starts
    it (its workers quieted by ``quiet_ray_workers``); yields the session's folder; its
    processes gone at the end."""
    # Short: Ray's unix sockets live under it (a socket path has at most 107 characters).
    folder = tempfile.mkdtemp(prefix="rw-ray-", dir="/tmp")
    env = pytest.MonkeyPatch()  # undone when the cluster stops
    for name, value in RAY_SETTINGS.items():
        env.setenv(name, value)
    paths = [str(REPO / "tests"), str(EXAMPLES), str(REPO / "src")]
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=folder,
        runtime_env={
            "env_vars": {"PYTHONPATH": ":".join(paths), "OMP_NUM_THREADS": "1"},
            "worker_process_setup_hook": QUIET,
        },
    )
    try:
        yield Path(folder)
    finally:
        ray.shutdown()
        env.undo()
        deadline = time.monotonic() + 20
        while (left := _ray_processes(folder)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for proc in left:  # ours (they name our folder): do not leave them to the machine
            proc.kill()
        shutil.rmtree(folder, ignore_errors=True)
        assert not left, f"Ray processes outlived ray.shutdown(): {[p.pid for p in left]}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The example's config on 2 spawned gloo ranks, without Ray."""
    out = tmp_path_factory.mktemp("spawned")
    ranks = run_distributed(ray_runs.spawn_run, 2, args=(str(out), EPOCHS), timeout=300)
    assert_exactly_once(out / "audit", attempts=1, num_samples=SAMPLES, epochs=EPOCHS)
    return ranks[0]


def _same_weights(path: str, reference: dict[str, Any]) -> None:
    weights = torch.load(path, weights_only=True)["model"]
    assert weights.keys() == reference["weights"].keys()
    for name, tensor in reference["weights"].items():
        assert torch.equal(weights[name], tensor), name


def _reported_epochs(result: Any) -> list[int]:
    """The epochs of the reports Ray kept a checkpoint of, in order."""
    return sorted(metrics["epoch"] for _, metrics in result.best_checkpoints)


def test_fit_under_ray_restarts_from_the_rankwise_checkpoint_like_spawned_ranks(
    ray_cluster, reference, tmp_path
):
    # One TorchTrainer.fit (25-40 s of worker start-up each on 2 cores) shows both what a run
    # hands Ray and that Ray's restart resumes from rankwise's checkpoint: rank 1 dies in
    # epoch 1, after Ray collected epoch 0's report.
    per_epoch = reference["steps"] // EPOCHS  # 24: 1500 samples, 2 workers of batch 32
    crash_step = per_epoch + 15  # in epoch 1; checkpoints every 10 steps and at epoch ends
    result = ray_runs.example().run(
        tmp_path,
        workers=2,
        max_failures=1,
        train_loop=ray_runs.train_crashing_once,
        epochs=EPOCHS,
        crash_step=crash_step,
        crash_after_s=6 * POLL_S,  # Ray has collected epoch 0's report by then
    )
    assert (tmp_path / "crashed").exists()  # rank 1 did die, and Ray restarted the group
    assert result.error is None
    starts = assert_exactly_once(tmp_path / "audit", 2, SAMPLES, EPOCHS)
    # Resumed inside epoch 1 (from the epoch's end at the least): epoch 0 was not trained again.
    assert starts[0] == 0 and per_epoch <= starts[1] < crash_step, starts
    # One report per epoch (epoch 0 before the crash, epoch 1 after it), each with a pointer
    # to that epoch's (durable) checkpoint.
    assert _reported_epochs(result) == [0, 1]
    for checkpoint, metrics in result.best_checkpoints:
        path = rankwise_checkpoint(checkpoint)
        assert path == metrics["rankwise_checkpoint"] and Path(path).is_absolute()
        assert Path(path).parent == tmp_path / "checkpoints" and Path(path).exists()
    last = result.metrics
    assert last["epoch"] == EPOCHS - 1 and last["step"] == reference["steps"]
    assert last["train_loss"] == reference["loss"]  # the same run, to the last bit
    assert set(last) >= {"train_accuracy", "epoch_seconds", "rankwise_checkpoint"}
    assert "val_loss" not in last  # no validation data: a None metric is left out
    _same_weights(rankwise_checkpoint(result.checkpoint), reference)
    # The run's tens of seconds said nothing of the controller: without the hook, 135 lines in
    # the session's logs (24 on the driver's console, where Ray folds repeated lines).
    assert _logged(ray_cluster, CONTROLLER_NOISE) == []
    assert list(ray_cluster.glob("session_*/logs/worker-*.err")), "no worker logs to read"
