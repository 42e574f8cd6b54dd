"""Two small models whose forward computes the loss itself: a VAE and an MLP classifier.

They are what the FRAMEWORM guide's ``get_model("vae")`` / ``get_model("mlp")`` build, and
the smallest real examples of a model that returns ``{"loss": ...}``, which
``DistributedTrainer(model, loss_fn=None, ...)`` trains (docs/train.md).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn


def _positive(owner: str, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}.{name} ({value!r}) must be an integer >= 1, e.g. 16.")
    return value


class VAE(nn.Module):
    """A variational autoencoder on flat inputs of ``input_dim`` features.

    ``forward(x)`` encodes ``x`` (``[B, input_dim]``, or any ``[B, ...]`` with that many
    features) to a Gaussian ``(mu, logvar)`` over ``latent_dim``, samples ``z`` with the
    reparameterisation trick while training (``z = mu`` in eval mode, so evaluation is
    deterministic), decodes it, and returns a dict: ``loss`` (batch mean of the per-sample
    squared reconstruction error plus ``beta`` x the KL divergence to N(0, I)),
    ``recon_loss``, ``kl``, ``recon``, ``mu``, ``logvar``.

    ``encoder`` and ``decoder`` are its blocks for gradient checkpointing (``block_names``).

    >>> vae = VAE(input_dim=8, latent_dim=2, hidden_dim=4)
    >>> out = vae(torch.zeros(3, 8))
    >>> sorted(out), out["recon"].shape, out["loss"].ndim
    (['kl', 'logvar', 'loss', 'mu', 'recon', 'recon_loss'], torch.Size([3, 8]), 0)
    """

    block_names: ClassVar[tuple[str, ...]] = ("encoder", "decoder")

    def __init__(
        self, input_dim: int, latent_dim: int, hidden_dim: int = 128, beta: float = 1.0
    ) -> None:
        super().__init__()
        self.input_dim = _positive("VAE", "input_dim", input_dim)
        self.latent_dim = _positive("VAE", "latent_dim", latent_dim)
        hidden = _positive("VAE", "hidden_dim", hidden_dim)
        if not isinstance(beta, int | float) or isinstance(beta, bool) or beta < 0:
            raise ValueError(f"VAE.beta ({beta!r}) must be a number >= 0, e.g. 1.0.")
        self.beta = float(beta)
        # The encoder's last layer gives mu and logvar side by side: [B, 2 * latent_dim].
        self.encoder = nn.Sequential(
            nn.Linear(input_dim, hidden), nn.ReLU(), nn.Linear(hidden, 2 * latent_dim)
        )
        self.decoder = nn.Sequential(
            nn.Linear(latent_dim, hidden), nn.ReLU(), nn.Linear(hidden, input_dim)
        )

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        flat = _flatten(x, self.input_dim, "VAE")
        mu, logvar = self.encoder(flat).chunk(2, dim=1)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if self.training else mu
        recon = self.decoder(z)
        recon_loss = F.mse_loss(recon, flat, reduction="none").sum(1).mean()
        kl = (-0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(1)).mean()
        return {
            "loss": recon_loss + self.beta * kl,
            "recon_loss": recon_loss,
            "kl": kl,
            "recon": recon,
            "mu": mu,
            "logvar": logvar,
        }


class MLP(nn.Module):
    """``input_dim -> hidden_dim -> ReLU -> ... -> output_dim`` logits (``depth`` hidden layers).

    ``forward(x)`` returns the logits ``[B, output_dim]``; train it with a loss function
    (``DistributedTrainer(mlp, torch.nn.CrossEntropyLoss(), ...)``).

    >>> MLP(input_dim=8, output_dim=3, hidden_dim=4)(torch.zeros(5, 8)).shape
    torch.Size([5, 3])
    """

    def __init__(
        self, input_dim: int, output_dim: int, hidden_dim: int = 128, depth: int = 1
    ) -> None:
        super().__init__()
        self.input_dim = _positive("MLP", "input_dim", input_dim)
        _positive("MLP", "output_dim", output_dim)
        _positive("MLP", "hidden_dim", hidden_dim)
        _positive("MLP", "depth", depth)
        layers: list[nn.Module] = []
        width = input_dim
        for _ in range(depth):
            layers += [nn.Linear(width, hidden_dim), nn.ReLU()]
            width = hidden_dim
        self.layers = nn.Sequential(*layers, nn.Linear(width, output_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(_flatten(x, self.input_dim, "MLP"))


def _flatten(x: torch.Tensor, features: int, owner: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.ndim < 1 or x[0].numel() != features:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(
            f"{owner} expects a batch of inputs with input_dim ({features}) features each, "
            f"got {shape}; pass a [batch, {features}] tensor or build the model with "
            f"input_dim matching your data."
        )
    return x.reshape(x.shape[0], -1)
