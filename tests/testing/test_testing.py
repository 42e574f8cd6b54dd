"""rankwise.testing's process helpers: rank variables, manual launches, and no process left
behind when a run times out."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rankwise.testing import rank_env, run_by_hand


def _alive(pid: int) -> bool:
    # A killed process waiting for init to reap it ("Z") counts as gone.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except FileNotFoundError:
            return False
        if state == "Z":
            return False
        time.sleep(0.1)
    return True


def test_rank_env_sets_the_launcher_variables_over_the_callers() -> None:
    env = rank_env(1, 3, 29555, {"EXTRA": "x"})
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("1", "3", "1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["EXTRA"]) == ("127.0.0.1", "29555", "x")


@pytest.mark.timeout(60)
def test_run_by_hand_runs_one_process_per_rank(tmp_path: Path) -> None:
    code = (
        "import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'], "
        "os.environ['MASTER_PORT'], os.getcwd()); raise SystemExit(int(os.environ['RANK']))"
    )
    procs = run_by_hand([sys.executable, "-c", code], 3, cwd=tmp_path, timeout=40)
    lines = [p.stdout.split() for p in procs]
    assert [line[:2] for line in lines] == [["0", "3"], ["1", "3"], ["2", "3"]]
    assert len({line[2] for line in lines}) == 1 and lines[0][3] == str(tmp_path)
    assert [p.returncode for p in procs] == [0, 1, 2]


@pytest.mark.timeout(60)
def test_a_timed_out_manual_launch_leaves_no_process_behind(tmp_path: Path) -> None:
    # Each rank starts a child of its own and hangs: the timeout must kill both.
    script = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open(os.path.join({str(tmp_path)!r}, os.environ['RANK']), 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        run_by_hand([sys.executable, "-c", script], 2, timeout=6)
    pids = [int((tmp_path / str(rank)).read_text()) for rank in range(2)]
    assert not any(_alive(pid) for pid in pids), f"processes {pids} outlived the run"


def test_src_path_is_the_folder_that_holds_the_rankwise_package() -> None:
    # Children get it on PYTHONPATH: one level too deep, rankwise's own subpackages (testing)
    # would shadow top-level packages of that name that dependencies import (anndata's).
    from rankwise.testing import src_path

    assert (Path(src_path()) / "rankwise" / "__init__.py").is_file()
