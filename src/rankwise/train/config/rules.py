"""The generic rules of :class:`~rankwise.train.config.DistributedTrainingConfig`'s fields,
with the tables of the fields each guards: integers, booleans, paths, choices, numbers.

Every message has one shape, ``DistributedTrainingConfig.<field> (<value>) <rule>.``, where
the rule says what is wanted and the fix (:func:`fail`):

>>> try:
...     check_int("epochs", 0, 1, "the number of passes over the data, e.g. 10")
... except ValueError as exc:
...     print(exc)
DistributedTrainingConfig.epochs (0) must be >= 1; the number of passes over the data, e.g. 10.
"""

from __future__ import annotations

import math
import os
from typing import Any, NoReturn

from rankwise.validation import did_you_mean

# The choices of each string field. Precision names are rankwise.parallel.Precision's modes,
# compression names DDPConfig's; they are repeated here so that a config can be read and checked
# without importing the engine.
CHOICES: dict[str, tuple[str | None, ...]] = {
    "precision": ("fp32", "bf16", "fp16"),
    "lr_scaling": ("none", "linear"),
    "scheduler_interval": ("step", "epoch"),
    "strategy": ("ddp", "fsdp", "none"),
    "compression": (None, "fp16", "bf16", "powersgd"),
}

# Integer fields: (smallest allowed value, what the value means / how to turn it off).
INTS: dict[str, tuple[int, str]] = {
    "epochs": (1, "the number of passes over the data, e.g. 10"),
    "batch_size": (1, "samples per rank per micro-batch, e.g. 32"),
    "seed": (0, "any non-negative integer, e.g. 42"),
    "log_every_n_batches": (0, "0 turns step lines off"),
    "checkpoint_every_n_epochs": (0, "0 turns epoch checkpoints off"),
    "checkpoint_every_n_steps": (0, "counted in optimizer steps; 0 turns them off"),
    "grad_accum_steps": (1, "1 means no accumulation"),
    "num_workers": (0, "DataLoader worker processes per rank; 0 loads in the main process"),
}
OPTIONAL_INTS: dict[str, tuple[int, str]] = {
    "keep_last_checkpoints": (1, "e.g. 3, or None to keep every checkpoint"),
    "base_batch_size": (1, "the global batch size the learning rate was tuned for, e.g. 64"),
    "check_sync_every_n_steps": (1, "counted in optimizer steps, e.g. 100, or None for no check"),
    "prefetch_factor": (
        1,
        "batches each loader worker prepares ahead, e.g. 4, or None for torch's default",
    ),
}
BOOLS = (
    "shuffle",
    "verbose",
    "save_on_master_only",
    "gradient_checkpointing",
    "async_checkpoints",
    "compile",
    "pin_memory",
)
OPTIONAL_PATHS: dict[str, str] = {
    "checkpoint_dir": "None turns checkpoints off",
    "resume": "None starts fresh, 'auto' resumes from the newest checkpoint in checkpoint_dir",
    "log_dir": "None turns the CSV and TensorBoard logs off (the trackers in loggers still log)",
}
MAX_SEED = 2**64 - 1  # torch.manual_seed's range


def fail(name: str, value: Any, rule: str) -> NoReturn:
    """Raise the config's ``ValueError`` for field ``name`` holding ``value``."""
    raise ValueError(f"DistributedTrainingConfig.{name} ({value!r}) {rule}.")


def check_int(name: str, value: Any, low: int, hint: str) -> None:
    """Refuse ``value`` unless it is an integer >= ``low`` (``hint``: what it means)."""
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
    """``value`` as a path string, or None (a ``PathLike`` becomes its string)."""
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        fail(name, value, f"must be a non-empty path string or None; {hint}")
    return str(value)


def check_validation_split(value: Any) -> float:
    """``validation_split`` as a float in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        fail(
            "validation_split",
            value,
            "must be a fraction in [0, 1): the share of the training data held out for "
            "validation, e.g. 0.1; 0 holds out nothing",
        )
    return float(value)


def positive_number(value: Any) -> bool:
    """Whether ``value`` is a finite int or float > 0 (a bool is not a number here)."""
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value > 0
    )


def check_clip(value: Any) -> float | None:
    """``grad_clip_norm`` as a float > 0, or None."""
    if value is None:
        return None
    if not positive_number(value):
        fail(
            "grad_clip_norm",
            value,
            "must be a finite number > 0 (the largest total gradient norm, e.g. 1.0) "
            "or None for no clipping",
        )
    return float(value)


def check_final_wait(value: Any) -> float:
    """``checkpoint_final_wait_s``: a finite number of seconds > 0.

    >>> check_final_wait(600)
    600.0
    """
    if not positive_number(value):
        fail(
            "checkpoint_final_wait_s",
            value,
            "must be a finite number of seconds > 0 (how long the end of fit waits for the "
            "last background checkpoint write, e.g. 600)",
        )
    return float(value)


def check_choice(name: str, value: Any, choices: tuple[str | None, ...]) -> str | None:
    """``value`` as one of ``choices``, lower case (``"none"`` is None where None is one)."""
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
    fail(
        name,
        value,
        f"must be one of {names}{did_you_mean(value, [str(c) for c in choices], ignore_case=True)}",
    )


def check_fields(config: Any) -> None:
    """Check (and normalise in place) the fields these tables name, in the order ``validate``
    has always checked them: integers, the seed's range, optional integers, booleans, paths,
    ``validation_split``, ``grad_clip_norm``, ``checkpoint_final_wait_s``, the choices."""
    for name, (low, hint) in INTS.items():
        check_int(name, getattr(config, name), low, hint)
    if config.seed > MAX_SEED:
        fail("seed", config.seed, "must be <= 2**64 - 1 (torch's seed range); use seed % 2**64")
    for name, (low, hint) in OPTIONAL_INTS.items():
        if getattr(config, name) is not None:
            check_int(name, getattr(config, name), low, hint)
    for name in BOOLS:
        if not isinstance(getattr(config, name), bool):
            fail(name, getattr(config, name), "must be True or False")
    for name, hint in OPTIONAL_PATHS.items():
        setattr(config, name, check_path(name, getattr(config, name), hint))
    config.validation_split = check_validation_split(config.validation_split)
    config.grad_clip_norm = check_clip(config.grad_clip_norm)
    config.checkpoint_final_wait_s = check_final_wait(config.checkpoint_final_wait_s)
    for name, choices in CHOICES.items():
        setattr(config, name, check_choice(name, getattr(config, name), choices))
