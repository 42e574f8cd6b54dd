"""How rankwise's warnings print (issue 33): ``file:line: Category: message``, without the echo
of the source line that called rankwise; other libraries' warnings print as ever, and
rankwise's stay ``UserWarning`` s that filters and ``pytest.warns`` catch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from rankwise.data import DistributedSampler
from rankwise.distributed import RankwiseWarning
from rankwise.testing import child_env

SCRIPT = textwrap.dedent(
    """
    import warnings
    from rankwise.data import DistributedSampler
    sampler = DistributedSampler(8, num_replicas=1, rank=0)
    list(sampler)
    list(sampler)  # ECHOED-IF-RANKWISE
    warnings.warn("theirs")  # ECHOED-IF-OTHER
    """
)


def test_rankwise_warnings_print_without_the_source_line_others_with_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"  # a file: Python echoes a warning's line from its source
    script.write_text(SCRIPT)
    run = subprocess.run(
        [sys.executable, str(script)], env=child_env(), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    err = run.stderr
    assert "RankwiseWarning: DistributedSampler: epoch 0 was already iterated" in err, err
    assert "ECHOED-IF-RANKWISE" not in err, err  # the source line of rankwise's warning
    assert "UserWarning: theirs" in err and "ECHOED-IF-OTHER" in err, err  # unchanged


def test_rankwise_warnings_are_user_warnings_to_filters_and_pytest() -> None:
    sampler = DistributedSampler(4, num_replicas=1, rank=0)
    list(sampler)
    with pytest.warns(UserWarning, match="set_epoch was not called"):
        list(sampler)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        sampler = DistributedSampler(4, num_replicas=1, rank=0)
        list(sampler)
        with pytest.raises(RankwiseWarning):
            list(sampler)
