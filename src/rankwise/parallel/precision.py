"""Mixed precision as one small object, and gradient clipping that is right for DDP and FSDP2.

:class:`Precision` owns the ``torch.autocast`` context and, for fp16, the
``torch.amp.GradScaler`` (and its state, which the trainer checkpoints)::

    precision = Precision("bf16")
    with precision.autocast():
        loss = loss_fn(model(x), y)
    precision.backward(loss)
    precision.clip_grad_norm_(model, 1.0, optimizer)    # unscales first under fp16
    precision.step(optimizer)                            # False if fp16 overflowed: skipped
    optimizer.zero_grad()

Modes: ``"fp32"`` (nothing), ``"bf16"`` (autocast to bfloat16; float32's range, so no loss
scaling), ``"fp16"`` (autocast to float16 + dynamic loss scaling). On CPU, torch autocasts to
both bfloat16 and float16 and ``GradScaler("cpu")`` works, so all three modes run anywhere;
CPU float16 kernels are slow on most processors, so prefer bf16 there.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

import rankwise.distributed as rd
from rankwise.distributed.errors import RankwiseWarning
from rankwise.parallel.common import DTYPES, NO_OP
from rankwise.parallel.fsdp import as_dtensor

Params = nn.Module | torch.Tensor | Iterable[torch.Tensor]


class Precision:
    """Autocast and loss scaling for one of ``"fp32"``, ``"bf16"``, ``"fp16"``.

    ``device``: where the forward runs (``"cpu"``, ``"cuda"``); default: this rank's device.
    ``init_scale`` / ``growth_interval`` tune fp16's GradScaler (torch's defaults).

    >>> p = Precision("bf16")
    >>> with p.autocast():
    ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
    torch.bfloat16
    >>> p.state_dict()
    {'mode': 'bf16'}
    """

    def __init__(
        self,
        mode: str = "fp32",
        device: torch.device | str | None = None,
        *,
        init_scale: float = 2.0**16,
        growth_interval: int = 2000,
    ) -> None:
        if mode not in DTYPES:
            raise ValueError(
                f"precision mode ({mode!r}) is not supported; use 'fp32', 'bf16' or 'fp16'."
            )
        if not init_scale > 0:
            raise ValueError(f"init_scale ({init_scale}) must be > 0, e.g. 65536.")
        if growth_interval < 1:
            raise ValueError(f"growth_interval ({growth_interval}) must be >= 1, e.g. 2000.")
        self.mode = mode
        self.dtype = DTYPES[mode]
        self.device_type = torch.device(device).type if device is not None else rd.device().type
        self.scaler: torch.amp.GradScaler | None = None
        if mode == "fp16":
            self.scaler = torch.amp.GradScaler(
                self.device_type, init_scale=init_scale, growth_interval=growth_interval
            )
        self._unscaled: set[int] = set()  # optimizers unscaled since the last step

    def __repr__(self) -> str:
        return f"Precision({self.mode!r}, device={self.device_type!r})"

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context for forward pass and loss; a no-op context for fp32."""
        if self.mode == "fp32":
            return NO_OP
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled under fp16 so small gradients survive in float16."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide ``optimizer``'s gradients by the loss scale (fp16); idempotent per step."""
        if self.scaler is not None and id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def clip_grad_norm_(
        self,
        parameters: Params,
        max_norm: float,
        optimizer: torch.optim.Optimizer | None = None,
        norm_type: float = 2.0,
    ) -> torch.Tensor:
        """Unscale (fp16 needs ``optimizer`` for that) then :func:`clip_grad_norm`."""
        if self.scaler is not None:
            if optimizer is None:
                raise ValueError(
                    "Precision('fp16').clip_grad_norm_ needs the optimizer, to unscale the "
                    "gradients before measuring them: clip_grad_norm_(model, max_norm, optimizer)."
                )
            self.unscale_(optimizer)
        return clip_grad_norm(parameters, max_norm, norm_type)

    def step(self, *optimizers: torch.optim.Optimizer) -> bool:
        """``optimizer.step()`` for each optimizer; under fp16 skipped when gradients
        overflowed. Returns True when nothing was skipped.

        Give every optimizer of the step in one call (``precision.step(gen_opt, disc_opt)``):
        the scaler updates once, after all of them. Updating between optimizers would reset
        its record of which were unscaled (a clipped optimizer would be unscaled twice) and
        change the scale under the next one.

        The skip is the same on every rank: DDP gradients are identical after sync, and for
        FSDP2's sharded gradients torch all-reduces the overflow flag.
        """
        if not optimizers:
            raise ValueError("step() needs the optimizer(s) to step, e.g. precision.step(opt).")
        for optimizer in optimizers:
            self._unscaled.discard(id(optimizer))
        if self.scaler is None:
            for optimizer in optimizers:
                optimizer.step()
            return True
        before = self.scaler.get_scale()
        for optimizer in optimizers:
            self.scaler.step(optimizer)
        self.scaler.update()
        return not self.scaler.get_scale() < before  # update() backs off only after a skip

    @classmethod
    def mixed(cls, device: torch.device | str | None = None) -> Precision:
        """Mixed precision for ``device`` (default: this rank's): ``"fp16"`` with loss
        scaling on CUDA, ``"bf16"`` elsewhere (CPUs run bfloat16 well and float16 slowly, and
        bfloat16 has float32's range, so it needs no loss scaling).

        >>> Precision.mixed("cpu").mode
        'bf16'
        """
        kind = torch.device(device).type if device is not None else rd.device().type
        return cls("fp16" if kind == "cuda" else "bf16", kind)

    def grad_scaler(self) -> torch.amp.GradScaler:
        """The ``torch.amp.GradScaler`` this mode needs, for loops written around one: fp16's
        own (dynamic loss scaling); otherwise a disabled one, whose ``scale`` returns the loss
        unchanged and whose ``step`` is ``optimizer.step()``.

        >>> Precision("bf16", "cpu").grad_scaler().is_enabled()
        False
        """
        if self.scaler is not None:
            return self.scaler
        return torch.amp.GradScaler(self.device_type, enabled=False)

    def state_dict(self) -> dict[str, Any]:
        """``{"mode": ...}`` plus, under fp16, the GradScaler's plain-valued state."""
        state: dict[str, Any] = {"mode": self.mode}
        if self.scaler is not None:
            state["scaler"] = dict(self.scaler.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output. A different saved mode is allowed (precision
        may change on resume), but its loss-scale state is then ignored with a warning."""
        saved = state.get("mode")
        if saved not in DTYPES:
            raise ValueError(
                f"not a Precision state: mode {saved!r}; pass what Precision.state_dict() returned."
            )
        if saved != self.mode:
            warnings.warn(
                f"the checkpoint was saved with precision {saved!r} and this run uses "
                f"{self.mode!r}; its loss-scale state (if any) is not loaded.",
                RankwiseWarning,
                stacklevel=2,
            )
            return
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def clip_grad_norm(parameters: Params, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Clip gradients to a total norm of ``max_norm``; return the norm before clipping.

    Correct for every strategy when called after the synchronising backward: DDP gradients
    are identical on all ranks, so each rank computes the same norm; FSDP2 gradients are
    sharded ``DTensor`` s and torch reduces the partial norms across ranks, giving the norm
    of the unsharded gradients. The result is a plain tensor either way.

    >>> layer = nn.Linear(2, 1)
    >>> layer(torch.ones(1, 2)).sum().backward()
    >>> float(clip_grad_norm(layer, 1.0)) > 1.0      # |[1, 1, 1]| = sqrt(3)
    True
    """
    if max_norm <= 0:
        raise ValueError(f"max_norm ({max_norm}) must be > 0, e.g. 1.0.")
    params = parameters.parameters() if isinstance(parameters, nn.Module) else parameters
    total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
    sharded = as_dtensor(total)
    return sharded.full_tensor() if sharded is not None else total
