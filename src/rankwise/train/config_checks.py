"""The rules of :class:`~rankwise.train.config.DistributedTrainingConfig`'s fields.

Each check raises ``ValueError`` naming the field, the value, the rule and the fix, e.g.
``DistributedTrainingConfig.epochs (0) must be >= 1; the number of passes over the data``.
Plain Python only (no torch): a config is read and checked without importing the engine.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping
from typing import Any, NoReturn

# torch.compile's keyword arguments (besides the model) and what each takes. Kept as names and
# rules so a config file is checked before torch loads; compile_model passes them on as given.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_COMPILE_KEYS: dict[str, str] = {
    "fullgraph": "True or False (True: raise at a graph break instead of falling back)",
    "dynamic": "True, False or None (None: torch decides after a shape changes)",
    "backend": "a backend name string, e.g. 'inductor' (torch._dynamo.list_backends())",
    "mode": "None or one of " + ", ".join(repr(m) for m in COMPILE_MODES),
    "options": "a dict of inductor settings with string keys, e.g. {'triton.cudagraphs': False}",
    "disable": "True or False (True: run eagerly, e.g. to compare)",
}


def fail(name: str, value: Any, rule: str) -> NoReturn:
    raise ValueError(f"DistributedTrainingConfig.{name} ({value!r}) {rule}.")


def check_int(name: str, value: Any, low: int, hint: str) -> None:
    rule = int_rule(value, low, hint)
    if rule is not None:
        fail(name, value, rule)


def int_rule(value: Any, low: int, hint: str) -> str | None:
    """What is wrong with ``value`` as an integer >= ``low`` (None: nothing)."""
    if isinstance(value, bool) or not isinstance(value, int):
        whole = isinstance(value, float) and value.is_integer()
        fix = f"pass {int(value)}" if whole else hint
        return f"must be an integer >= {low}, got {type(value).__name__}; {fix}"
    if value < low:
        return f"must be >= {low}; {hint}"
    return None


def check_path(name: str, value: Any, hint: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        fail(name, value, f"must be a non-empty path string or None; {hint}")
    return str(value)


def check_split(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        fail(
            "validation_split",
            value,
            "must be a fraction in [0, 1): the share of the training data held out for "
            "validation, e.g. 0.1; 0 holds out nothing",
        )
    return float(value)


def check_clip(value: Any) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        fail(
            "grad_clip_norm",
            value,
            "must be a finite number > 0 (the largest total gradient norm, e.g. 1.0) "
            "or None for no clipping",
        )
    return float(value)


def check_continue_strategy(strategy: str) -> None:
    """Refuse a strategy that cannot train on through a lost rank (``--on-failure continue``).

    >>> check_continue_strategy("ddp")
    """
    if strategy == "fsdp":
        fail(
            "strategy",
            strategy,
            "cannot train on through a lost rank (rankwise launch --on-failure continue): FSDP2 "
            "shards the parameters and the optimizer state over the ranks, so a lost rank takes "
            "its shard with it and the survivors cannot go on without reading a checkpoint. Use "
            "strategy='ddp' (every rank holds the whole model), or launch with --on-failure "
            "restart and checkpoint_dir set (the world restarts from the last checkpoint)",
        )


def check_choice(name: str, value: Any, choices: tuple[str | None, ...]) -> str | None:
    if isinstance(value, str):
        lowered = value.strip().lower()
        # "none" written in YAML or on a command line means None where None is a choice.
        if lowered == "none" and None in choices and "none" not in choices:
            return None
        if lowered in choices:
            return lowered
    elif value is None and None in choices:
        return None
    names = ", ".join(repr(c) for c in choices)
    close = difflib.get_close_matches(str(value).lower(), [str(c) for c in choices], n=1)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    fail(name, value, f"must be one of {names}{guess}")


def check_compile_options(value: Any) -> dict[str, Any]:
    """``compile_options`` as a plain dict of torch.compile keyword arguments.

    >>> check_compile_options({"mode": "max-autotune", "fullgraph": True})
    {'mode': 'max-autotune', 'fullgraph': True}
    """
    name = "compile_options"
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        fail(
            name, value, "must be a dict of torch.compile arguments, e.g. {'mode': 'max-autotune'}"
        )
    options = dict(value)
    for key, item in options.items():
        if key not in _COMPILE_KEYS:
            close = difflib.get_close_matches(str(key), list(_COMPILE_KEYS), n=1)
            guess = f"did you mean {close[0]!r}? " if close else ""
            keys = ", ".join(repr(k) for k in _COMPILE_KEYS)
            fail(name, value, f"has an unknown key {key!r}; {guess}the keys are {keys}")
        if not _compile_value_ok(key, item):
            fail(name, value, f"has {key}={item!r}; {key} must be {_COMPILE_KEYS[key]}")
    if options.get("mode") is not None and options.get("options") is not None:
        fail(
            name,
            value,
            "sets both 'mode' and 'options', which torch.compile refuses; keep one (a mode "
            "is a preset of options)",
        )
    return options


def _compile_value_ok(key: str, item: Any) -> bool:
    if key in ("fullgraph", "disable"):
        return isinstance(item, bool)
    if key == "dynamic":
        return item is None or isinstance(item, bool)
    if key == "backend":
        return isinstance(item, str) and bool(item.strip())
    if key == "mode":
        return item is None or item in COMPILE_MODES
    return item is None or (isinstance(item, Mapping) and all(isinstance(k, str) for k in item))
