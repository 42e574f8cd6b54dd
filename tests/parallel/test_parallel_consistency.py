"""Start-up consistency checks on real gloo ranks: config, model shape, dataset length."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import rankwise.parallel as rp
from rankwise.testing import run_distributed


def _net(width: int = 8) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, width), nn.BatchNorm1d(width), nn.Linear(width, 2))


def _outcome(fields: dict[str, Any]) -> str:
    try:
        rp.check_consistent(fields)
    except rp.InconsistentRanksError as exc:
        return str(exc)
    return "consistent"


def _cases() -> dict[str, str]:
    rank = dist.get_rank()
    config = {"lr": 0.1, "epochs": 3, "model": {"width": 8, "act": "tanh"}}
    out = {
        # Equal values, built in a different order on each rank: dict order does not matter.
        "equal": _outcome(
            {
                "config": dict(reversed(config.items())) if rank else config,
                "model": rp.model_signature(_net()),
                "dataset_length": 1797,
            }
        ),
        "config": _outcome({"config": {**config, "lr": 0.2 if rank == 1 else 0.1}}),
        "model": _outcome({"model": rp.model_signature(_net(width=6 if rank == 2 else 8))}),
        "dataset_length": _outcome({"dataset_length": 1796 if rank == 2 else 1797}),
        "two_fields": _outcome({"a": rank == 0, "b": [1, rank % 2]}),
        "field_names": _outcome({"a": 1, **({"extra": 2} if rank == 1 else {})}),
    }
    # The signature looks through the wrapping: FSDP2 shards give their global shapes.
    sharded = rp.wrap_model(_net(), rp.FSDPConfig(), strategy="fsdp")
    out["fsdp_signature"] = str(rp.model_signature(sharded) == rp.model_signature(_net()))
    return out


def test_each_disagreement_is_named_on_every_rank() -> None:
    results = run_distributed(_cases, 3, timeout=120)
    for out in results:
        assert out["equal"] == "consistent"
        assert out["config"] == (
            'config differs: ranks 0,2 have {"epochs":3,"lr":0.1,"model":{"act":"tanh","width":8}}'
            ', rank 1 has {"epochs":3,"lr":0.2,"model":{"act":"tanh","width":8}} '
            "(rank 1 vs ranks 0,2: 'lr': 0.2 instead of 0.1); every rank must use the same "
            "config (the same file and the same overrides)"
        )
        model = out["model"]
        assert model.startswith("model differs: ranks 0,1 have a value with sha256 "), model
        assert (
            '(rank 2 vs ranks 0,1: \'0.bias\': "float32[6]" instead of "float32[8]"; '
            "'0.weight': \"float32[6, 4]\" instead of \"float32[8, 4]\"; '1.bias': "
            '"float32[6]" instead of "float32[8]", and 4 more); build the same model on every rank'
        ) in model
        assert out["dataset_length"] == (
            "dataset_length differs: ranks 0,1 have 1797, rank 2 has 1796; "
            "every rank must load the same data"
        )
        assert out["two_fields"] == (
            "the ranks disagree on 2 fields:\n"
            "  a differs: ranks 1,2 have false, rank 0 has true; every rank must pass the same "
            "value\n"
            "  b differs: ranks 0,2 have [1,0], rank 1 has [1,1]; every rank must pass the same "
            "value"
        )
        assert out["field_names"] == (
            "extra differs: ranks 0,2 have no such field, rank 1 has 2; every rank must pass the "
            "same value"
        )
        assert out["fsdp_signature"] == "True"


# -- one process -------------------------------------------------------------------------------


class _Mode(enum.Enum):
    FAST = 1


@dataclasses.dataclass
class _Config:
    lr: float = 0.1
    mode: _Mode = _Mode.FAST
    path: Path = Path("/data")


def test_world_of_one_is_identity_but_still_checks_the_input() -> None:
    rp.check_consistent(
        {
            "config": _Config(),
            "array": np.arange(3),
            "scalar": np.int64(5),
            "tensor": torch.ones(2),
            "dtype": torch.float32,
            "set": {3, 1, 2},
        }
    )
    with pytest.raises(ValueError, match="no fields: a check of nothing"):
        rp.check_consistent({})
    with pytest.raises(ValueError, match="takes a mapping of field name to value, got list"):
        rp.check_consistent([("a", 1)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"field 'loader'.*memory address"):
        rp.check_consistent({"loader": object()})


def test_model_signature_ignores_the_wrapper() -> None:
    net = _net()
    plain = rp.model_signature(net)
    assert plain["0.weight"] == "float32[8, 4]" and plain["buffer 1.running_mean"] == "float32[8]"
    assert rp.model_signature(nn.DataParallel(net)) == plain
    assert rp.model_signature(torch.compile(net)) == plain
    assert rp.model_signature(_net().double()) != plain
