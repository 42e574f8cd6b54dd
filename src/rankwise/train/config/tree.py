"""``ConfigTree``: a YAML file of nested settings, read with attribute access.

``DistributedTrainingConfig`` holds the trainer's own fields; a training script usually also
has settings of its own (the model's sizes, the data's paths) that only it knows. A
``ConfigTree`` holds those: nested mappings read as attributes (``config.model.latent_dim``),
and a missing key is an error that names its full path and the keys that are there.

>>> config = ConfigTree({"model": {"name": "vae", "latent_dim": 16}})
>>> config.model.latent_dim, config["model"]["name"], config.model.get("beta", 1.0)
(16, 'vae', 1.0)
>>> config.model.input_dim
Traceback (most recent call last):
...
rankwise.train.config.tree.ConfigKeyError: config.model.input_dim is not set (config.model has latent_dim, name); add it to the YAML file under model:, or set config.model.input_dim = ...
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from rankwise.validation import did_you_mean


class ConfigKeyError(KeyError, AttributeError):
    """A key a :class:`ConfigTree` does not have: both a ``KeyError`` (``config["x"]``) and an
    ``AttributeError`` (``config.x``; so ``getattr(config, "x", default)`` and ``hasattr``
    work)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""  # KeyError would quote the message


class ConfigTree:
    """Nested settings with attribute access; mappings inside become ``ConfigTree`` s too.

    ``ConfigTree.from_file("config.yaml")`` reads a YAML mapping (``yaml.safe_load``);
    ``ConfigTree(dict)`` wraps one in memory. ``tree.key`` / ``tree["key"]`` read,
    ``tree.get("key", default)`` reads with a default, ``"key" in tree`` tests,
    ``tree.key = value`` sets, ``tree.to_dict()`` gives plain dicts back. It pickles (it can
    travel to ``mp.spawn``'s processes).
    """

    def __init__(self, data: Mapping[str, Any] | None = None, *, path: str = "config") -> None:
        if data is not None and not isinstance(data, Mapping):
            raise TypeError(
                f"{path} must be a mapping of setting names to values, got "
                f"{type(data).__name__}; pass a dict, or read a YAML file with "
                "ConfigTree.from_file(path)."
            )
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_data", {})
        for key, value in (data or {}).items():
            self[key] = value

    @classmethod
    def from_file(cls, path: str | Path) -> ConfigTree:
        """Read a YAML file holding a mapping (an empty file gives an empty tree)."""
        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(
                f"config file {str(path)!r} not found (looked in {file.resolve().parent}); "
                "pass the path of a YAML file, e.g. Config.from_file('config.yaml')."
            )
        try:
            data = yaml.safe_load(file.read_text())
        except yaml.YAMLError as exc:
            raise ValueError(f"config file {str(path)!r} is not valid YAML: {exc}") from exc
        if data is not None and not isinstance(data, Mapping):
            raise ValueError(
                f"config file {str(path)!r} holds a {type(data).__name__}, not a mapping; "
                "write `key: value` lines at the top level (e.g. `model:` with its settings)."
            )
        return cls(data)

    # -- reading ------------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy / pickle probe dunders: not settings
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, key: str) -> Any:
        data = self._data
        if key in data:
            return data[key]
        raise ConfigKeyError(self._missing(key))

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def keys(self) -> Any:
        return self._data.keys()

    def items(self) -> Any:
        return self._data.items()

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts and lists, as the YAML file would hold them."""
        return {key: _plain(value) for key, value in self._data.items()}

    # -- writing ------------------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __setitem__(self, key: str, value: Any) -> None:
        if key in _RESERVED:
            # config.keys would silently be the method, never the setting: refuse the name.
            raise ValueError(
                f"{self._path}.{key}: the key {key!r} clashes with ConfigTree's own "
                f"{key!r} ({', '.join(sorted(k for k in _RESERVED if k[0] != '_'))} are taken), so {self._path}.{key} "
                f"would not read it; rename it in the YAML file, e.g. to {key + '_'!r}."
            )
        self._data[key] = _tree(value, f"{self._path}.{key}")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ConfigTree):
            return self.to_dict() == other.to_dict()
        return isinstance(other, Mapping) and self.to_dict() == dict(other)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"ConfigTree({self.to_dict()!r})"

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *(k for k in self._data if isinstance(k, str))})

    def _missing(self, key: str) -> str:
        known = sorted(str(k) for k in self._data)
        where = f"{self._path} has {', '.join(known)}" if known else f"{self._path} is empty"
        hint = did_you_mean(key, known, text=" Did you mean {!r}?", cutoff=0.8)
        section = self._path.partition(".")[2]
        under = f" under {section}:" if section else ""
        return (
            f"{self._path}.{key} is not set ({where}); add it to the YAML file{under}, "
            f"or set {self._path}.{key} = ...{hint}"
        )


# Names that attribute access finds on the class before any setting (methods, internals).
_RESERVED = frozenset(n for n in dir(ConfigTree) if not n.startswith("__")) | {"_path", "_data"}


def _tree(value: Any, path: str) -> Any:
    if isinstance(value, ConfigTree):
        return ConfigTree(value.to_dict(), path=path)
    if isinstance(value, Mapping):
        return ConfigTree(value, path=path)
    if isinstance(value, list):
        return [_tree(v, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, ConfigTree):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
