"""``--on-failure continue`` through its own failure paths (issue 23, findings 4-7, 9, 10),
end to end on tests/scripts/continue_worker.py (3 gloo ranks unless said, 2 epochs of 8 steps,
global batch 24): every scenario ends, exactly once, well within its bound, never by waiting
out the 30-minute collective timeout. The collective timeout is lowered to 120 s so that the
behaviour before the fixes (a wait in a gloo set-up) fails the test instead of hanging it,
and no scenario here waits for it: a run that takes that long failed (a loaded CI machine
stretches a 25 s run to 65 s, so the bound is not tighter). A generation's group may take
10 s to form (RANKWISE_SETUP_TIMEOUT_S, 30 by default): a joiner killed inside its set-up
costs that (tests/distributed/test_distributed_membership.py holds the property)."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from helpers.background import await_file, started
from helpers.disks import fill, tmpfs
from helpers.paths import SCRIPTS
from rankwise.testing import assert_exactly_once, process_alive, run_script
from rankwise.train import read_audit

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WORKER = SCRIPTS / "continue_worker.py"
NUM_SAMPLES, EPOCHS = 192, 2
BOUNDED = {"DISTRIBUTED_COLLECTIVE_TIMEOUT_MS": "120000", "RANKWISE_SETUP_TIMEOUT_S": "10"}
# What a rank that only learned of the writer's failed checkpoint write ends with (issue 33).
FOLLOWER = "rankwise: rank 1 stops: rank 0's checkpoint write failed (CheckpointWriteError); "


def launch(out: Path, *args: str, restarts: int = 1, nproc: int = 3):
    started = time.monotonic()
    result = run_script(
        WORKER,
        nproc,
        script_args=[str(out), *args],
        launch_args=["--on-failure", "continue", "--max-restarts", str(restarts)],
        timeout=240,
        env=BOUNDED,
    )
    return result, time.monotonic() - started


def test_a_ranks_own_timeout_error_fails_it_and_its_restart_is_not_the_master(tmp_path):
    # Slot 2's dataset raises "DataLoader worker ... timed out" in step 3: its own error, not
    # a lost peer. It exits non-zero, the others go on, the launcher restarts it, and the
    # restarted process runs its set-up as a joiner (is_master() False) before it rejoins.
    result, _ = launch(tmp_path, "--own-error", "2:3", "--await-joiner-step", "5")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "RuntimeError: DataLoader worker (pid 4242) timed out" in result.stderr
    assert "slot 2 exited with" in result.stderr and "restarting it (1/1)" in result.stderr
    assert "continuing on 2 rank(s) (was 3) from optimizer step 2" in result.stdout
    assert "slot(s) [2] rejoined; continuing on 3 rank(s) (was 2) from optimizer step 5" in (
        result.stdout
    )
    setups = {p.name: p.read_text().split() for p in tmp_path.glob("setup-*")}
    assert setups == {
        "setup-0-0": ["True", "False"],  # is_master, is_joining
        "setup-1-0": ["False", "False"],
        "setup-2-0": ["False", "False"],
        "setup-2-1": ["False", "True"],  # the restart: rank 0 of its world of one, not master
    }
    assert assert_exactly_once(tmp_path / "audit", 3, NUM_SAMPLES, EPOCHS) == [0, 2, 5]


def test_generation_0_forms_without_a_crashed_rank_and_a_lost_joiner_is_not_waited_for(
    tmp_path,
):
    # Slot 2 raises before rankwise.distributed starts: slots 0 and 1 form generation 0 once
    # the launcher marks it dead, on the launched global batch (2 x 12). Its first restart
    # asks to join in step 3 and is SIGKILLed 0.5 s later: let in or not by then, the members
    # never wait for it in a gloo set-up (before: the 120 s collective timeout here, 30 min
    # by default, then every rank died). Its second restart is let in after step 6 and
    # SIGKILLed as it enters the group's set-up (where nobody watches its heartbeat): the
    # members wait the set-up timeout (10 s here), not the collective's, and recover without
    # it. Its third restart joins after step 9 (3 x 8).
    result, seconds = launch(
        tmp_path, "--crash-before-init", "2", "--joiner-dies-waiting",
        "--joiner-dies-in-setup", "2", "--await-joiner-step", "3,6,9", restarts=3,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "slot 2 failed in its set-up" in result.stderr
    # Usually the second restart is the peer lost in step 6 and the third rejoins after step 9;
    # on a loaded machine the first restart may be let in within its 0.5 s (then it is the lost
    # peer, earlier) and the third may rejoin at step 6: the rejoin's step is read, not assumed.
    assert ("a peer was lost: slot 2 (rank 2) ended with signal SIGKILL; continuing on 2 rank(s) "
            "(was 3) from optimizer step ") in result.stdout  # fmt: skip
    died = float((tmp_path / "joiner-died-2").read_text())
    after = min(float(line.split()[2]) for line in (tmp_path / "steps-0").read_text().splitlines()
                if float(line.split()[2]) > died)  # fmt: skip
    assert after - died < 40, after - died  # the set-up's 10 s (+ a regroup), not the 120 s
    rejoined = re.findall(r"slot\(s\) \[2\] rejoined; continuing on 3 rank\(s\) \(was 2\) "
                          r"from optimizer step (\d+), global batch 24 = 3 x 8", result.stdout)  # fmt: skip
    assert rejoined, result.stdout[-3000:]
    assert len((tmp_path / "pids-2").read_text().split()) == 4
    assert (tmp_path / "final-world").read_text().strip() == "3"
    report = read_audit(tmp_path / "audit")
    starts = assert_exactly_once(tmp_path / "audit", len(report.attempts), NUM_SAMPLES, EPOCHS)
    # [0, (3,) 6, 9] as a rule: the last start is where the last restart was let in
    assert starts[0] == 0 and starts[-1] == int(rejoined[-1]), (starts, rejoined)
    assert seconds < 110, seconds  # short of the collective timeout


def test_a_write_that_fails_later_stops_every_rank_once(tmp_path):
    # Every write from step 4 on fails with ENOSPC. Both ranks stop at the next save with the
    # file and the OS error: no rank takes it for a lost peer (no regroup, no next rank 0 that
    # fails the same way), and the restarted processes give up at once instead of joining.
    result, _ = launch(
        tmp_path, "--checkpoint-every", "2", "--disk-full-at", "4", restarts=1, nproc=2
    )
    assert result.returncode != 0
    failed = re.findall(r"CheckpointWriteError: writing the checkpoint \S+ckpt-e\d+-s0+(\d+)\.pt "
                        r"failed: \[Errno 28\] No space left on device", result.stderr)  # fmt: skip
    # once, from the writer (rank 0); rank 1 stops on it too, in one line (issue 33)
    assert len(failed) == 1, result.stderr[-4000:]
    assert result.stderr.count(FOLLOWER) == 1, result.stderr[-4000:]
    assert "continuing on" not in result.stdout
    assert result.stderr.count("will not join: the running ranks stopped the job") == 2


def test_a_real_full_disk_stops_every_rank_once(tmp_path):
    # issue 30: the checkpoint folder is a real tmpfs with 8 kB left (the start's probe
    # passes; no checkpoint fits). torch reports the full disk as a RuntimeError ("unexpected
    # pos", raised while the OSError is handled); before, only OSError was caught: rank 0 died,
    # the survivor took it for a lost peer, and each new rank 0 failed the same way. No
    # restarts: the test is of the running ranks (the restarts' giving up is the test above).
    with tmpfs(tmp_path / "ckpt", "20m") as ckpt:
        fill(ckpt, 8 << 10)
        result, _ = launch(tmp_path, "--checkpoint-every", "2", restarts=0, nproc=2)
    assert result.returncode != 0
    failed = re.findall(r"CheckpointWriteError: writing the checkpoint (\S+) failed: \[Errno 28\] "
                        r"No space left on device", result.stderr)  # fmt: skip
    assert len(failed) == 1, result.stderr[-4000:]  # once, from the writer (issue 33)
    assert result.stderr.count(FOLLOWER) == 1, result.stderr[-4000:]  # rank 1 stops on it too
    assert failed[0].startswith(f"{ckpt}/ckpt-e"), failed
    assert "continuing on" not in result.stdout  # never taken for a lost peer
    # bounded: both ranks stop at the next save after the failed write, together
    marks = [float((tmp_path / f"error-{s}").read_text().split()[0]) for s in range(2)]
    first_step = min(float(line.split()[2]) for s in range(2)
                     for line in (tmp_path / f"steps-{s}").read_text().splitlines())  # fmt: skip
    assert max(marks) - min(marks) < 10, marks
    assert max(marks) - first_step < 60, (marks, first_step)


def test_sigterm_ends_a_writer_blocked_in_a_collective_at_once(tmp_path):
    # Slot 0 writes a background checkpoint every step; slot 1 sleeps 25 s in step 3, so
    # slot 0 waits in gloo for it. A SIGTERM to slot 0 must end it now (its write drained),
    # not once the collective returns.
    cmd = [
        sys.executable, "-m", "rankwise.cli", "launch", "--nproc-per-node=2",
        "--on-failure", "continue", str(WORKER), str(tmp_path), "--checkpoint-every", "1",
        "--hold-slot", "1", "--hold-step", "3", "--hold-seconds", "25",
    ]  # fmt: skip
    with started(cmd, BOUNDED, capture=False) as launcher:
        await_file(tmp_path / "holding-1", launcher)
        time.sleep(1.0)  # slot 0 is in the next step's all-reduce by now
        pid = int((tmp_path / "pids-0").read_text().split()[0])
        os.kill(pid, signal.SIGTERM)
        sent = time.monotonic()
        while process_alive(pid) and time.monotonic() - sent < 20:
            time.sleep(0.02)
        took = time.monotonic() - sent
        print(f"SIGTERM to exit: {took:.2f} s")
        assert took < 15, took  # not the hold's 25 s (a loaded machine's teardown may take seconds)


def test_an_early_exit_0_is_restarted_and_the_job_ends_0_only_once_training_finished(tmp_path):
    # Issue 30's finding: slot 1 exits 0 in step 3 (no error, training not finished) and slot
    # 0 raises in step 6. Main took the exit 0 for the job's end: slot 0 was not restarted,
    # the launcher exited 0 without a final model. Now the exit 0 is a lost slot like any:
    # restarted (it rejoins at the end of step 4, where slot 0 waits for it), slot 0's error
    # restarts slot 0 too, slot 1 trains on to the end and the job exits 0 with final.pt.
    result, _ = launch(
        tmp_path,
        *("--exit-zero", "1:3", "--own-error", "0:6", "--await-joiner-step", "4"),
        restarts=2,
        nproc=2,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    err = result.stderr
    assert (
        "slot 1 exited with exit code 0 before training finished (no rank has completed fit); "
        "restarting it (1/2)" in err
    )
    assert "slot 0 exited with exit code 1; restarting it (1/2)" in err
    assert (tmp_path / "final.pt").exists()
    assert (tmp_path / "rejoined-1").read_text().split()[0] == "5"  # let in after step 4
    report = read_audit(tmp_path / "audit")
    assert_exactly_once(tmp_path / "audit", len(report.attempts), NUM_SAMPLES, EPOCHS)
