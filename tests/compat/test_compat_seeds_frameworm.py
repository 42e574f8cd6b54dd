"""The FRAMEWORM guide's examples (examples/seeds/frameworm/) run against rankwise.

Each port is the guide's code with its imports changed (plus what a port must add, marked
"port:"), run as the guide runs it: one-process examples in this process from the examples
folder (they read ``config.yaml`` there), the ``mp.spawn`` scripts as ``python script.py``
(``train_distributed.py`` as two "machines" with the guide's variables: one launch that shows
what a one-machine run would, and more), and the metric all-reduce under ``rankwise launch``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import signal
import subprocess
import sys
import tempfile
import time
from typing import IO

import pytest
import torch

from helpers.paths import EXAMPLES
from helpers.seed_ports import NUM
from rankwise.compat import frameworm as fw
from rankwise.models import MLP, VAE
from rankwise.testing import child_env, free_port, run_script
from rankwise.train import ConfigKeyError, ConfigTree, DistributedTrainer

FW = EXAMPLES / "seeds" / "frameworm"
TRAINED = re.compile(
    r"rank (\d)/(\d) local (\d) trained (\w+); loss ([\d.]+) -> ([\d.]+), val ([\d.]+), "
    rf"checksum ({NUM})"
)


def run_plain(name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a one-process example from its folder, as ``python name`` would; its stdout."""
    monkeypatch.chdir(FW)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), torch.random.fork_rng():
        runpy.run_path(str(FW / name), run_name="__main__")
    return out.getvalue()


IN_USE = re.compile(r"EADDRINUSE|address already in use", re.IGNORECASE)


def run_machines(name: str, extras: list[dict[str, str]], timeout: float = 280) -> list[str]:
    """``python name`` once per "machine" (each spawns its own processes) on one fresh port;
    their stdouts.

    The port was free when picked but is handed over only later, so another process on a shared
    machine can take it first: a run that fails with "address already in use" is retried on a
    new port (three tries). A machine that fails stops the others at once (their ranks would
    otherwise wait for the missing peers until the timeout).
    """
    for _ in range(3):
        port = str(free_port())
        # faulthandler: should a rank die on a signal (SIGABRT at exit: docs/distributed.md,
        # "Clean exits"), stderr holds every thread's Python stack.
        envs = [
            child_env({"MASTER_PORT": port, "PYTHONFAULTHANDLER": "1", **extra}) for extra in extras
        ]
        procs = start_all(name, envs, timeout)
        failed = [p for p in procs if p.returncode != 0]
        if not any(IN_USE.search(p.stderr) for p in failed):
            break
    assert not failed, failed[0].stderr[-3000:]
    return [p.stdout for p in procs]


def start_all(
    name: str, envs: list[dict[str, str]], timeout: float
) -> list[subprocess.CompletedProcess[str]]:
    """Run one process per env to the end, or until one fails (then kill the rest)."""
    procs: list[subprocess.Popen[bytes]] = []
    deadline = time.monotonic() + timeout
    with contextlib.ExitStack() as stack:
        # Files, not pipes: a machine blocked on a full pipe would hang its peers.
        files = [
            (
                stack.enter_context(tempfile.TemporaryFile()),
                stack.enter_context(tempfile.TemporaryFile()),
            )
            for _ in envs
        ]
        try:
            for env, (out, err) in zip(envs, files, strict=True):
                procs.append(
                    subprocess.Popen(
                        [sys.executable, name], env=env, cwd=FW, stdout=out, stderr=err,
                        start_new_session=True,
                    )
                )  # fmt: skip
            while any(p.poll() is None for p in procs) and not any(p.poll() for p in procs):
                assert time.monotonic() < deadline, f"{name} ran past {timeout} s"
                time.sleep(0.2)
        finally:
            for p in procs:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        return [
            subprocess.CompletedProcess([name], p.returncode, read(out), read(err))
            for p, (out, err) in zip(procs, files, strict=True)
        ]


def read(f: IO[bytes]) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")


def run_spawn(name: str, extra: dict[str, str] | None = None) -> str:
    """``python name`` from the examples folder (it spawns its own processes); its stdout."""
    return run_machines(name, [extra or {}])[0]


# ------------------------------------------------------------------------------ the names


def test_names_are_rankwise_objects() -> None:
    assert fw.Config is ConfigTree
    assert issubclass(fw.Trainer, DistributedTrainer)
    config = fw.Config({"model": {"input_dim": 6, "latent_dim": 2, "output_dim": 3}})
    assert isinstance(fw.get_model("vae")(config), VAE)
    assert isinstance(fw.get_model("mlp")(config), MLP)


def test_unknown_model_and_missing_key_name_the_fix() -> None:
    with pytest.raises(
        ValueError, match=r"unknown model 'gan'; the known models are \['mlp', 'vae'\]"
    ):
        fw.get_model("gan")
    with pytest.raises(ConfigKeyError, match=r"config\.model\.latent_dim is not set"):
        fw.get_model("vae")(fw.Config({"model": {"input_dim": 4}}))


def test_trainer_refuses_a_bad_setting_at_construction() -> None:
    net = VAE(4, 2)
    with pytest.raises(ValueError, match="precision"):
        fw.Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), precision="fp64")


def test_autocast_and_grad_scaler_on_the_cpu_are_bf16_and_pass_through() -> None:
    # torch.cuda.amp's would silently do nothing here (float32, scaler disabled).
    with fw.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    scaler = fw.GradScaler()
    loss = torch.tensor(3.0)
    assert not scaler.is_enabled() and scaler.scale(loss) is loss


# -------------------------------------------------------------------------------- examples


@pytest.mark.timeout(200)
def test_data_parallel_example_trains_the_vae(monkeypatch: pytest.MonkeyPatch) -> None:
    out = run_plain("data_parallel.py", monkeypatch)
    # The guide wraps in DataParallel only with 2+ GPUs, and the trainer uses that wrapper.
    wrapper = "DataParallel" if torch.cuda.device_count() > 1 else "VAE"
    assert f"model {wrapper} around VAE" in out
    for split in ("train", "val"):
        first, last = map(float, re.search(rf"{split} loss ([\d.]+) -> ([\d.]+)", out).groups())  # type: ignore[union-attr]
        assert last < 0.8 * first, (split, first, last)
    assert out.rstrip().endswith("epochs 50")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_spawn_script_on_two_machines_with_the_guides_variables() -> None:
    # One launch for the guide's two launch forms: each "machine" is `python
    # train_distributed.py`, mp.spawn's 2 processes, as on one machine (what a one-machine run
    # shows, DDP used as passed, the loss falling, identical parameters, holds for each), and
    # with the guide's variables the two meet in one world of 4.
    env = {"MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "4"}
    outs = run_machines("train_distributed.py", [{**env, "RANK": "0"}, {**env, "RANK": "2"}])
    rows = [TRAINED.findall(out) for out in outs]
    assert sorted((r[0], r[2]) for r in rows[0]) == [("0", "0"), ("1", "1")]
    assert sorted((r[0], r[2]) for r in rows[1]) == [("2", "0"), ("3", "1")]
    assert {r[1] for rs in rows for r in rs} == {"4"}  # one world of 4 across both machines
    assert {r[3] for rs in rows for r in rs} == {"DistributedDataParallel"}  # not rewrapped
    assert len({r[7] for rs in rows for r in rs}) == 1  # identical parameters on every rank
    assert all(float(r[5]) < float(r[4]) for rs in rows for r in rs)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_powersgd_autocast_gradscaler_loop() -> None:
    out = run_spawn("optimized.py")
    rows = re.findall(
        r"rank (\d): output dtype (\S+), scaler enabled (\w+), powersgd iter (\d+) "
        rf"compressed-numel (\d+), loss {NUM} -> {NUM}, checksum ({NUM})",
        out,
    )
    assert sorted(r[0] for r in rows) == ["0", "1"]
    for _, dtype, enabled, iters, numel, _ in rows:
        assert (dtype, enabled, iters) == ("torch.bfloat16", "False", "50")
        assert int(numel) > 0  # PowerSGD compressed (past start_powerSGD_iter=2)
    assert rows[0][5] == rows[1][5]  # ranks in sync through the compressed all-reduce


@pytest.mark.timeout(120)
def test_accumulation_example_matches_one_big_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    out = run_plain("accumulation.py", monkeypatch)
    diff = float(re.search(r"max difference (\S+)", out).group(1))  # type: ignore[union-attr]
    assert diff < 1e-5
    assert out.rstrip().endswith("8 micro-batches, 2 optimizer steps")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_monitoring_example_averages_the_ranks_losses() -> None:
    proc = run_script(FW / "monitoring.py", 2, timeout=240, env=child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [float(v) for _, v in sorted(re.findall(rf"rank (\d) loss ({NUM})", proc.stdout))]
    assert len(losses) == 2 and losses[0] != losses[1]
    average = float(re.search(rf"Average loss across all GPUs: ({NUM})", proc.stdout).group(1))  # type: ignore[union-attr]
    assert average == pytest.approx(sum(losses) / 2, abs=1e-4)


@pytest.mark.timeout(120)
def test_troubleshooting_gradient_checkpointing(monkeypatch: pytest.MonkeyPatch) -> None:
    out = run_plain("troubleshooting.py", monkeypatch)
    assert "checkpointed blocks ['encoder', 'decoder']" in out
    assert out.rstrip().endswith("same parameters True")
