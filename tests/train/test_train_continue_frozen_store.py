"""Issue 30 under ``rankwise launch --on-failure continue``: an object store frozen mid-run
(its server SIGSTOPped, then SIGCONTed) never holds the training loop. Each save snapshots the
state and queues it behind the write the store does not answer (the newest state wins), one
warning names the store, the job finishes exactly once and the newest checkpoint holds the
final weights. Before, every save under continue mode waited for the running write: the steps
stopped for as long as the store was frozen."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from helpers.paths import SCRIPTS
from rankwise.testing import assert_exactly_once
from rankwise.testing.frozen_store import frozen_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WORKER = SCRIPTS / "continue_worker.py"
NUM_SAMPLES, EPOCHS = 192, 2  # 2 ranks x 8: 12 optimizer steps an epoch, 24 in all
FREEZE_AT, FREEZE_S = 4, 5.0
# a save after every step; the store's silence announced after 1 s (not 5)
WORKER_ARGS = ["--checkpoint-every", "1", "--step-delay", "0.2", "--silent-s", "1"]


def step_times(out: Path, slot: int) -> list[float]:
    """When ``slot`` trained each of its micro-batches (its ``steps-<slot>`` log)."""
    lines = (out / f"steps-{slot}").read_text().split("\n")
    return [float(line.split()[2]) for line in lines if line]


def reached(out: Path, step: int) -> bool:
    log = out / "steps-0"
    return log.exists() and any(
        int(line.split()[1]) >= step for line in log.read_text().split("\n") if line
    )


def test_a_frozen_store_never_holds_the_loop_under_continue_mode(tmp_path: Path):
    out = tmp_path / "out"
    run = frozen_store(
        WORKER,
        tmp_path,
        freeze_when=lambda: reached(out, FREEZE_AT),
        freeze_s=FREEZE_S,
        script_args=[str(out), *WORKER_ARGS],
        launch_args=["--on-failure", "continue"],
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.thawed_at - run.frozen_at >= FREEZE_S - 0.5  # it was frozen that long
    for slot in (0, 1):
        times = step_times(out, slot)
        assert sum(t > run.frozen_at for t in times) >= 10  # it trained on while frozen
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert max(gaps) < 2.0, (slot, max(gaps))  # before: the freeze's 5 s, at a save
    said = run.stderr.count(f"the checkpoint store {run.url} has not answered for")
    assert said == 1, run.stderr[-4000:]  # one warning, by the writing rank
    assert_exactly_once(out / "audit", 1, NUM_SAMPLES, EPOCHS)
    assert run.latest is not None
    url, state = run.latest
    assert url == f"{run.url}/ckpt-e000002-s000000024.pt", url
    final = torch.load(out / "final.pt")
    model = state["model"]
    assert model.keys() == final.keys()
    assert all(torch.equal(model[k], final[k]) for k in final)
