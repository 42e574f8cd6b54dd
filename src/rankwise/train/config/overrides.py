"""Override strings: ``"field=value"``, the value read as a YAML scalar, as a command line
writes them (``rankwise launch train.py epochs=5 precision=bf16``).

This module parses; which names are fields is the config's to say
(:func:`rankwise.train.config.parse_overrides` passes its field check in).

>>> parse_assignments(["epochs=5", "precision=bf16", "grad_clip_norm=null"])
{'epochs': 5, 'precision': 'bf16', 'grad_clip_norm': None}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import yaml


def parse_assignments(
    overrides: Iterable[str] | str, check_name: Callable[[str], None] = lambda name: None
) -> dict[str, Any]:
    """``["epochs=5", "resume=auto"]`` -> ``{"epochs": 5, "resume": "auto"}`` (YAML scalars);
    ``check_name`` refuses a name before its value is read."""
    if isinstance(overrides, str):  # one override, not a sequence of characters
        overrides = [overrides]
    parsed: dict[str, Any] = {}
    for item in overrides:
        if not isinstance(item, str) or "=" not in item:
            raise ValueError(f"override {item!r} must be a 'field=value' string, e.g. 'epochs=5'.")
        name, _, text = item.partition("=")
        name = name.strip()
        check_name(name)
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"override {item!r}: {text!r} is not a YAML scalar ({exc}).") from exc
        if isinstance(value, dict | list):
            raise ValueError(
                f"override {item!r} must set a single value, got a {type(value).__name__}; "
                "quote the value if it is a string."
            )
        parsed[name] = value
    return parsed
