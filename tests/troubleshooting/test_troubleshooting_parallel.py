"""docs/troubleshooting.md's rows for rankwise.parallel (DDPConfig, FSDPConfig, wrap_model,
ExplicitDDP, Precision, recipes, consistency and sync checks, gradient checkpointing), each
provoked in this process. tests/troubleshooting/test_troubleshooting.py checks that these rows and triggers
pair up."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import rankwise.parallel as rp
from helpers.troubleshooting_table import check_row, raised, warned


class _Named(nn.Module):
    """A model that names its checkpointed blocks, one of them misspelt."""

    block_names = ("encoder", "decodr")

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(2, 2)
        self.decoder = nn.Linear(2, 2)


class _Loss(rp.OutputGradientMixin, nn.MSELoss):
    pass


def _explicit_unused() -> BaseException:
    model = nn.ModuleDict({"used": nn.Linear(2, 2), "unused": nn.Linear(2, 2)})
    ddp = rp.ExplicitDDP(model)
    model["used"](torch.ones(1, 2)).sum().backward()
    return raised(ddp.sync_gradients)


def _fp16_clip_without_optimizer() -> BaseException:
    precision = rp.Precision("fp16", "cpu")
    return raised(precision.clip_grad_norm_, nn.Linear(2, 2), 1.0)


def _precision_mode_changed() -> BaseException:
    saved = rp.Precision("fp16", "cpu").state_dict()
    return warned(rp.Precision("bf16", "cpu").load_state_dict, saved)


def _recipe_bound_twice() -> BaseException:
    recipe = rp.OptimizerRecipe(torch.optim.SGD, lr=0.1)
    recipe.bind(nn.Linear(2, 2).parameters())
    return raised(recipe.bind, nn.Linear(2, 2).parameters())


def _loss_backward_before_forward() -> BaseException:
    loss_fn = _Loss()
    with torch.no_grad():
        loss_fn(torch.ones(2), torch.zeros(2))  # an evaluation forward: nothing to differentiate
    return raised(loss_fn.backward)


def _powersgd_state_into_plain_model() -> BaseException:
    return raised(rp.load_comm_state_dict, nn.Linear(2, 2), {"powersgd": {"iter": 10}})


def _dp_without_gpus() -> BaseException:
    if torch.cuda.device_count() >= 2:
        pytest.skip("strategy='dp' wraps the model on a machine with 2+ GPUs")
    return warned(rp.wrap_model, nn.Linear(2, 2), strategy="dp")


def _fsdp_world_of_one() -> BaseException:
    return warned(rp.wrap_model, nn.Linear(2, 2), strategy="fsdp")


class _Unique:
    """An object whose repr is its memory address (a user class without __repr__)."""


TRIGGERS: dict[str, Callable[[], BaseException]] = {
    "ddp-bucket-size": lambda: raised(rp.DDPConfig, bucket_size_mb=0),
    "ddp-bool-field": lambda: raised(rp.DDPConfig, find_unused_parameters="yes"),
    "ddp-powersgd-int": lambda: raised(rp.DDPConfig, compression="powersgd", powersgd_rank=0),
    "wrap-not-module": lambda: raised(rp.wrap_model, "model.pt"),
    "wrap-fsdp-config-type": lambda: raised(
        rp.wrap_model, nn.Linear(2, 2), rp.DDPConfig(), strategy="fsdp"
    ),
    "wrap-fsdp-config-with-ddp": lambda: raised(rp.wrap_model, nn.Linear(2, 2), rp.FSDPConfig()),
    "wrap-dp-no-gpus": _dp_without_gpus,
    "wrap-fsdp-world-of-one": _fsdp_world_of_one,
    "fsdp-dtype": lambda: raised(rp.FSDPConfig, param_dtype="float16"),
    "fsdp-bool-field": lambda: raised(rp.FSDPConfig, reshard_after_forward="no"),
    "fsdp-block-types": lambda: raised(rp.FSDPConfig, block_types=[nn.Linear]),
    "comm-state-no-powersgd": _powersgd_state_into_plain_model,
    "sync-step-index": lambda: raised(rp.is_sync_step, 7, 3, total=7),
    "explicit-compression": lambda: raised(
        rp.ExplicitDDP, nn.Linear(2, 2), rp.DDPConfig(compression="fp16")
    ),
    "explicit-backward-first": lambda: raised(rp.ExplicitDDP(nn.Linear(2, 2)).backward),
    "explicit-unused-parameters": _explicit_unused,
    "precision-init-scale": lambda: raised(rp.Precision, "fp16", "cpu", init_scale=0),
    "precision-growth-interval": lambda: raised(rp.Precision, "fp16", "cpu", growth_interval=0),
    "precision-clip-needs-optimizer": _fp16_clip_without_optimizer,
    "precision-step-no-optimizer": lambda: raised(rp.Precision("fp32", "cpu").step),
    "precision-state": lambda: raised(
        rp.Precision("fp32", "cpu").load_state_dict, {"scale": 65536.0}
    ),
    "precision-mode-changed": _precision_mode_changed,
    "clip-max-norm": lambda: raised(rp.clip_grad_norm, nn.Linear(2, 2), 0.0),
    "recipe-optimizer-class": lambda: raised(rp.OptimizerRecipe, "adam", lr=0.1),
    "recipe-lr": lambda: raised(rp.OptimizerRecipe, torch.optim.SGD, lr=0),
    "recipe-bound-twice": _recipe_bound_twice,
    "loss-backward-type": lambda: raised(_Loss().backward, 0.5),
    "loss-backward-before-forward": _loss_backward_before_forward,
    "blocks-type": lambda: raised(rp.find_blocks, nn.Linear(2, 2), blocks=["encoder"]),
    "block-names-missing": lambda: raised(rp.find_blocks, _Named()),
    "consistent-not-mapping": lambda: raised(rp.check_consistent, [("dataset_length", 10)]),
    "consistent-empty": lambda: raised(rp.check_consistent, {}),
    "consistent-field-name": lambda: raised(rp.check_consistent, {1: 10}),
    "consistent-address": lambda: raised(rp.check_consistent, {"loader": _Unique()}),
    "consistent-dict-key": lambda: raised(rp.check_consistent, {"sizes": {(1, 2): 3}}),
    "sync-check-atol": lambda: raised(rp.check_parameters_in_sync, nn.Linear(2, 2), atol=-1.0),
}


@pytest.mark.parametrize("row_id", sorted(TRIGGERS))
def test_documented_message_is_the_one_raised(row_id: str) -> None:
    check_row(row_id, TRIGGERS[row_id])
