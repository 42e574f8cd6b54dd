"""A GPT-style decoder language model (GPT-2's layout, nanoGPT's size of code).

Token and learned position embeddings, ``n_layer`` pre-norm blocks (layer norm, causal
self-attention through ``scaled_dot_product_attention``, residual; layer norm, a 4x-wide GELU
MLP, residual), a final layer norm and a linear head that shares the token embedding's weight.
Input ``(B, T)`` token ids with ``T <= context``; output ``(B, T, vocab)`` logits. The loss for
next-token prediction is :func:`lm_loss` on targets shifted by one::

    tokens  [5, 9, 2, 7]     x = tokens[:-1] = [5, 9, 2]     y = tokens[1:] = [9, 2, 7]

>>> model = GPT(GPTConfig(vocab=64, context=8, n_layer=1, n_head=2, d_model=16))
>>> model(torch.zeros(2, 8, dtype=torch.long)).shape
torch.Size([2, 8, 64])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """The model's shape. ``d_model`` must divide by ``n_head``.

    >>> GPTConfig(d_model=384, n_head=5)
    Traceback (most recent call last):
    ...
    ValueError: d_model (384) must be a multiple of n_head (5): each head gets d_model / n_head ...
    """

    vocab: int = 8192
    context: int = 256
    n_layer: int = 6
    n_head: int = 6
    d_model: int = 384
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("vocab", "context", "n_layer", "n_head", "d_model"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} ({value!r}) must be an integer >= 1.")
        if self.d_model % self.n_head:
            raise ValueError(
                f"d_model ({self.d_model}) must be a multiple of n_head ({self.n_head}): each "
                "head gets d_model / n_head channels; e.g. d_model=384 with n_head=6."
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout ({self.dropout!r}) must be in [0, 1).")

    def parameters(self) -> int:
        """The parameter count (the head shares the embedding's weight).

        >>> GPTConfig().parameters()
        13891584
        """
        d = self.d_model
        block = 12 * d * d + 13 * d  # qkv + proj + 2 MLP matrices, their biases, 2 norms
        return self.vocab * d + self.context * d + self.n_layer * block + 2 * d

    def flops_per_token(self) -> int:
        """Training FLOPs per token: 6 x the non-embedding parameters plus the attention
        scores (PaLM's appendix B estimate, ``6N + 12 L d T``), the head included.

        >>> GPTConfig(vocab=10, context=4, n_layer=1, n_head=1, d_model=2).flops_per_token()
        684
        """
        d, n = self.d_model, self.parameters() - self.context * self.d_model
        return 6 * n + 12 * self.n_layer * d * self.context


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        # (B, T, 3C) -> 3 x (B, heads, T, C / heads)
        q, k, v = self.qkv(x).view(b, t, 3, self.n_head, c // self.n_head).permute(2, 0, 3, 1, 4)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model),
            nn.GELU(),
            nn.Linear(4 * cfg.d_model, cfg.d_model),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """The decoder; see the module docstring."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.Sequential(*(Block(cfg) for _ in range(cfg.n_layer)))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.head.weight = self.tok.weight  # weight tying (GPT-2)
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2's: N(0, 0.02) everywhere, the residual projections scaled by 1/sqrt(2 L) so the
        # residual stream's variance does not grow with depth.
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            std = (
                0.02 / math.sqrt(2 * self.config.n_layer) if name.endswith("proj.weight") else 0.02
            )
            nn.init.normal_(p, mean=0.0, std=std)
        for m in self.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.config.context:
            raise ValueError(f"sequence length {t} exceeds the context ({self.config.context}).")
        positions = torch.arange(t, device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(positions))
        return self.head(self.ln_f(self.blocks(x)))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``(B, T, V)`` logits against ``(B, T)`` targets.

    >>> lm_loss(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long))  # log(4)
    tensor(1.3863)
    """
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
