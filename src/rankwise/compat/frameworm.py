"""The FRAMEWORM guide's names on rankwise: ``from rankwise.compat.frameworm import Config,
get_model, Trainer`` replaces ``from frameworm import Config, get_model, Trainer``.

Names and thin adapters only; the behaviour is the core's:

- ``Config`` is :class:`rankwise.train.ConfigTree` (``Config.from_file("config.yaml")``,
  ``config.model.latent_dim``; a missing key names its path).
- ``get_model(name)(config)`` builds :class:`rankwise.models.VAE` (``"vae"``) or
  :class:`rankwise.models.MLP` (``"mlp"``) from ``config.model``.
- ``Trainer(model, optimizer, device)`` is :class:`rankwise.train.DistributedTrainer` with the
  model's own loss (``loss_fn=None``); ``train(train_loader, val_loader, epochs)`` is ``fit``.
- ``autocast()`` / ``GradScaler()`` stand in for ``torch.cuda.amp``'s: fp16 with loss scaling
  on CUDA, bfloat16 (and a pass-through scaler) on the CPU (``Precision.mixed()``).

See docs/seeds/frameworm.md.

>>> from rankwise.compat.frameworm import Config, get_model
>>> config = Config({"model": {"input_dim": 8, "latent_dim": 2, "hidden_dim": 4}})
>>> type(get_model("vae")(config)).__name__
'VAE'
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rankwise.models import MLP, VAE
from rankwise.parallel import Precision, enable_gradient_checkpointing
from rankwise.train import ConfigTree, DistributedTrainer, DistributedTrainingConfig
from rankwise.train import DistributedTrainingHistory as History

Config = ConfigTree

__all__ = ["Config", "GradScaler", "Trainer", "autocast", "get_model"]


def _vae(config: ConfigTree) -> nn.Module:
    m = config.model
    return VAE(m.input_dim, m.latent_dim, m.get("hidden_dim", 128), m.get("beta", 1.0))


def _mlp(config: ConfigTree) -> nn.Module:
    m = config.model
    return MLP(m.input_dim, m.output_dim, m.get("hidden_dim", 128), m.get("depth", 1))


_MODELS: dict[str, Callable[[ConfigTree], nn.Module]] = {"vae": _vae, "mlp": _mlp}


def get_model(name: str) -> Callable[[ConfigTree], nn.Module]:
    """The builder of model ``name``: ``get_model("vae")(config)``.

    ``"vae"`` reads ``config.model.input_dim``, ``latent_dim`` (and ``hidden_dim``, ``beta``
    if set); ``"mlp"`` reads ``input_dim``, ``output_dim`` (and ``hidden_dim``, ``depth``).
    """
    if name not in _MODELS:
        raise ValueError(
            f"unknown model {name!r}; the known models are {sorted(_MODELS)} "
            "(e.g. get_model('vae')(config))."
        )
    return _MODELS[name]


class Trainer(DistributedTrainer):
    """``Trainer(model, optimizer, device)``: a :class:`DistributedTrainer` whose model returns
    ``{"loss": ...}`` (give ``loss_fn=`` for one that returns outputs, e.g. the MLP).

    ``model`` may be plain, or wrapped in DataParallel or DDP already (then it is used as it
    is). ``**settings`` are :class:`DistributedTrainingConfig` fields for every ``train``
    call (``precision="bf16"``, ``grad_accum_steps=4``, ``checkpoint_dir="ckpt"`` ...);
    checkpoints are off unless ``checkpoint_dir`` is given.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device | str | int | None = None,
        *,
        loss_fn: Callable[..., torch.Tensor] | None = None,
        **settings: Any,
    ) -> None:
        self.settings = {"checkpoint_dir": None, **settings}
        DistributedTrainingConfig(**self.settings)  # a bad setting fails here, not in train()
        super().__init__(model, loss_fn, optimizer, device=device)

    def train(self, train_loader: Any, val_loader: Any = None, epochs: int = 1) -> History:
        """``fit(train_loader, val=val_loader)`` for ``epochs`` epochs; returns the history."""
        config = DistributedTrainingConfig(**{**self.settings, "epochs": epochs})
        return self.fit(train_loader, val=val_loader, config=config)

    def enable_gradient_checkpointing(self) -> list[str]:
        """Recompute the model's blocks in the backward pass (less memory, same gradients);
        returns the blocks' names (the VAE's: ``['encoder', 'decoder']``)."""
        return enable_gradient_checkpointing(self.model)


def autocast() -> contextlib.AbstractContextManager[Any]:
    """``torch.cuda.amp.autocast()``'s stand-in: this rank's device, float16 on CUDA and
    bfloat16 on the CPU (torch's CUDA autocast does nothing without CUDA)."""
    return Precision.mixed().autocast()


def GradScaler() -> torch.amp.GradScaler:
    """``torch.cuda.amp.GradScaler()``'s stand-in: loss scaling for fp16 on CUDA; on the CPU,
    where :func:`autocast` uses bfloat16, a disabled scaler (``scale(loss)`` is ``loss``)."""
    return Precision.mixed().grad_scaler()
