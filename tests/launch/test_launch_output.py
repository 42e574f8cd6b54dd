"""What ``rankwise launch`` and its ranks say (issue 33): a Ctrl-C ends the job with the
launcher's one line and exit 130, not one traceback per rank; the launch header says the
threads each process runs with, instead of torch's banner; a checkpoint store that fails its
check prints its error once, from the writer, not once per rank. Real launches, both ways a job
runs (torchrun's agent, and the continue-mode supervisor)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.background import await_file
from helpers.paths import EXAMPLES, SCRIPTS
from rankwise.distributed.environment import threads_per_process
from rankwise.distributed.interrupt import owned_by, quiet_interrupts
from rankwise.testing import child_env

pytestmark = pytest.mark.timeout(300)

CONTINUE_WORKER = SCRIPTS / "continue_worker.py"
# The launcher's one line for a Ctrl-C, per --on-failure.
CTRL_C_LINE = {
    "restart": "rankwise launch: SIGINT received: torchrun forwarded it to every rank",
    "continue": "rankwise launch: SIGINT received: forwarding SIGTERM to this node's",
}


def await_steps(out: Path, slot: int, steps: int, proc: subprocess.Popen[str]) -> None:
    """Return once ``slot`` has trained ``steps`` micro-batches (continue_worker's log)."""
    log = out / f"steps-{slot}"
    await_file(log, proc)
    deadline = time.monotonic() + 120
    while len(log.read_text().splitlines()) < steps:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"slot {slot} trained no {steps} steps in 120 s"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize(("on_failure", "omp"), [("restart", None), ("continue", "3")])
def test_ctrl_c_ends_the_ranks_quietly_and_the_launcher_says_one_line(
    tmp_path: Path, on_failure: str, omp: str | None
) -> None:
    # Also the threads: without OMP_NUM_THREADS (tests' child_env sets 1) the launcher shares
    # the cores out and says so, with no torch banner; a user's value is kept.
    env = child_env()
    env.pop("OMP_NUM_THREADS")
    env.update({"OMP_NUM_THREADS": omp} if omp else {})
    cmd = [sys.executable, "-m", "rankwise.cli", "launch", "--nproc-per-node", "2"]
    cmd += ["--on-failure", on_failure, str(CONTINUE_WORKER), str(tmp_path)]
    cmd += ["--step-delay", "0.1", "--epochs", "50"]  # training when the Ctrl-C comes
    proc = subprocess.Popen(
        cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        for slot in (0, 1):
            await_steps(tmp_path, slot, 2, proc)
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole process group
        out, err = proc.communicate(timeout=90)
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever of the job is left
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    said = out + err
    assert proc.returncode == 130, said[-3000:]
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said[-3000:]
    assert said.count(CTRL_C_LINE[on_failure]) == 1, said[-3000:]
    assert "closing signal" not in said and "death signal" not in said, said[-3000:]
    threads = omp or threads_per_process(2, {})[0]
    why = "yours" if omp else "this machine's cores shared out"
    header = f"rankwise launch: 2 process(es) on this node, OMP_NUM_THREADS={threads} each ({why}"
    assert said.count(header) == 1, said[-3000:]
    assert "Setting OMP_NUM_THREADS" not in said, said[-3000:]


def test_an_uncaught_interrupt_prints_nothing_other_errors_print_as_ever(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The hook a launched rank runs (rankwise.distributed installs it where RANKWISE_LAUNCHED
    # is 1): installed once, on top of the one that was there.
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    quiet_interrupts()
    quiet_interrupts()
    follower = owned_by(ValueError("mine"), 0, 1, "rank 0's checkpoint write failed")
    own = owned_by(ValueError("mine"), 1, 1, "rank 1's checkpoint write failed")
    for error, printed in (
        (KeyboardInterrupt(), False), (ValueError("mine"), True), (follower, False), (own, True)
    ):  # fmt: skip
        try:
            raise error
        except BaseException as exc:
            sys.excepthook(type(exc), exc, exc.__traceback__)
        err = capsys.readouterr().err
        assert ("Traceback" in err and "mine" in err) is printed, (error, err)
        if error is follower:  # one line, naming the rank that prints it in full
            assert err == (
                "rankwise: rank 1 stops: rank 0's checkpoint write failed (ValueError); rank 0 "
                "prints the error in full, with its traceback and the fix.\n"
            )
    assert sys.excepthook.__closure__ is not None
    assert sys.__excepthook__ in [c.cell_contents for c in sys.excepthook.__closure__]


@pytest.mark.slow
@pytest.mark.parametrize("failing", ["every rank", "rank 1 alone"])
def test_a_failing_checkpoint_store_is_reported_once_by_the_rank_it_failed_on(
    s3_bucket: str, tmp_path: Path, failing: str
) -> None:
    # "every rank": a bucket that does not exist (the server creates none on its own): every
    # rank checks the store before the first step and fails; rank 0, the writer, prints the
    # StorageError with its traceback and fix, rank 1 one line pointing there. "rank 1 alone":
    # rank 1 has the wrong secret (a node set up apart): rank 1 prints its own error in full,
    # and rank 0 ends with one line pointing there, never the other way round.
    url, script = f"{s3_bucket}-missing", EXAMPLES / "quickstart_trainer.py"
    if failing == "rank 1 alone":
        url, script = f"{s3_bucket}/run", tmp_path / "wrong_secret_on_rank1.py"
        script.write_text(
            "import os, runpy, sys\n"
            "if os.environ['LOCAL_RANK'] == '1':\n"
            "    os.environ['AWS_SECRET_ACCESS_KEY'] = 'not-the-secret'\n"
            f"sys.argv[0] = {str(EXAMPLES / 'quickstart_trainer.py')!r}\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n"
        )
    owner, other = ("0", "1") if failing == "every rank" else ("1", "0")
    cmd = [sys.executable, "-m", "rankwise.cli", "launch", "--nproc-per-node", "2"]
    cmd += [str(script), "--out", url, "--epochs", "1"]
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=240)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1, said[-3000:]
    assert said.count("Traceback (most recent call last)") == 1, said[-6000:]
    error = f"[rank{owner}]: rankwise.storage.errors.StorageError: "
    assert said.count("StorageError: ") == 1 and said.count(error) == 1, said[-6000:]
    assert f"{url}/checkpoints/" in said and "Fix: " in said
    followers = [line for line in said.splitlines() if line.startswith(f"[rank{other}]:")]
    if failing == "every rank":
        assert "Fix: the bucket does not exist" in said
        assert followers == [
            "[rank1]: rankwise: rank 1 stops: the checkpoint store failed its check here, as on "
            "rank 0 (StorageError, missing-bucket); rank 0 prints the error in full, with its "
            "traceback and the fix."
        ], said[-6000:]
    else:
        assert followers == [
            "[rank0]: rankwise: rank 0 stops: rank 1's check of the checkpoint store failed "
            "(StorageError, failed-on-another-rank); rank 1 prints the error in full, with its "
            "traceback and the fix."
        ], said[-6000:]
    summary = "rankwise launch: 2 rank(s) failed; exit code 1. Their errors are above"
    assert said.count(summary) == 1, said[-3000:]
