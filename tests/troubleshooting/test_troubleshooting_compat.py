"""docs/troubleshooting.md's rows for the seed guides' compatibility APIs (rankwise.compat),
each provoked in this process. tests/troubleshooting/test_troubleshooting.py checks that these rows and
triggers pair up."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import rankwise.compat.cyxwiz as cx
from helpers.troubleshooting_table import check_row, raised
from rankwise.compat import frameworm

TRIGGERS: dict[str, Callable[[], BaseException]] = {
    "cyxwiz-add-module": lambda: raised(cx.SequentialModel().add, cx.LinearModule),
    "frameworm-model-name": lambda: raised(frameworm.get_model, "gan"),
}


@pytest.mark.parametrize("row_id", sorted(TRIGGERS))
def test_documented_message_is_the_one_raised(row_id: str) -> None:
    check_row(row_id, TRIGGERS[row_id])
