"""Experiment trackers for real: W&B in offline mode (its run files read back) and MLflow against
a real local tracking server (``mlflow_server``), through ``DistributedTrainer.fit``.

- Two ranks under ``--max-restarts 1``, rank 1 SIGKILLed in step 8 with checkpoints every 3
  steps: ONE W&B run and ONE MLflow run (not one per rank), the restarted job logs into the
  same runs (their ids are in the checkpoint), and steps 7 and 8, trained again after the
  resume from step 6, are not logged a second time.
- Two ranks under ``--on-failure continue``, rank 0 SIGKILLed in step 5: the survivor becomes
  rank 0, learns the run ids from the state every rank holds, and goes on in the same runs.
- A tracker never stops training: an MLflow or W&B server that does not answer (a free port, a
  misspelt host, a port that takes the connection and stays silent) costs seconds, not the
  libraries' minutes of retries, and one warning naming the URL; an MLflow run that stops
  taking metrics mid-run gives one warning; the fit finishes and the CSV holds every step.
- A missing package fails before the first step, naming the extra.

One launch per scenario (each is tens of seconds of start-up on 2 busy cores).
"""

from __future__ import annotations

import csv
import json
import signal
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from helpers.background import await_file, started
from helpers.paths import SCRIPTS
from helpers.wandb_offline import offline_runs
from rankwise.testing import free_port, process_alive, run_script
from rankwise.testing.mlflowserver import MlflowServer
from rankwise.train import DistributedTrainer, DistributedTrainingConfig
from rankwise.train.checkpoint import CheckpointManager
from rankwise.train.tracking import PROBE_SECONDS, TrackerWarning

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

WORKER = SCRIPTS / "tracker_worker.py"
STEPS = 12  # 192 samples / (2 ranks x 8): one epoch


def tracker_env(tmp_path: Path, server: MlflowServer | None, experiment: str) -> dict[str, str]:
    """The variables a user sets for each tracker: W&B offline into tmp_path (nothing reaches
    the network or the home folder), MLflow to the test server and an experiment of its own."""
    wandb = tmp_path / "wandb-home"
    env = {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_CONFIG_DIR": str(wandb / "config"),
        "WANDB_CACHE_DIR": str(wandb / "cache"),
        "WANDB_DATA_DIR": str(wandb / "data"),
        "WANDB_PROJECT": "rankwise-tests",
        "WANDB_SILENT": "true",
        "MLFLOW_EXPERIMENT_NAME": experiment,
    }
    if server is not None:
        env["MLFLOW_TRACKING_URI"] = server.uri
    return env


def csv_steps(log_dir: Path) -> list[int]:
    with open(log_dir / "metrics.csv", newline="") as f:
        return [int(row["global_step"]) for row in csv.DictReader(f) if row["kind"] == "step"]


def mlflow_run(server: MlflowServer, experiment: str) -> tuple[object, list[int]]:
    """The experiment's one run, and its steps of ``step/loss`` in the order they were logged."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=server.uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    runs = client.search_runs([found.experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]  # one run, not one per rank
    history = client.get_metric_history(runs[0].info.run_id, "step/loss")
    return runs[0], [m.step for m in sorted(history, key=lambda m: (m.timestamp, m.step))]


def mlflow_artifacts(server: MlflowServer, run_id: str) -> list[str]:
    from mlflow import MlflowClient

    return [a.path for a in MlflowClient(tracking_uri=server.uri).list_artifacts(run_id)]


def launch(out: Path, env: dict[str, str], *args: str, launch_args: tuple[str, ...] = ()):
    result = run_script(
        WORKER,
        2,
        script_args=[str(out / "out"), "--epochs", "1", *args],
        launch_args=list(launch_args),
        timeout=500,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads((out / "out" / "run-ids.json").read_text())


def test_a_job_restarted_after_a_kill_logs_one_run_per_tracker(mlflow_server, tmp_path):
    env = tracker_env(tmp_path, mlflow_server, "restart")
    ids = launch(
        tmp_path,
        env,
        *("--every", "3", "--kill-slot", "1", "--kill-step", "8"),
        launch_args=("--max-restarts", "1"),
    )
    assert set(ids) == {"wandb", "mlflow"}
    # The checkpoint holds the ids: what the restarted job went on with.
    _, saved = CheckpointManager(tmp_path / "out" / "ckpt").load_latest()
    assert saved["trainer"]["trackers"] == ids

    # W&B: each attempt's rank 0 wrote an offline part of the same run. The restarted job
    # trained steps 7 and 8 again and did not log them again: its part starts at 9. (The
    # first part holds what W&B's service flushed before the launcher stopped rank 0: its
    # first steps, all 8 when the machine is idle, none at all, not even the run's id, when
    # it is loaded: the offline file is buffered.)
    parts = offline_runs(tmp_path)
    assert len(parts) == 2
    assert parts[-1].run_id == ids["wandb"] and parts[0].run_id in ("", ids["wandb"])
    first, again = ([row["trainer/global_step"] for row in p.history] for p in parts)
    assert again == list(range(9, STEPS + 1))
    assert first == list(range(1, len(first) + 1)) and len(first) <= 8
    # The config goes with every part (the first may have kept nothing of its own).
    for part in parts if parts[0].run_id else parts[1:]:
        assert part.config["batch_size"] == 8 and part.config["world_size"] == 2
        assert part.config["logger_options"] == {}
    assert {"history.json", "history.png"} <= set(parts[-1].artifacts)
    assert any(name.endswith(".sha256.json") for name in parts[-1].artifacts)  # the manifest

    run, steps = mlflow_run(mlflow_server, "restart")
    assert run.info.run_id == ids["mlflow"] and run.info.status == "FINISHED"
    assert steps == list(range(1, STEPS + 1))
    assert run.data.params["batch_size"] == "8" and run.data.params["world_size"] == "2"
    assert run.data.metrics["epoch/epoch"] == 1.0
    artifacts = mlflow_artifacts(mlflow_server, ids["mlflow"])
    assert {"history.json", "history.png"} <= set(artifacts)
    assert any(name.endswith(".sha256.json") for name in artifacts)

    # The CSV keeps every row it was given: the redone steps appear twice there.
    assert csv_steps(tmp_path / "out" / "logs") == [*range(1, 9), 7, 8, *range(9, STEPS + 1)]


def test_a_new_rank_0_after_a_lost_rank_goes_on_with_the_same_runs(mlflow_server, tmp_path):
    env = tracker_env(tmp_path, mlflow_server, "continue")
    ids = launch(
        tmp_path,
        env,
        *("--kill-slot", "0", "--kill-step", "5"),
        launch_args=("--on-failure", "continue"),
    )
    # Step 5 was finished by the survivor while no process was rank 0: nobody logged it (as
    # in the CSV, tests/train/test_train_continue.py); every other step once, in order.
    expected = [s for s in range(1, STEPS + 1) if s != 5]
    run, steps = mlflow_run(mlflow_server, "continue")
    assert run.info.run_id == ids["mlflow"] and run.info.status == "FINISHED"
    assert steps == expected
    assert csv_steps(tmp_path / "out" / "logs") == expected

    # W&B: the new rank 0 wrote its offline part under the same run id. (The SIGKILLed rank
    # 0's part holds only what W&B had flushed, each second: test_a_sigkilled_offline_...)
    parts = offline_runs(tmp_path)
    assert len(parts) == 2
    assert all(part.folder.name.endswith(f"-{ids['wandb']}") for part in parts)
    assert {part.run_id for part in parts if part.run_id} == {ids["wandb"]}
    assert parts[-1].run_id == ids["wandb"]
    steps = [row["trainer/global_step"] for part in parts for row in part.history]
    assert steps == sorted(set(steps)) and steps[-1] == STEPS  # monotonic, to the end
    assert parts[-1].history[0]["trainer/global_step"] == 6


def test_a_sigterm_to_the_job_ends_both_runs_as_failed(mlflow_server, tmp_path):
    # A scheduler stops the job (SIGTERM to the launcher, which passes it on to the ranks)
    # while rank 1 is away in step 4: rank 0 waits in step 5's all-reduce, where a Python
    # signal handler never runs. Its guard's helper thread ends both runs as failed (not
    # "running" for good), then the process ends as SIGTERM ends it.
    env = tracker_env(tmp_path, mlflow_server, "sigterm")
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "rankwise.cli", "launch", "--nproc-per-node=2", str(WORKER),
        str(out), "--epochs", "1", "--hold-slot", "1", "--hold-step", "4",
    ]  # fmt: skip
    with started(cmd, env) as launcher:
        await_file(out / "holding", launcher, seconds=240)
        time.sleep(1.0)  # rank 0 is in step 5's all-reduce by now
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=60)  # the ranks' runs closed well within it
    assert launcher.returncode != 0
    run, steps = mlflow_run(mlflow_server, "sigterm")
    assert run.info.status == "FAILED", err[-3000:]
    # Steps 1-4 (on a loaded machine rank 0 may still be at step 4's row when the signal
    # comes: that call ends first, then the run is closed; never a step past the hold).
    assert steps in ([1, 2, 3], [1, 2, 3, 4])
    [part] = offline_runs(tmp_path)
    assert part.exit_code == 1, err[-3000:]
    assert [row["trainer/global_step"] for row in part.history] == steps
    assert not process_alive(int((out / "pid-0").read_text()))


# -- a tracker never stops training (a world of one in this process) --------------------------


def tiny_fit(tmp_path: Path, loggers: list[str], callbacks=()) -> DistributedTrainer:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = DistributedTrainer(
        model, torch.nn.CrossEntropyLoss(), optimizer, callbacks=list(callbacks)
    )
    cfg = DistributedTrainingConfig(
        epochs=2,
        batch_size=8,
        verbose=False,
        checkpoint_dir=None,
        log_dir=str(tmp_path / "logs"),
        log_every_n_batches=1,
        loggers=loggers,
    )
    trainer.fit(torch.randn(32, 4), torch.randint(0, 3, (32,)), cfg)
    return trainer


def tracker_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, TrackerWarning)]


@pytest.fixture
def silent_server():
    """A TCP port that takes connections (the kernel's backlog) and never answers a byte: a
    store that hangs."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


@pytest.fixture
def fresh_wandb():
    """W&B's process-wide settings read again from the environment the test sets (and
    dropped after it): ``wandb.setup()`` reads them once per process."""
    import wandb

    wandb.teardown()
    yield
    wandb.teardown()


@pytest.mark.parametrize("tracker", ["mlflow", "wandb"])
@pytest.mark.parametrize("where", ["free-port", "typo-host", "silent"])
def test_a_tracker_server_that_does_not_answer_holds_training_for_seconds_not_minutes(
    tracker, where, silent_server, fresh_wandb, tmp_path, monkeypatch
):
    # MLflow's own defaults (7 retries, 120 s timeouts) and W&B's (init_timeout 90 s) held
    # the first step for minutes before one warning; the probe says which URL is silent.
    for name, value in tracker_env(tmp_path, None, "silent").items():
        monkeypatch.setenv(name, value)
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    url = {
        "free-port": f"http://127.0.0.1:{free_port()}",
        "typo-host": "http://mlfow-server.invalid:5000",
        "silent": silent_server,
    }[where]
    if tracker == "mlflow":
        monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    else:
        monkeypatch.setenv("WANDB_MODE", "online")
        monkeypatch.setenv("WANDB_BASE_URL", url)
        monkeypatch.setenv("WANDB_API_KEY", "0" * 40)  # never sent: the probe comes first
    started = time.monotonic()
    tiny_fit(tmp_path / "plain", ["csv"])
    plain = time.monotonic() - started
    started = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = tiny_fit(tmp_path, ["csv", tracker])
    took = time.monotonic() - started
    [message] = tracker_warnings(caught)
    assert f"{url} does not answer" in message and "training goes on without" in message
    assert took < plain + PROBE_SECONDS + 20, (took, plain)  # minutes before
    assert trainer.history.epochs == 2 and trainer.state.trackers == {}
    assert csv_steps(tmp_path / "logs") == list(range(1, 9))


KILLED_PART = """
import os, signal, sys, time
from rankwise.train.tracking import WANDB_FLUSH_SECONDS, WandbTracker
tracker = WandbTracker()
tracker.start({"lr": 0.1}, None)
for step in range(1, 21):  # rows well under W&B's 32 KiB buffer, which a full one writes
    tracker.log_metrics(step, {"step/loss": 1.0 / step})
time.sleep(4 * WANDB_FLUSH_SECONDS + 1)  # W&B's own flush: every 15 s
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_sigkilled_offline_wandb_part_keeps_what_it_logged_a_few_seconds_before(tmp_path):
    # A part killed by SIGKILL 97 steps in kept a 7-byte file (the header): W&B wrote its
    # buffer every 15 s (or when 32 KiB filled it). Now every WANDB_FLUSH_SECONDS: what was logged before that is kept.
    # (A real process killed for real; W&B's own file read back.)
    env = {**tracker_env(tmp_path, None, "unused"), "PYTHONPATH": ":".join(sys.path)}
    import os
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", KILLED_PART], env={**os.environ, **env}, timeout=300
    )
    assert done.returncode == -signal.SIGKILL
    [part] = offline_runs(tmp_path)
    assert part.run_id and part.config["lr"] == 0.1
    # All but the last step's row, which W&B holds open for more of that step's metrics (the
    # epoch's row joins it) until a later step is logged.
    assert [row["trainer/global_step"] for row in part.history] == list(range(1, 20))
    assert part.exit_code is None  # no end: the process was killed


class DeleteRunAfterFirstEpoch:
    """Deletes the MLflow run under the trainer's feet (as an admin might): from then on the
    server refuses the run's metrics."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def on_epoch_end(self, trainer: DistributedTrainer, epoch: int, metrics: object) -> None:
        from mlflow import MlflowClient

        if epoch == 0:
            MlflowClient(tracking_uri=self.uri).delete_run(trainer.state.trackers["mlflow"])


def test_a_tracker_failing_mid_run_warns_once_and_the_csv_keeps_every_metric(
    mlflow_server, tmp_path, monkeypatch
):
    for name, value in tracker_env(tmp_path, mlflow_server, "mid-run").items():
        monkeypatch.setenv(name, value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = tiny_fit(
            tmp_path, ["csv", "mlflow"], [DeleteRunAfterFirstEpoch(mlflow_server.uri)]
        )
    [message] = tracker_warnings(caught)
    assert "MLflow tracker (mlflow) failed to log metrics" in message
    assert trainer.history.epochs == 2
    assert csv_steps(tmp_path / "logs") == list(range(1, 9))


@pytest.mark.parametrize("package", ["wandb", "mlflow"])
def test_a_missing_package_fails_before_the_first_step_naming_the_extra(
    package, tmp_path, monkeypatch
):
    # The package made unimportable, as on a machine without it (import gives ImportError).
    monkeypatch.setitem(sys.modules, package, None)
    steps: list[int] = []

    class Steps:
        def on_batch(self, trainer: DistributedTrainer, epoch: int, step: int, ids: object):
            steps.append(step)

    with pytest.raises(ImportError) as info:
        tiny_fit(tmp_path, ["csv", package], [Steps()])
    assert f"pip install 'rankwise[{package}]'" in str(info.value)
    assert f"loggers lists {package!r}" in str(info.value)
    assert steps == [] and not (tmp_path / "logs").exists()
