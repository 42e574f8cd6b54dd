"""``rankwise launch --on-failure continue``: what it refuses before starting anything."""

from __future__ import annotations

import pytest

from rankwise.launch import launch


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--nnodes", "2"], "runs on one node"),
        (["--nproc-per-node", "auto"], "needs a number for --nproc-per-node"),
        (["--min-nproc", "4"], "--min-nproc (4) must be between 1 and --nproc-per-node"),
    ],
)
def test_refusals_name_the_fix(tmp_path, capsys, extra, message):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    argv = ["--nproc-per-node", "3", "--on-failure", "continue", *extra, str(script)]
    assert launch(argv) == 2
    assert message in capsys.readouterr().err
