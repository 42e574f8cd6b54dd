"""Bad input to ``rankwise launch``, bounded (issue 30): every launcher argument and every
variable the ranks read is checked once, by the launcher, before any rank starts (one line
naming the value and the fix, exit 2), and every wait the launcher announces is kept.

In-process launches: a refusal happens before anything is spawned, so these take
milliseconds; the script would write a file if any rank ever ran it."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from helpers.bad_variables import BAD, read_variables
from rankwise.launch import launch


def test_every_variable_the_code_reads_has_a_bad_value_below() -> None:
    # A new variable in config.py's tables fails here until it has a row in BAD.
    assert read_variables() == set(BAD)


def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    return path


@pytest.mark.parametrize("mode", ["continue", "restart"])
@pytest.mark.parametrize("var", sorted(BAD))
def test_a_bad_variable_is_refused_once_by_the_launcher_before_any_rank(
    tmp_path, capsys, monkeypatch, var, mode
) -> None:
    monkeypatch.setenv(var, BAD[var])
    argv = ["--nproc-per-node", "2", "--max-restarts", "2", "--on-failure", mode]
    assert launch([*argv, str(script(tmp_path))]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines  # one line, no traceback, said once
    assert lines[0].startswith("rankwise launch: error: ") and var in lines[0], lines
    if var == "RANKWISE_JOB_TOKEN":
        assert BAD[var] not in lines[0]
    assert not (tmp_path / "ran").exists()  # no rank started


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--master-port", "99999"], "--master-port (99999) must be a TCP port, 1 to 65535"),
        (["--on-failure", "continue", "--master-port", "99999"], "--master-port (99999) must"),
        (["--nnodes", "2", "--master-port", "0"], "--master-port (0) must be a TCP port"),
        (["--nnodes", "2", "--node-rank", "2"], "--node-rank (2) must be between 0 and 1"),
        (["--on-failure", "continue", "--store-wait-s", "0"], "--store-wait-s (0) must be"),
        (["--store-wait-s", "5"], "--store-wait-s (5.0) is an option of --on-failure continue"),
    ],
)
def test_bad_arguments_are_refused_before_any_rank(tmp_path, capsys, extra, message) -> None:
    assert launch(["--nproc-per-node", "2", *extra, str(script(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "ran").exists()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens there once it is closed


def test_the_announced_wait_for_the_store_is_kept(tmp_path, capsys) -> None:
    # Main said "within 120 s" and gave up after 278 s (torch's client retries past its own
    # timeout). The bound is --store-wait-s; the launcher gives up within it and a second.
    wait = 2.0
    argv = ["--nproc-per-node", "1", "--on-failure", "continue", "--store-wait-s", str(wait)]
    argv += ["--store-endpoint", f"127.0.0.1:{closed_port()}", str(script(tmp_path))]
    started = time.monotonic()
    assert launch(argv) == 1
    took = time.monotonic() - started
    err = capsys.readouterr().err
    assert f"within {wait:g} s" in err, err
    assert wait <= took < wait + 3.0, took  # slack: one connection attempt and a loaded host
    assert not (tmp_path / "ran").exists()
