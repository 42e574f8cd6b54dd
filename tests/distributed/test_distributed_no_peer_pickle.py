"""No pickle from a peer (issue 23, finding 11): what ranks send each other (a joiner's
training state, the RNG states a save gathers, the survivors' steps) is read back as data
(``torch.load(weights_only=True)``), never as code a peer chose."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import rankwise.distributed as rd
from rankwise.testing import run_distributed
from rankwise.train.state import broadcast_state

pytestmark = pytest.mark.timeout(120)


class Planted:
    """What a stranger would send: unpickling it runs ``Path(marker).touch()``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(self.marker),))


def _exchange(marker: str) -> dict[str, Any]:
    mine = {"w": torch.arange(4.0), "meta": {"step": 3, "ranks": (0, 1)}}
    state = broadcast_state(mine if rd.get_rank() == 0 else None)
    gathered = rd.all_gather_plain({"rank": rd.get_rank(), "rng": torch.get_rng_state()})
    refused = ""
    try:
        broadcast_state({"evil": Planted(marker)} if rd.get_rank() == 0 else None)
    except Exception as exc:  # rank 1 refuses to unpickle it; rank 0 never unpickles
        refused = type(exc).__name__
    return {"state": state, "ranks": [g["rank"] for g in gathered], "refused": refused}


def test_state_and_rng_travel_as_data_and_a_planted_object_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    first, second = run_distributed(_exchange, 2, args=(str(marker),), timeout=90)
    assert torch.equal(second["state"]["w"], torch.arange(4.0))
    assert second["state"]["meta"] == {"step": 3, "ranks": (0, 1)}
    assert first["ranks"] == second["ranks"] == [0, 1]
    assert second["refused"] == "UnpicklingError"
    assert not marker.exists()  # the peer's object never ran
