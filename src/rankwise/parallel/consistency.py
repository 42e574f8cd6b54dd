"""Start-up consistency: the ranks agree on their config, model and data, or stop and say why.

Ranks that load a different config file, build a different model or read a different number
of samples do not fail at once: they deadlock in a collective, or train on silently wrong
data. :func:`check_consistent` hashes each named field on every rank (sha256 of a canonical
JSON form) and all-gathers one 32-byte digest; only when the digests differ does it gather
the fields themselves, to raise :class:`InconsistentRanksError` on every rank with the field,
the ranks and their values::

    rp.check_consistent({
        "config": dataclasses.asdict(config),
        "model": rp.model_signature(model),
        "dataset_length": len(dataset),
    })
    # InconsistentRanksError: dataset_length differs: ranks 0,1 have 1797, rank 2 has 1796;
    # every rank must load the same data
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

import rankwise.distributed as rd
from rankwise.parallel.common import unwrap_model

# The fix for the fields a trainer checks; any other field gets the generic one.
HINTS = {
    "config": "every rank must use the same config (the same file and the same overrides)",
    "model": "build the same model on every rank (the same code, config and dtype)",
    "dataset_length": "every rank must load the same data",
}
_GENERIC_HINT = "every rank must pass the same value"
_SHORT = 60  # values up to this many characters are shown; longer ones by their digest
_SHIPPED = 100_000  # longer canonical forms are not gathered for the error message
_MISSING = "<missing>"


class InconsistentRanksError(ValueError):
    """The ranks disagree on something they must share; raised on every rank alike."""


def check_consistent(fields: Mapping[str, Any], *, hints: Mapping[str, str] | None = None) -> None:
    """Stop on every rank unless every rank passed equal ``fields``; identity in a world of one.

    Values may be JSON-like (dicts, lists, str, numbers, bools, None), dataclasses, enums,
    numpy / torch scalars and arrays, paths and dtypes. Dict key order does not matter. One
    all-gather of a digest when all agree; a second one, of the values, only to explain a
    mismatch. Every rank must call it (a collective). ``hints`` adds the fix for your own
    field names (``HINTS`` has the trainer's).

    >>> check_consistent({"dataset_length": 1797, "config": {"lr": 0.1}})  # world of one
    """
    canonical = _canonical_fields(fields)
    digests = {name: _sha256(text) for name, text in canonical.items()}
    if not rd.has_group() or rd.get_world_size() == 1:
        return
    world = rd.get_world_size()
    overall = bytearray(_sha256_bytes(json.dumps(sorted(digests.items()))))
    local = torch.frombuffer(overall, dtype=torch.int64).to(rd.device())
    gathered = rd.all_gather([torch.empty_like(local) for _ in range(world)], local)
    if all(torch.equal(g, gathered[0]) for g in gathered):
        return
    # Every rank saw the same digests, so every rank is here: the second gather cannot hang.
    payload = {
        name: (digests[name], text if len(text) <= _SHIPPED else None)
        for name, text in canonical.items()
    }
    per_rank: list[Any] = rd.all_gather_plain(payload)  # data, never a peer's pickle
    raise InconsistentRanksError(_describe(per_rank, {**HINTS, **(hints or {})}))


def model_signature(model: nn.Module) -> dict[str, str]:
    """Parameter (and buffer) names, shapes and dtypes, the same however ``model`` is wrapped.

    DDP / DataParallel wrappers, ``torch.compile`` and torch's checkpoint wrapper are looked
    through; FSDP2 ``DTensor`` s give their global shape, so a sharded model has the same
    signature on every rank and as the unwrapped model.

    >>> model_signature(nn.Linear(3, 2))
    {'weight': 'float32[2, 3]', 'bias': 'float32[2]'}
    >>> model_signature(nn.LazyLinear(2))  # shapes come with the first forward
    {'weight': 'uninitialized', 'bias': 'uninitialized'}
    """
    inner = unwrap_model(model)
    inner = getattr(inner, "_orig_mod", inner)  # torch.compile's OptimizedModule
    signature: dict[str, str] = {}
    for prefix, named in (("", inner.named_parameters()), ("buffer ", inner.named_buffers())):
        for name, tensor in named:
            clean = name.replace("_checkpoint_wrapped_module.", "")
            if is_lazy(tensor):  # a lazy module's parameter has no shape before its first call
                signature[prefix + clean] = "uninitialized"
                continue
            shape = ", ".join(str(d) for d in tensor.shape)
            signature[prefix + clean] = f"{str(tensor.dtype).removeprefix('torch.')}[{shape}]"
    return signature


def _canonical_fields(fields: Mapping[str, Any]) -> dict[str, str]:
    if not isinstance(fields, Mapping):
        raise ValueError(
            f"check_consistent takes a mapping of field name to value, got "
            f"{type(fields).__name__}; e.g. check_consistent({{'dataset_length': len(data)}})."
        )
    if not fields:
        raise ValueError(
            "check_consistent got no fields: a check of nothing proves nothing. Pass what the "
            "ranks must agree on, e.g. {'config': ..., 'model': model_signature(model)}."
        )
    out = {}
    for name, value in fields.items():
        if not isinstance(name, str):
            raise ValueError(f"check_consistent field names must be str, got {name!r}.")
        out[name] = json.dumps(
            _canonical(value, name), sort_keys=True, separators=(",", ":"), allow_nan=True
        )
    return out


def _canonical(value: Any, field: str) -> Any:
    """A JSON-serialisable form that is equal on two ranks exactly when the values are."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, Mapping):
        return {_key(k, field): _canonical(v, field) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        body = {
            f.name: _canonical(getattr(value, f.name), field) for f in dataclasses.fields(value)
        }
        return {"__type__": type(value).__qualname__, **body}
    if isinstance(value, list | tuple):
        return [_canonical(v, field) for v in value]
    if isinstance(value, set | frozenset):
        items = [_canonical(v, field) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    if hasattr(value, "tolist"):  # numpy and torch scalars and arrays
        return value.tolist()
    text = repr(value) if not isinstance(value, torch.dtype | torch.device) else str(value)
    if " at 0x" in text:
        raise ValueError(
            f"check_consistent cannot compare field {field!r}: its value {text} is "
            f"identified by a memory address, which differs on every rank. Pass plain values "
            "(a dict of its settings, a length, model_signature(model))."
        )
    return text


def _key(key: Any, field: str) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool | int | float | enum.Enum):
        return str(key)
    raise ValueError(f"check_consistent field {field!r}: dict key {key!r} must be a str or number.")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _sha256_bytes(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def _describe(per_rank: list[dict[str, tuple[str, str | None]]], hints: Mapping[str, str]) -> str:
    names = list(per_rank[0]) + sorted({n for p in per_rank for n in p} - set(per_rank[0]))
    lines = []
    for name in names:
        values = [p.get(name, (_MISSING, None)) for p in per_rank]
        groups: dict[str, list[int]] = {}
        for rank, (digest, _) in enumerate(values):
            groups.setdefault(digest, []).append(rank)
        if len(groups) > 1:
            ordered = sorted(groups.values(), key=lambda g: (-len(g), g[0]))
            lines.append(_field_line(name, ordered, values, hints.get(name, _GENERIC_HINT)))
    if len(lines) == 1:
        return lines[0]
    return f"the ranks disagree on {len(lines)} fields:\n  " + "\n  ".join(lines)


def _field_line(
    name: str,
    groups: list[list[int]],
    values: list[tuple[str, str | None]],
    hint: str,
) -> str:
    shown = []
    for group in groups:
        digest, text = values[group[0]]
        verb = "has" if len(group) == 1 else "have"
        shown.append(f"{_ranks_text(group)} {verb} {_show(digest, text)}")
    line = f"{name} differs: {', '.join(shown)}"
    diff = _dict_difference(values[groups[0][0]][1], values[groups[1][0]][1])
    if diff:
        line += f" ({_ranks_text(groups[1])} vs {_ranks_text(groups[0])}: {diff})"
    return f"{line}; {hint}"


def _show(digest: str, text: str | None) -> str:
    if digest == _MISSING:
        return "no such field"
    if text is not None and len(text) <= _SHORT:
        return text
    return f"a value with sha256 {digest[:12]}"


def _dict_difference(reference: str | None, other: str | None, limit: int = 3) -> str:
    """The first few keys where two JSON objects differ, e.g. ``'0.weight': ... vs ...``."""
    if reference is None or other is None:
        return ""
    ref, oth = json.loads(reference), json.loads(other)
    if not isinstance(ref, dict) or not isinstance(oth, dict):
        return ""
    keys = [k for k in [*ref, *(k for k in oth if k not in ref)] if ref.get(k) != oth.get(k)]
    parts = [
        f"{k!r}: {_short(oth[k]) if k in oth else 'missing'}"
        f" instead of {_short(ref[k]) if k in ref else 'missing'}"
        for k in keys[:limit]
    ]
    more = f", and {len(keys) - limit} more" if len(keys) > limit else ""
    return "; ".join(parts) + more


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= _SHORT else text[: _SHORT - 3] + "..."


def _ranks_text(ranks: list[int]) -> str:
    """``rank 2``, ``ranks 0,1``, ``ranks 0-5,7``: runs of three or more as ranges."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    parts = [f"{r[0]}-{r[-1]}" if len(r) >= 3 else ",".join(str(x) for x in r) for r in runs]
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(parts)
