"""The shared validators: one home for the checks every layer applies to user input.

Each returns the value as a plain Python int or raises a ValueError that names the argument,
repeats its value, states the rule and says how to fix it. ``distributed/`` may import this
module (it imports nothing else of rankwise), so the data and augmentation layers and the
process group all word their errors the same way. :func:`did_you_mean` is the one home of the
"did you mean ...?" hint every layer adds to an error about an unknown name.
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Sequence

import numpy as np

__all__ = ["MAX_EPOCH", "check_epoch", "check_int", "check_rank", "did_you_mean", "installed"]

# Epochs are shared with DataLoader workers through int64 tensors (see check_epoch).
MAX_EPOCH = 2**63 - 1
_MAX_U64 = 2**64 - 1  # seeds


def did_you_mean(
    given: object,
    choices: Sequence[str],
    *,
    text: str = " (did you mean {!r}?)",
    cutoff: float = 0.6,
    ignore_case: bool = False,
) -> str:
    """``text`` filled with the closest of ``choices`` to ``given`` (``difflib``'s ratio of at
    least ``cutoff``; ``given`` lowercased first with ``ignore_case``), or ``""`` when none is
    close: an error message appends it where it names the unknown value.

    >>> did_you_mean("runname", ("run_name", "tags"))
    " (did you mean 'run_name'?)"
    >>> did_you_mean("Mode", ("mode",), text="did you mean {!r}? ", ignore_case=True)
    "did you mean 'mode'? "
    >>> did_you_mean("xyz", ("run_name",))
    ''
    """
    word = str(given).lower() if ignore_case else str(given)
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return text.format(close[0]) if close else ""


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, looked up without importing it (cheap on every rank).

    >>> installed("numpy"), installed("no_such_package_here")
    (True, False)
    """
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules, a bad parent
        return False


def check_int(name: str, value: object, *, minimum: int = 0, maximum: int | None = None) -> int:
    """``value`` as a Python int, or a ValueError naming it, the rule and the fix.

    >>> check_int("sample_id", 3)
    3
    >>> check_int("sample_id", -1)
    Traceback (most recent call last):
    ...
    ValueError: sample_id (-1) must be >= 0; pass a non-negative integer.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(
            f"{name} ({value!r}) must be an integer, got {type(value).__name__}; "
            f"pass int({name}) if it holds a whole number."
        )
    value = int(value)
    if value < minimum:
        fix = "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"
        raise ValueError(f"{name} ({value}) must be >= {minimum}; pass {fix}.")
    if maximum is not None and value > maximum:
        if maximum == _MAX_U64:  # a seed: any integer works once reduced
            raise ValueError(f"{name} ({value}) must be <= {maximum}; reduce it modulo 2**64.")
        raise ValueError(
            f"{name} ({value}) must be <= {maximum}; pass an integer in {minimum}..{maximum}."
        )
    return value


def check_epoch(value: object, name: str = "epoch") -> int:
    """An epoch that fits the int64 tensors through which samplers and datasets share it
    with their DataLoader workers (``check_int`` with the bound ``MAX_EPOCH``).

    >>> check_epoch(3)
    3
    """
    return check_int(name, value, maximum=MAX_EPOCH)


def check_rank(rank: object, world_size: object, world_name: str = "world_size") -> tuple[int, int]:
    """``(rank, world_size)`` as ints, or a ValueError in the DPA guide's words.

    >>> check_rank(1, 4)
    (1, 4)
    >>> check_rank(4, 4)
    Traceback (most recent call last):
    ...
    ValueError: rank (4) must be < world_size (4); ranks are 0-based, so use 0..3.
    """
    world = check_int(world_name, world_size, minimum=1)
    rank = check_int("rank", rank)
    if rank >= world:
        raise ValueError(
            f"rank ({rank}) must be < {world_name} ({world}); ranks are 0-based, so use "
            f"0..{world - 1}."
        )
    return rank, world
