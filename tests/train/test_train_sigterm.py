"""rankwise.train.sigterm: on SIGTERM the wanted duties run once, in order, then the process
ends as SIGTERM ends it (a process of its own per case: the default action ends it). The
case of a main thread blocked in a collective, served by the helper thread, runs for real in
tests/integrations/test_integrations_trackers.py (a SIGTERM to a launched job)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from rankwise.testing import child_env, run_isolated

SCRIPT = """
import os, signal, sys, time
from pathlib import Path
from rankwise.train.sigterm import Duty, guarded

out = Path(sys.argv[1])
said = []

def note(what):
    def run():
        said.append(what)
        with open(out, "a") as f:
            f.write(what + "\\n")
    return run

def failing():
    raise OSError("the tracker's server is gone")

def slow_write():
    note("write")()
    if sys.argv[2] == "twice":  # a second SIGTERM while the duty runs does not cut it short
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        note("written")()

duties = [
    Duty("the write", lambda: True, slow_write),
    Duty("a failing duty", lambda: True, failing),
    Duty("not held", lambda: False, note("never")),
    Duty("the runs", lambda: True, note("runs"), if_ending=True),
]
if sys.argv[2] == "user-handler":  # the program's own handler: called after the duties
    signal.signal(signal.SIGTERM, lambda signum, frame: note("user")())
with guarded(duties) as guard:
    if sys.argv[2] == "deferred":  # inside a tracker's call: served once the call returns
        with guard.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)
            note("call-returned")()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)
with open(out, "a") as f:
    f.write("survived\\n")
"""


def run_case(tmp_path: Path, case: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    out = tmp_path / f"{case}.txt"
    cmd = [sys.executable, "-c", SCRIPT, str(out), case]
    result = run_isolated(cmd, env=child_env(), timeout=60)
    return result, out.read_text().split() if out.exists() else []


def test_sigterm_runs_the_wanted_duties_once_in_order_then_ends_the_process(tmp_path) -> None:
    result, said = run_case(tmp_path, "default")
    assert result.returncode == -signal.SIGTERM, result.stderr[-2000:]
    assert said == ["write", "runs"]  # once each; the one not held never ran
    # a duty that fails is said, and the ones after it still run
    assert "on SIGTERM, a failing duty failed: OSError: the tracker's server is gone" in (
        result.stderr
    )


def test_a_second_sigterm_does_not_cut_a_duty_short(tmp_path) -> None:
    result, said = run_case(tmp_path, "twice")
    assert result.returncode == -signal.SIGTERM, result.stderr[-2000:]
    assert said == ["write", "written", "runs"]


def test_a_sigterm_inside_a_deferred_call_is_served_when_it_returns(tmp_path) -> None:
    result, said = run_case(tmp_path, "deferred")
    assert result.returncode == -signal.SIGTERM, result.stderr[-2000:]
    assert said == ["call-returned", "write", "runs"]


def test_a_program_that_handles_sigterm_itself_goes_on_with_its_runs_open(tmp_path) -> None:
    # Its own handler is called after the duties that hold whether or not the process ends
    # (the write lands); the runs are closed only where SIGTERM ends the process.
    result, said = run_case(tmp_path, "user-handler")
    assert result.returncode == 0, result.stderr[-2000:]
    assert said == ["write", "user", "survived"]


def test_outside_the_block_sigterm_ends_the_process_at_once(tmp_path) -> None:
    script = "import os, signal, time\nfrom rankwise.train.sigterm import guarded\n"
    script += "from rankwise.train.sigterm import Duty\n"
    script += "with guarded([Duty('held', lambda: True, lambda: print('ran'))]) as guard:\n"
    script += "    assert guard.installed\n"
    script += "os.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(5)\n"
    result = run_isolated([sys.executable, "-c", script], env=child_env(), timeout=60)
    assert result.returncode == -signal.SIGTERM, result.stderr[-2000:]
    assert "ran" not in result.stdout  # the guard was taken away with the block


def test_the_checkpointer_and_the_logger_take_the_guard_at_construction(tmp_path: Path) -> None:
    """fit builds the guard first and passes it in: the checkpointer adds its write's duty,
    then the logger its trackers' (in that order: the write lands before the runs close), and
    every call into a tracker runs inside the guard's ``deferred``. No signal is sent."""
    from rankwise.train import DistributedTrainingConfig
    from rankwise.train.checkpoint import Checkpointer, CheckpointManager
    from rankwise.train.sigterm import guarded
    from rankwise.train.tracking import TrainingLogger

    cfg = DistributedTrainingConfig(checkpoint_dir=str(tmp_path), verbose=False)
    with guarded() as guard:
        manager = CheckpointManager(tmp_path)
        checkpointer = Checkpointer(manager, cfg, on_saved=lambda path: None, sigterm=guard)
        logger = TrainingLogger(None, False, 0, True, loggers=[], sigterm=guard)
        assert [d.what for d in guard.duties][-1] == "closing the trackers' runs"
        assert len(guard.duties) == 2 and checkpointer.sigterm is guard
        assert logger.trackers.around_calls == guard.deferred
        logger.close()
    without = Checkpointer(None, cfg, on_saved=lambda path: None, sigterm=guard)
    assert without.sigterm_duty() is None and len(guard.duties) == 2  # no folder: no duty
