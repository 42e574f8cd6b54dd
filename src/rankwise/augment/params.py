"""Augmentation parameters: the config, its presets, and the two ways to draw them.

- DPA's rank-aware API, as its guide describes it: :func:`gen_distributed_augmentation_params`
  (one sample, one SHA-256 chain, different on every rank) and
  :func:`stream_distributed_augmentation_chain` (this rank's contiguous range, chunk by chunk).
- The training path, :func:`generate_params`: vectorised over an array of sample ids and keyed
  by ``(base_seed, epoch, sample_id)`` only, so a sample's parameters do not depend on which
  rank draws them, in which batch or order, or how many ranks there are.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from rankwise.augment.seeds import (
    as_sample_ids,
    dpa_digest,
    mix64,
    sample_keys,
    stream_offsets,
    to_unit,
)
from rankwise.data.partition import contiguous_range
from rankwise.validation import check_int, check_rank

# The order of the parameters: the DPA path cuts them from its digest in this order, the
# vectorised path uses the index as the counter-hash stream. Changing it changes every value.
PARAM_NAMES = ("rotation", "brightness", "noise", "scale", "contrast")
# Stream of the per-sample noise seed that apply_augmentation uses (after the five above).
SEED_STREAM = len(PARAM_NAMES)

Range = tuple[float, float]


@dataclasses.dataclass
class AugmentationConfig:
    """Ranges ``(low, high)`` the parameters are drawn from, uniformly; ``low == high`` fixes one.

    rotation is in degrees (positive = counter-clockwise), brightness a factor, noise the
    standard deviation of additive Gaussian noise, scale a zoom factor (> 1 zooms in),
    contrast a factor around each image's mean. ``augmentation_depth`` is the number of SHA-256
    rounds of the DPA seeds (the vectorised path ignores it). Defaults equal the "moderate"
    preset, as in DPA. Every field is checked when it is set, on construction and after, so a
    config is always valid wherever it is used (and the per-sample DPA call need not re-check).

    >>> AugmentationConfig(rotation_range=(-10, 10)).rotation_range
    (-10.0, 10.0)
    >>> AugmentationConfig(scale_range=(0.0, 1.2))
    Traceback (most recent call last):
    ...
    ValueError: scale_range ((0.0, 1.2)) must have low > 0: a scale of 0 collapses the image; use e.g. (0.8, 1.2).
    """

    rotation_range: Range = (-30.0, 30.0)
    brightness_range: Range = (0.8, 1.2)
    noise_range: Range = (0.0, 0.1)
    scale_range: Range = (0.8, 1.2)
    contrast_range: Range = (0.7, 1.3)
    augmentation_depth: int = 10

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _LOW_RULES:
            value = _check_range(name, value)
        elif name == "augmentation_depth":
            value = check_int("augmentation_depth", value, minimum=1)
        super().__setattr__(name, value)

    def validate(self) -> AugmentationConfig:
        """Check every field again (each was checked when set); raise ValueError naming the
        value and the fix. Returns the config."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name))
        return self


def _check_range(field: str, value: Any) -> Range:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(
            f"{field} ({value!r}) must be a (low, high) pair of numbers, e.g. (0.8, 1.2)."
        ) from None
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"{field} ({value!r}) must be finite; use bounded values.")
    if low > high:
        raise ValueError(
            f"{field} ({value!r}) must have low <= high; swap them: ({high:g}, {low:g})."
        )
    rule = _LOW_RULES[field]
    if rule is not None and (low < 0 if rule[0] == ">=" else low <= 0):
        raise ValueError(f"{field} ({(low, high)}) must have low {rule[0]} 0: {rule[1]}.")
    return (low, high)


# Ranges that would make an operation undefined or meaningless, with the reason and a fix.
_LOW_RULES: dict[str, tuple[str, str] | None] = {
    "rotation_range": None,
    "brightness_range": None,
    "noise_range": (">=", "it is a standard deviation; use e.g. (0.0, 0.1)"),
    "scale_range": (">", "a scale of 0 collapses the image; use e.g. (0.8, 1.2)"),
    "contrast_range": (">", "a contrast of 0 flattens the image to its mean; use e.g. (0.7, 1.3)"),
}


_PRESETS: dict[str, dict[str, Any]] = {
    "mild": {
        "rotation_range": (-15.0, 15.0),
        "brightness_range": (0.9, 1.1),
        "noise_range": (0.0, 0.05),
        "scale_range": (0.9, 1.1),
        "contrast_range": (0.85, 1.15),
    },
    "moderate": {
        "rotation_range": (-30.0, 30.0),
        "brightness_range": (0.8, 1.2),
        "noise_range": (0.0, 0.1),
        "scale_range": (0.8, 1.2),
        "contrast_range": (0.7, 1.3),
    },
    "aggressive": {
        "rotation_range": (-45.0, 45.0),
        "brightness_range": (0.7, 1.3),
        "noise_range": (0.0, 0.15),
        "scale_range": (0.7, 1.3),
        "contrast_range": (0.6, 1.4),
    },
}


def get_preset(name: str) -> AugmentationConfig:
    """A new :class:`AugmentationConfig` for "mild", "moderate" or "aggressive".

    Each call builds a fresh object, so changing one never changes the next.

    >>> get_preset("mild").rotation_range
    (-15.0, 15.0)
    >>> get_preset("mild") is get_preset("mild")
    False
    """
    if name not in _PRESETS:
        raise ValueError(
            f"unknown preset {name!r}; valid presets are {', '.join(map(repr, _PRESETS))}."
        )
    return AugmentationConfig(**_PRESETS[name])


def resolve_config(config: AugmentationConfig | None) -> AugmentationConfig:
    """``config``, or the default config for None; anything else is a ValueError."""
    if config is None:
        return AugmentationConfig()
    if not isinstance(config, AugmentationConfig):
        raise ValueError(
            f"config must be an AugmentationConfig or None, got {type(config).__name__}; "
            "build one with AugmentationConfig(...) or get_preset(name)."
        )
    return config  # valid: every field is checked when it is set


# ------------------------------------------------------------------------- DPA: per sample


def gen_distributed_augmentation_params(
    sample_id: int,
    rank: int,
    config: AugmentationConfig | None = None,
    base_seed: int = 0,
    world_size: int = 1,
) -> dict[str, Any]:
    """DPA's rank-aware parameters for one sample: deterministic, and different on every rank.

    The values come from the sample's :class:`RankAwareSeedGenerator` digest (see
    :func:`values_from_digest`), in the order rotation, brightness, noise, scale, contrast; no
    random generator is involved, so the global ``random`` state is never touched. The dict
    also carries the digest (``hash``, 64 hex characters) and the ``rank``.

    >>> p = gen_distributed_augmentation_params(42, rank=0, world_size=4)
    >>> sorted(p)
    ['brightness', 'contrast', 'hash', 'noise', 'rank', 'rotation', 'scale']
    >>> p == gen_distributed_augmentation_params(42, rank=0, world_size=4)
    True
    >>> p["rotation"] == gen_distributed_augmentation_params(42, rank=1, world_size=4)["rotation"]
    False
    """
    # The common case (plain non-negative ints) skips the full checks: this call runs once per
    # sample, and the checks cost as much as a third of it. Anything else gets the full checks,
    # which raise the guide's messages.
    if not (
        type(sample_id) is int
        and type(rank) is int
        and type(world_size) is int
        and type(base_seed) is int
        and sample_id >= 0
        and base_seed >= 0
        and 0 <= rank < world_size
    ):
        sample_id = check_int("sample_id", sample_id)
        rank, world_size = check_rank(rank, world_size)
        base_seed = check_int("base_seed", base_seed)
    cfg = _DEFAULT if config is None else resolve_config(config)
    digest = dpa_digest(base_seed, rank, sample_id, cfg.augmentation_depth)
    return _params_from_digest(digest, rank, cfg)


def values_from_digest(digest: bytes, cfg: AugmentationConfig) -> list[float]:
    """The five parameter values a 32-byte DPA digest stands for, each inside its range.

    The digest, read as a big-endian integer, is cut into five 51-bit fields, lowest first;
    field ``k`` is the unit value ``u = field / 2**51`` of parameter ``PARAM_NAMES[k]``, which
    becomes ``low + (high - low) * u``. Five fields of 51 bits fit in 256, so one digest gives
    every value without seeding a random generator (seeding Python's ``random`` with a 256-bit
    integer costs more than several SHA-256 rounds).

    >>> cfg = AugmentationConfig(rotation_range=(0.0, 2.0))
    >>> values_from_digest(bytes(31) + bytes([1]), cfg)[0] == 2.0 * 2**-51
    True
    """
    bits = int.from_bytes(digest, "big")
    values = []
    for low, high in (
        cfg.rotation_range,
        cfg.brightness_range,
        cfg.noise_range,
        cfg.scale_range,
        cfg.contrast_range,
    ):
        # u < 1, but low + (high - low) * u may round up to high; high is a promise, so clamp.
        value = low + (high - low) * ((bits & _MASK51) * _UNIT51)
        values.append(value if value < high else high)
        bits >>= 51
    return values


_MASK51 = (1 << 51) - 1
_UNIT51 = 2.0**-51


def _params_from_digest(digest: bytes, rank: int, cfg: AugmentationConfig) -> dict[str, Any]:
    rotation, brightness, noise, scale, contrast = values_from_digest(digest, cfg)
    return {
        "rotation": rotation,
        "brightness": brightness,
        "noise": noise,
        "scale": scale,
        "contrast": contrast,
        "hash": digest.hex(),
        "rank": rank,
    }


def stream_distributed_augmentation_chain(
    num_samples: int,
    rank: int,
    world_size: int,
    config: AugmentationConfig | None = None,
    chunk_size: int = 1000,
    base_seed: int = 0,
) -> Iterator[dict[str, Any]]:
    """Yield DPA parameters for each sample of ``rank``'s contiguous range, in id order.

    The range is the DPA split (:func:`rankwise.data.contiguous_range`: 1003 samples over 4
    ranks gives 251, 251, 251, 250). Parameters are computed ``chunk_size`` at a time, so
    memory stays flat however large ``num_samples`` is. Each dict is
    :func:`gen_distributed_augmentation_params`'s plus the ``sample_id``. Arguments are checked
    when the function is called, not at the first ``next()``.

    >>> stream = stream_distributed_augmentation_chain(1003, rank=3, world_size=4)
    >>> first = next(stream)
    >>> first["sample_id"], sum(1 for _ in stream) + 1
    (753, 250)
    """
    num_samples = check_int("num_samples", num_samples)
    rank, world_size = check_rank(rank, world_size)
    chunk_size = check_int("chunk_size", chunk_size, minimum=1)
    base_seed = check_int("base_seed", base_seed)
    cfg = resolve_config(config)
    start, end = contiguous_range(num_samples, world_size, rank)
    return _stream(base_seed, cfg, rank, start, end, chunk_size)


def _stream(
    base_seed: int,
    cfg: AugmentationConfig,
    rank: int,
    start: int,
    end: int,
    chunk_size: int,
) -> Iterator[dict[str, Any]]:
    depth = cfg.augmentation_depth
    for chunk_start in range(start, end, chunk_size):
        chunk = [
            {
                **_params_from_digest(dpa_digest(base_seed, rank, sample_id, depth), rank, cfg),
                "sample_id": sample_id,
            }
            for sample_id in range(chunk_start, min(chunk_start + chunk_size, end))
        ]
        yield from chunk


# ------------------------------------------------------------------ training path: vectorised


def generate_params(
    sample_ids: Any,
    *,
    epoch: int = 0,
    base_seed: int = 0,
    config: AugmentationConfig | None = None,
) -> dict[str, npt.NDArray[Any]]:
    """Parameters for many samples at once, keyed by ``(base_seed, epoch, sample_id)`` only.

    Returns float64 arrays ``rotation``, ``brightness``, ``noise``, ``scale`` and ``contrast``
    shaped like ``sample_ids``, each inside its config range, plus ``seed`` (uint64), the
    sample's noise seed for :func:`~rankwise.augment.apply_augmentation`. A sample's values do
    not depend on the other ids in the call, their order, the rank or the world size; another
    epoch gives other values. ``config.augmentation_depth`` plays no part here.

    >>> a = generate_params(np.arange(8), epoch=1)
    >>> b = generate_params(np.array([5, 2]), epoch=1)     # another batch, another order
    >>> bool(a["rotation"][5] == b["rotation"][0] and a["scale"][2] == b["scale"][1])
    True
    >>> bool(generate_params([5], epoch=2)["rotation"][0] == a["rotation"][5])
    False
    """
    cfg = _DEFAULT if config is None else resolve_config(config)
    ids = as_sample_ids(sample_ids)
    keys = sample_keys(ids.reshape(-1), base_seed=base_seed, epoch=epoch)
    low = np.array([getattr(cfg, f"{name}_range")[0] for name in PARAM_NAMES])[:, None]
    high = np.array([getattr(cfg, f"{name}_range")[1] for name in PARAM_NAMES])[:, None]
    values = np.empty((len(PARAM_NAMES), keys.size))
    seeds = np.empty(keys.size, dtype=np.uint64)
    # All six words of a block of samples in one (6, block) pass: a few numpy calls per block,
    # not per parameter (what small per-step batches pay for); blocks of 4096 keep the
    # temporaries in cache, which made large calls up to ~2.5x faster than one big pass here.
    for start in range(0, keys.size, _BLOCK):
        block = slice(start, start + _BLOCK)
        with np.errstate(over="ignore"):
            bits = mix64(_OFFSETS[:, None] + keys[None, block])
        # A fixed range returns low exactly; the clamp catches a rounding past ``high``.
        unit = to_unit(bits[: len(PARAM_NAMES)])
        values[:, block] = np.minimum(low + (high - low) * unit, high)
        seeds[block] = bits[SEED_STREAM]
    out: dict[str, npt.NDArray[Any]] = {
        name: row.reshape(ids.shape) for name, row in zip(PARAM_NAMES, values, strict=True)
    }
    out["seed"] = seeds.reshape(ids.shape)
    return out


_BLOCK = 4096
# Read-only: generate_params only reads it, and resolve_config hands out fresh objects.
_DEFAULT = AugmentationConfig()
_OFFSETS = stream_offsets(len(PARAM_NAMES) + 1)
