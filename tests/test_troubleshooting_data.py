"""docs/troubleshooting.md's rows for the lower layers (rankwise.distributed, data, parallel)
added after tests/test_troubleshooting.py's first set, each provoked in this process.
tests/test_troubleshooting.py checks that these rows and triggers pair up."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from torch import nn

import rankwise.data as rdata
import rankwise.parallel as rp
from rankwise.distributed import DistributedConfig
from troubleshooting_table import check_row, raised, warned


def _sampler_repeats_an_epoch() -> BaseException:
    sampler = rdata.DistributedSampler(8, num_replicas=2, rank=0)
    list(sampler)
    return warned(list, sampler)


def _fetch_state_other_source() -> BaseException:
    kw = {"strategy": rdata.Streaming(), "batch_size": 2, "rank": 0, "world_size": 1}
    state = rdata.FetchDataset(np.zeros((10, 2)), **kw).state_dict()
    return raised(rdata.FetchDataset(np.zeros((12, 2)), **kw).load_state_dict, state)


TRIGGERS: dict[str, Callable[[], BaseException]] = {
    "world-size-zero": lambda: raised(DistributedConfig, rank=0, world_size=0),
    "rank-negative": lambda: raised(DistributedConfig, rank=-1, world_size=2),
    "sampler-dataset-type": lambda: raised(rdata.DistributedSampler, iter(range(4))),
    "sampler-no-set-epoch": _sampler_repeats_an_epoch,
    "fetch-state-other-source": _fetch_state_other_source,
    "wrap-strategy-unknown": lambda: raised(rp.wrap_model, nn.Linear(2, 2), strategy="zero"),
}


@pytest.mark.parametrize("row_id", sorted(TRIGGERS))
def test_documented_message_is_the_one_raised(row_id: str) -> None:
    check_row(row_id, TRIGGERS[row_id])
