"""The `rankwise` command: launch policy (pure), help texts, env report, real launches, demo."""

from __future__ import annotations

import gc
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname

from helpers.paths import EXAMPLES, SCRIPTS
from rankwise.cli import build_parser, main
from rankwise.distributed.interfaces import is_loopback, resolve, route_source
from rankwise.launch import apply_defaults
from rankwise.testing import child_env, free_port, run_isolated, run_script

WORKER = SCRIPTS / "launch_worker.py"
ELSEWHERE = "203.0.113.7"  # RFC 5737 TEST-NET-3: never an address of this machine


def _launch_args(*argv: str) -> object:
    return apply_defaults(build_parser().parse_args(["launch", *argv, "train.py"]))


class TestLaunchPolicy:
    def test_single_node_gets_c10d_on_an_os_chosen_port(self) -> None:
        args = _launch_args("--nproc-per-node=2")
        assert args.rdzv_backend == "c10d"  # type: ignore[attr-defined]
        assert args.rdzv_endpoint == "127.0.0.1:0"  # type: ignore[attr-defined]
        assert args.rdzv_id != "none"  # type: ignore[attr-defined]

    def test_single_node_keeps_a_given_port(self) -> None:
        args = _launch_args("--master-port=29777")
        assert args.rdzv_endpoint == "127.0.0.1:29777"  # type: ignore[attr-defined]

    def test_multi_node_uses_the_master_as_rendezvous(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        args = _launch_args("--nnodes=2", "--node-rank=1", "--master-addr=10.1.2.3")
        assert args.rdzv_backend == "c10d"  # type: ignore[attr-defined]
        assert args.rdzv_endpoint == "10.1.2.3:29500"  # type: ignore[attr-defined]
        assert args.rdzv_id == "rankwise"  # type: ignore[attr-defined]
        # c10d numbers nodes by arrival: a given --node-rank is not silently dropped
        assert "--node-rank 1 is not used" in capsys.readouterr().err

    def test_multi_node_names_this_node_by_its_route_to_the_endpoint(self) -> None:
        # torchrun would announce the FQDN, which may resolve to a loopback address.
        own = route_source(ELSEWHERE)
        if own is not None and not is_loopback(own):
            routed = _launch_args(
                "--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint={ELSEWHERE}:1"
            )
            assert routed.local_addr == own  # type: ignore[attr-defined]
        endpoint = ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29555"]
        args = _launch_args(*endpoint)
        assert args.rdzv_conf == ""  # type: ignore[attr-defined]  # torch knows loopback hosts
        given = _launch_args(*endpoint, "--local-addr=10.9.8.7", "--rdzv-conf=is_host=0")
        assert given.local_addr == "10.9.8.7"  # type: ignore[attr-defined]
        assert given.rdzv_conf == "is_host=0"  # type: ignore[attr-defined]
        one_node = _launch_args("--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29555")
        assert one_node.local_addr is None  # type: ignore[attr-defined]

    @pytest.mark.parametrize("endpoint", ["127.0.0.1", "localhost", socket.gethostname()])
    def test_a_loopback_route_is_never_published_as_the_master(self, endpoint: str) -> None:
        # `--rdzv-endpoint $(hostname):29400` on a node whose /etc/hosts maps its own name to
        # 127.0.1.1: a loopback --local-addr would become every worker's MASTER_ADDR. Left
        # unset, torch announces the FQDN, which the other nodes resolve through DNS.
        if not is_loopback(resolve(endpoint) or ""):
            pytest.skip(f"{endpoint} does not resolve to loopback here")
        args = _launch_args("--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}:1")
        assert args.local_addr is None  # type: ignore[attr-defined]

    def test_two_agents_on_one_machine_never_both_host_the_store(self) -> None:
        # With is_host=1 given, torch never falls back to a client: if both agents saw the port
        # free before either bound it, the second would fail. One lock decides.
        own = route_source(ELSEWHERE)
        if own is None or is_loopback(own) or _matches_machine_hostname(own):
            pytest.skip("needs an address of this machine that its hostname does not name")
        endpoint = ["--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint={own}:{free_port()}"]
        first = _launch_args(*endpoint)
        second = _launch_args(*endpoint)  # while the first agent still runs
        assert first.rdzv_conf == "is_host=1"  # type: ignore[attr-defined]
        assert second.rdzv_conf == ""  # type: ignore[attr-defined]
        del first  # that agent exits: the lock goes with it
        gc.collect()
        assert _launch_args(*endpoint).rdzv_conf == "is_host=1"  # type: ignore[attr-defined]

    def test_explicit_static_rendezvous_is_kept(self) -> None:
        args = _launch_args("--rdzv-backend=static", "--master-port=29600", "--node-rank=0")
        assert args.rdzv_backend == "static"  # type: ignore[attr-defined]
        assert args.node_rank == 0 and not args.rdzv_endpoint  # type: ignore[attr-defined]
        plain = _launch_args()
        assert plain.node_rank == 0  # type: ignore[attr-defined]

    def test_explicit_rendezvous_is_respected(self) -> None:
        args = _launch_args("--rdzv-backend=etcd", "--rdzv-endpoint=h:1", "--rdzv-id=j")
        assert (args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id) == ("etcd", "h:1", "j")  # type: ignore[attr-defined]

    def test_torchrun_flags_and_script_args_pass_through(self) -> None:
        args = build_parser().parse_args(
            ["launch", "--max-restarts=3", "--monitor-interval=0.5", "t.py", "--lr", "0.1"]
        )
        assert args.max_restarts == 3 and args.monitor_interval == 0.5
        assert args.training_script == "t.py" and args.training_script_args == ["--lr", "0.1"]


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        ([], ["launch", "env", "demo", "rankwise launch --nproc-per-node 2"]),
        (["launch"], ["c10d", "--max-restarts", "--nproc-per-node", "--master-port", "free port"]),
        (["env"], ["MASTER_PORT", "--json"]),
        (["demo"], ["digits", "--nproc", "--epochs"]),
    ],
)
def test_help_documents_every_command(
    argv: list[str], fragments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} missing from `rankwise {' '.join(argv)} --help`"


def test_launch_help_examples_keep_their_line_breaks(capsys: pytest.CaptureFixture[str]) -> None:
    """A continued example line ends in a shell ``\\`` and the next starts indented: a broken
    continuation joins them with a run of spaces in the middle of a command."""
    with pytest.raises(SystemExit):
        main(["launch", "--help"])
    examples = capsys.readouterr().out.split("examples:", 1)[1].split("positional arguments", 1)[0]
    commands = [line.strip() for line in examples.splitlines() if "--" in line]
    assert commands and not [c for c in commands if re.search(r"\S {2,}--", c)]
    assert any(c.endswith("\\") for c in commands)


def test_env_reports_configuration(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "rank 1 of 2" in out and "backends: gloo yes" in out and "CUDA devices:" in out
    assert re.search(r"master port 29500: (free|IN USE)", out)


def test_env_flags_a_bad_configuration(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RANK", "4")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert main(["env", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["valid"] is False
    assert "rank (4) must be < world_size (4)" in report["config"]["error"]
    assert report["variables"]["RANK"] == "4"


def test_env_says_which_environment_and_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    slurm = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
             "SLURM_JOB_NODELIST": "node[3-4]", "SLURM_JOB_ID": "777"}  # fmt: skip
    for var, value in slurm.items():
        monkeypatch.setenv(var, value)
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "detected: SLURM" in out and "SLURM_PROCID=1, SLURM_NTASKS=2, SLURM_STEP_ID=0" in out
    assert "first host of SLURM_JOB_NODELIST=node[3-4]" in out and "master node3:15777" in out
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "j")  # torchrun inside the allocation wins
    for var, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(var, value)
    assert main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["environment"]["kind"] == "torchelastic"
    assert report["environment"]["decided_by"]["TORCHELASTIC_RUN_ID"] == "j"
    assert report["config"]["process_group"] is True  # a launcher's world of one


def test_env_without_launcher_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "detected: none" in out and "no process group" in out


# -- real launches (torchrun underneath) --------------------------------------------------------


def test_script_arguments_reach_every_rank_and_an_adopted_group_without_finalize_exits_0() -> None:
    # One launch for three happy paths: the script's arguments reach every rank as given; the
    # seed guides call torch.distributed.init_process_group themselves and rankwise.init()
    # then adopts that group; and a job that never calls finalize() is torn down by
    # rankwise's exit hook with exit code 0.
    args = ["--echo", "two words", "--init=adopt", "--no-finalize", "--steps=5"]
    proc = run_script(WORKER, 2, script_args=args, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("attempt 0: ok two words") == 2
    assert "rank 0/2" in proc.stdout and "rank 1/2" in proc.stdout


def test_a_world_of_one_under_the_launcher_has_a_process_group_torn_down_at_exit() -> None:
    # torchrun --nproc-per-node 1: the worker calls torch.distributed.get_rank() itself. The
    # group rankwise.init() made is torn down by the exit hook (the launch above adopts one).
    proc = run_script(WORKER, 1, script_args=["--no-finalize"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0/1 attempt 0: ok" in proc.stdout


def test_rank_zero_may_exit_the_moment_init_returns() -> None:
    # Rank 0 hosts the store: were init() to return there before the others were done with
    # it, they would fail with "Connection reset by peer" (3 of 15 such launches did, on a
    # loaded 2-core machine, before init() waited for them). A race, so twice.
    for _ in range(2):
        proc = run_script(WORKER, 3, script_args=["--rank0-exits-after-init"], timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.count(": ok") == 2


def test_a_failing_rank_fails_the_launch_promptly_with_its_error() -> None:
    started = time.monotonic()
    proc = run_script(
        WORKER,
        2,
        script_args=["--raise-on-rank=1"],
        env={"DISTRIBUTED_TIMEOUT_MS": "300000"},  # a hang would sit here for 5 minutes
        timeout=150,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode != 0
    assert "ValueError: boom from rank 1" in proc.stderr
    assert "rankwise launch: " in proc.stderr and "rank(s) failed" in proc.stderr
    assert elapsed < 100, f"took {elapsed:.0f} s: the launch waited for the collective timeout"


def test_restart_after_a_failed_attempt_rendezvouses_again() -> None:
    proc = run_script(
        WORKER,
        2,
        launch_args=["--max-restarts=1"],
        script_args=["--fail-attempts=1"],
        timeout=150,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "planned failure of rank 1 on attempt 0" in proc.stderr
    assert proc.stdout.count("attempt 1: ok") == 2


def test_restart_under_plain_torchrun_static_rendezvous() -> None:
    # Under torchrun's shared agent store (static rendezvous, --master-port) rankwise.init()
    # builds the group on a fresh store that rank 0 announces, so the dead attempt's gloo
    # addresses, still in the agent's store, are never read.
    from rankwise.testing import free_port

    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
        f"--master-port={free_port()}", "--max-restarts=1", str(WORKER), "--fail-attempts=1",
    ]  # fmt: skip
    proc = run_isolated(cmd, env=child_env(), timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("attempt 1: ok") == 2


def test_quickstart_example_runs_on_one_process_and_on_two() -> None:
    script = EXAMPLES / "quickstart.py"
    single = run_isolated([sys.executable, str(script)], env=child_env(), timeout=60)
    assert single.returncode == 0, single.stderr
    assert "world 1: mean loss 0.250" in single.stdout
    double = run_script(script, 2, timeout=120)
    assert double.returncode == 0, double.stderr[-3000:]
    # mean of 0.25 and 0.50; metrics weighted equally: loss (0.3 + 0.4) / 2
    assert "world 2: mean loss 0.375" in double.stdout
    assert "'loss': 0.35" in double.stdout
    assert double.stdout.count("world 2") == 1  # printed on rank 0 only


def test_a_timed_out_launch_leaves_no_process_behind(tmp_path: Path) -> None:
    # A hung launch must be killed with the ranks it started, not just the launcher.
    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        run_isolated([sys.executable, "-c", script], timeout=5)
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{grandchild}").exists() and time.monotonic() < deadline:
        state = Path(f"/proc/{grandchild}/stat").read_text().split()[2]
        if state == "Z":  # killed, waiting for init to reap it
            break
        time.sleep(0.1)
    alive = Path(f"/proc/{grandchild}").exists() and (
        Path(f"/proc/{grandchild}/stat").read_text().split()[2] != "Z"
    )
    assert not alive, f"process {grandchild} outlived the timed-out launch"
