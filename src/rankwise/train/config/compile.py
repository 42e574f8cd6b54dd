"""The rules of ``compile_options``: torch.compile's keyword arguments (besides the model) and
what each takes, kept as names and rules so a config file is checked before torch loads;
``rankwise.parallel.compile_model`` passes them on as given."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rankwise.train.config.rules import fail
from rankwise.validation import did_you_mean

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_KEYS: dict[str, str] = {
    "fullgraph": "True or False (True: raise at a graph break instead of falling back)",
    "dynamic": "True, False or None (None: torch decides after a shape changes)",
    "backend": "a backend name string, e.g. 'inductor' (torch._dynamo.list_backends())",
    "mode": "None or one of " + ", ".join(repr(m) for m in COMPILE_MODES),
    "options": "a dict of inductor settings with string keys, e.g. {'triton.cudagraphs': False}",
    "disable": "True or False (True: run eagerly, e.g. to compare)",
}


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
        if key not in COMPILE_KEYS:
            guess = did_you_mean(key, list(COMPILE_KEYS), text="did you mean {!r}? ")
            keys = ", ".join(repr(k) for k in COMPILE_KEYS)
            fail(name, value, f"has an unknown key {key!r}; {guess}the keys are {keys}")
        if not compile_value_ok(key, item):
            fail(name, value, f"has {key}={item!r}; {key} must be {COMPILE_KEYS[key]}")
    if options.get("mode") is not None and options.get("options") is not None:
        fail(
            name,
            value,
            "sets both 'mode' and 'options', which torch.compile refuses; keep one (a mode "
            "is a preset of options)",
        )
    return options


def compile_value_ok(key: str, item: Any) -> bool:
    """Whether ``item`` is a value torch.compile's ``key`` takes."""
    if key in ("fullgraph", "disable"):
        return isinstance(item, bool)
    if key == "dynamic":
        return item is None or isinstance(item, bool)
    if key == "backend":
        return isinstance(item, str) and bool(item.strip())
    if key == "mode":
        return item is None or item in COMPILE_MODES
    return item is None or (isinstance(item, Mapping) and all(isinstance(k, str) for k in item))
