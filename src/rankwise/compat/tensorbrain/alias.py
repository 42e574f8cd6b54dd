"""One rule for every ``rankwise.compat.tensorbrain`` module: a name it does not define itself
is torch's (the module's torch counterpart), so ``tb.X`` is ``torch.X`` unless rankwise
replaces it."""

from __future__ import annotations

from types import ModuleType
from typing import Any


def forward(target: ModuleType, module: str, name: str) -> Any:
    """``getattr(target, name)``, or an AttributeError naming both modules."""
    try:
        return getattr(target, name)
    except AttributeError:
        raise AttributeError(
            f"module {module!r} has no attribute {name!r}: it is an alias of "
            f"{target.__name__!r}, which has none either."
        ) from None


def names(target: ModuleType, own: dict[str, Any]) -> list[str]:
    """What ``dir()`` of the alias module shows: its own names and its torch module's."""
    return sorted({*own, *dir(target)} - {"__getattr__", "__dir__"})
