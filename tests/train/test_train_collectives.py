"""The trainer's own collectives on real gloo ranks: evaluate reads the reduced sums (also with
fewer samples than ranks), the int all-gather behind check_even / has_batch_everywhere, and
predict on an empty data set."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import rankwise.distributed as rd
from rankwise.testing import run_distributed
from rankwise.train import DistributedTrainer
from rankwise.train.data import check_even, gather_int, has_batch_everywhere


def _evaluate_few(n: int) -> dict[str, Any]:
    torch.manual_seed(3)
    x, y = torch.randn(n, 6), torch.randint(0, 3, (n,))
    torch.manual_seed(5)
    model = nn.Linear(6, 3)
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters()))
    loss, accuracy = trainer.evaluate(x, y, batch_size=2)
    return {"loss": loss, "accuracy": accuracy, **trainer.last_evaluation}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [1, 5])
def test_evaluate_on_three_ranks_equals_one_rank_also_with_fewer_samples_than_ranks(
    n: int,
) -> None:
    reference = _evaluate_few(n)  # a world of one, in this process
    for result in run_distributed(_evaluate_few, 3, args=(n,), timeout=90):
        assert result["count"] == n  # the world's samples, not this rank's
        assert result["correct"] == reference["correct"]
        # Sums are float64, but a float32 forward over another batch grouping may round a
        # per-sample loss differently in its last bit (CPU kernels choose by batch shape).
        assert result["loss"] == pytest.approx(reference["loss"], rel=1e-6)


def _empty_evaluate() -> str:
    model = nn.Linear(6, 3)
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters()))
    try:
        trainer.evaluate(torch.randn(0, 6), torch.zeros(0, dtype=torch.int64))
    except ValueError as e:
        return str(e)
    return "no error"


@pytest.mark.timeout(200)
def test_evaluate_on_no_samples_raises_on_every_rank() -> None:
    for message in run_distributed(_empty_evaluate, 2, timeout=90):
        assert "no samples" in message


def _gathers() -> dict[str, Any]:
    rank = rd.get_rank()
    out: dict[str, Any] = {"ints": gather_int(10 + rank), "device": str(rd.collective_device())}
    out["all_have"] = has_batch_everywhere(True, 0)
    out["none_have"] = has_batch_everywhere(False, 0)
    for name, call in (
        ("uneven", lambda: check_even(3 + rank)),
        ("some_have", lambda: has_batch_everywhere(rank == 0, 4)),
    ):
        try:
            call()
            out[name] = "no error"
        except ValueError as e:
            out[name] = str(e)
    check_even(7)  # equal counts: no error
    return out


@pytest.mark.timeout(200)
def test_batch_count_agreement_goes_through_one_int_all_gather() -> None:
    for result in run_distributed(_gathers, 2, timeout=90):
        assert result["ints"] == [10, 11]
        assert result["device"] == "cpu"  # gloo: the collective device is the CPU
        assert result["all_have"] is True and result["none_have"] is False
        assert "rank 0: 3, rank 1: 4" in result["uneven"]
        assert "ranks [1] ran out of batches after 4 steps" in result["some_have"]


def test_predict_on_an_empty_data_set_names_the_problem() -> None:
    model = nn.Linear(6, 3)
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters()))
    with pytest.raises(ValueError, match=r"predict: the data has no samples \(len 0\)"):
        trainer.predict(torch.randn(0, 6))
