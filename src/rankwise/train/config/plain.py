"""Option dicts as a config file holds them: plain YAML values, credentials never read back.

The storage options and the trackers' options share these two rules: only what YAML holds
(:func:`check_yaml_values`), and no ``"***"`` where a credential was redacted from a saved
config (:func:`refuse_redacted`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rankwise.storage import REDACTED
from rankwise.train.config.rules import fail

PLAIN_OPTION = (str, int, float, bool, type(None))


def check_yaml_values(name: str, item: Any, where: str) -> None:
    """Refuse anything in ``item`` (nested) but what YAML holds: string keys; strings,
    numbers, booleans, None, lists and dicts. ``where`` names the place in errors.

    >>> check_yaml_values("logger_options", {"tags": ["a", 1, None]}, "wandb")
    """
    if isinstance(item, Mapping):
        for key, inner in item.items():
            if not isinstance(key, str):
                fail(name, where, f"has a key {key!r}; option names are strings")
            check_yaml_values(name, inner, f"{where}[{key!r}]")
    elif isinstance(item, list | tuple):
        for i, inner in enumerate(item):
            check_yaml_values(name, inner, f"{where}[{i}]")
    elif not isinstance(item, PLAIN_OPTION):
        # the type only: the value may be a credential
        fail(
            name,
            where,
            f"holds a {type(item).__name__}; options are plain values (strings, numbers, "
            "booleans, None, lists, dicts) so a config stays a YAML file",
        )


def refuse_redacted(name: str, options: Mapping[str, Any], elsewhere: str) -> None:
    """Refuse the first ``"***"`` in ``options`` (nested), naming where it is: a config read
    back from a saved one (``to_yaml``, a checkpoint's copy) has its credentials redacted.

    >>> try:
    ...     refuse_redacted("logger_options['wandb']", {"api_key": "***"}, "WANDB_API_KEY")
    ... except ValueError as exc:
    ...     print(str(exc)[:60])
    DistributedTrainingConfig.logger_options['wandb']['api_key']
    """
    for key, item in options.items():
        where = f"{name}[{key!r}]"
        if isinstance(item, Mapping):
            refuse_redacted(where, item, elsewhere)
        elif item == REDACTED:
            field = name.partition("[")[0]
            raise ValueError(
                f"DistributedTrainingConfig.{where} is {REDACTED!r}: a saved config (to_yaml, "
                f"a checkpoint's copy) holds {REDACTED!r} in place of each credential, never "
                f"the credential. Put the real value there (in the file, or an override "
                f"{field}=...), or leave {key!r} out and let {elsewhere} supply it."
            )
