"""Apply augmentation parameters to a whole batch of image tensors at once.

:func:`apply_augmentation` takes ``(B, C, H, W)`` floats and one value per image for each
parameter, and runs every operation as a batched tensor op (one ``affine_grid`` +
``grid_sample`` for all rotations and scales), on whatever device the images live on.

The Gaussian noise is generated from a counter hash of each image's seed and each element's
position, also batched: image ``b``'s noise is a function of ``seed[b]`` and ``(C, H, W)`` only,
so it is the same in any batch, on any rank, and (up to float rounding) on CPU and CUDA. A
``torch.Generator`` per image would need a Python loop over the batch; this costs a few more
integer ops per element instead.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rankwise.augment.params import PARAM_NAMES
from rankwise.augment.seeds import GOLDEN_GAMMA, MAX_U64, MIX_MUL1, MIX_MUL2, mix64

# Keys of a DPA parameter dict (or a stream's) that carry no image operation.
_PASSIVE_KEYS = frozenset({"hash", "rank", "sample_id"})
_KNOWN_KEYS = frozenset(PARAM_NAMES) | {"seed"} | _PASSIVE_KEYS


def apply_augmentation(images: torch.Tensor, params: Mapping[str, Any]) -> torch.Tensor:
    """Rotate, scale, brighten, contrast and add noise to ``images`` (B, C, H, W), batched.

    ``params`` maps names to one value per image (numpy arrays, tensors, sequences; a scalar
    applies to every image), as :func:`~rankwise.augment.generate_params` returns them:

    - ``rotation``: degrees, counter-clockwise as displayed; ``scale``: zoom (> 1 zooms in).
      Both about the image centre, bilinear, zeros outside.
    - ``brightness``: ``x * b``; ``contrast``: ``mean + c * (x - mean)``, the mean taken over
      each image's C, H and W.
    - ``noise``: ``x + noise * z``, ``z`` standard normal from the image's ``seed`` (uint64).
      Without ``seed`` the seed is a hash of that image's parameter values, so it is still
      deterministic.

    The operations run in that order. A missing key leaves its operation out, and an image
    whose value is the identity (0, 1, 1, 1, 0) is left bit-for-bit as it was; when nothing
    applies the input tensor itself is returned. Values are not clamped.

    >>> x = torch.rand(4, 3, 8, 8)
    >>> apply_augmentation(x, {"rotation": np.zeros(4), "brightness": 1.0}) is x
    True
    >>> y = apply_augmentation(x, {"brightness": np.array([1.0, 2.0, 1.0, 1.0])})
    >>> torch.equal(y[1], 2 * x[1]), torch.equal(y[0], x[0])
    (True, True)
    """
    _check_images(images)
    p, seeds = _parse(params, images.shape[0])
    # Half precision on CPU lacks grid_sample kernels, and noise needs the mantissa: work in
    # float32 and cast back at the end.
    work = images.float() if images.dtype in (torch.float16, torch.bfloat16) else images
    out = _noise(_tone(_geometry(work, p), p), p, seeds)
    if out is work:
        return images
    return out.to(images.dtype)


def _parse(
    params: Mapping[str, Any], batch: int
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """Per-image float64 values of the known keys (CPU), and the noise seeds if noise is on."""
    unknown = set(params) - _KNOWN_KEYS
    if unknown:
        raise ValueError(
            f"unknown augmentation parameter(s) {sorted(unknown)}; "
            f"valid keys are {sorted(PARAM_NAMES)} plus 'seed'."
        )
    p = {name: _param(params[name], name, batch) for name in PARAM_NAMES if name in params}
    if "scale" in p and bool((p["scale"] <= 0).any()):
        raise ValueError(f"scale must be > 0 for every image, got {p['scale'].tolist()}.")
    if "noise" in p and bool((p["noise"] < 0).any()):
        raise ValueError(f"noise must be >= 0 (a std), got {p['noise'].tolist()}.")
    if "noise" not in p:
        return p, None
    if "seed" in params:
        return p, _seeds(params["seed"], batch)
    seeds = _derived_seeds(p)
    _refuse_shared_noise(seeds, p["noise"] > 0)
    return p, seeds


def _geometry(x: torch.Tensor, p: Mapping[str, torch.Tensor]) -> torch.Tensor:
    batch = x.shape[0]
    rotation = p.get("rotation", torch.zeros(batch, dtype=torch.float64))
    scale = p.get("scale", torch.ones(batch, dtype=torch.float64))
    return _where((rotation != 0) | (scale != 1), lambda: _warp(x, rotation, scale), x)


def _tone(x: torch.Tensor, p: Mapping[str, torch.Tensor]) -> torch.Tensor:
    ones = torch.ones(x.shape[0], dtype=torch.float64)
    brightness, contrast = p.get("brightness", ones), p.get("contrast", ones)

    def tone() -> torch.Tensor:
        # mean(b·x) + c·(b·x − mean(b·x)) == (b·c)·x + (1 − c)·b·mean(x): one pass, not three.
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        shift = _per_image((1 - contrast) * brightness, x) * mean
        return torch.addcmul(shift, x, _per_image(brightness * contrast, x))

    return _where((brightness != 1) | (contrast != 1), tone, x)


def _noise(
    x: torch.Tensor, p: Mapping[str, torch.Tensor], seeds: torch.Tensor | None
) -> torch.Tensor:
    if seeds is None:
        return x
    std = p["noise"]

    def noisy() -> torch.Tensor:
        # Into the noise's own buffer: a second image-sized allocation costs more than the add.
        z = gaussian_noise(seeds, x.shape[1:], x)
        return z.mul_(_per_image(std, x)).add_(x)

    return _where(std > 0, noisy, x)


def _check_images(images: Any) -> None:
    if not isinstance(images, torch.Tensor):
        raise ValueError(f"images must be a torch.Tensor, got {type(images).__name__}.")
    if images.ndim != 4:
        raise ValueError(
            f"images must be a (B, C, H, W) batch, got shape {tuple(images.shape)}; "
            "for one image pass images.unsqueeze(0)."
        )
    if not images.is_floating_point():
        raise ValueError(
            f"images must be floating point, got {images.dtype}; convert with images.float() "
            "(and scale uint8 images to [0, 1] first)."
        )


def _param(value: Any, name: str, batch: int) -> torch.Tensor:
    """One float64 value per image, on the CPU: the masks below then cost no device sync."""
    try:
        if isinstance(value, torch.Tensor):
            t = value.detach().to("cpu", torch.float64)
        else:
            t = torch.from_numpy(np.array(value, dtype=np.float64))
    except (TypeError, ValueError):
        raise ValueError(f"params[{name!r}] must hold numbers, got {value!r}.") from None
    t = _one_per_image(t, name, batch)
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"params[{name!r}] must be finite, got {t.tolist()}.")
    return t


def _per_image(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return values.to(like.device, like.dtype).view(-1, 1, 1, 1)


def _where(
    mask: torch.Tensor, compute: Callable[[], torch.Tensor], current: torch.Tensor
) -> torch.Tensor:
    """``compute()`` where ``mask`` (one bool per image) holds, ``current`` elsewhere.

    Skips the work when no image needs it and the blend when all do, so identity images keep
    their exact values and an all-identity batch costs nothing.
    """
    if not bool(mask.any()):
        return current
    new = compute()
    if bool(mask.all()):
        return new
    return torch.where(mask.to(current.device).view(-1, 1, 1, 1), new, current)


def _warp(images: torch.Tensor, rotation: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Rotate by ``rotation`` degrees and zoom by ``scale`` about the centre, all images at once.

    ``grid_sample`` reads input coordinates at each output pixel, so theta is the inverse
    transform. Coordinates are normalised to [-1, 1] per axis; the H/W factors keep the
    rotation rigid on non-square images.
    """
    height, width = images.shape[-2:]
    rad = torch.deg2rad(rotation)
    cos, sin = torch.cos(rad) / scale, torch.sin(rad) / scale
    theta = torch.zeros(images.shape[0], 2, 3, dtype=torch.float64)
    theta[:, 0, 0] = cos
    theta[:, 0, 1] = -sin * (height / width)
    theta[:, 1, 0] = sin * (width / height)
    theta[:, 1, 1] = cos
    grid = affine_grid(theta.to(images.device, images.dtype), height, width)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def affine_grid(theta: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``F.affine_grid(theta, (B, C, height, width), align_corners=False)``, by broadcasting.

    Same grid (to float rounding; tested), built from two broadcast multiply-adds per axis
    instead of a batched matmul with an inner size of 3, which is 10-20x slower on CPU.
    """
    batch = theta.shape[0]
    dtype, device = theta.dtype, theta.device
    # Pixel centres in normalised coordinates (align_corners=False): (2i + 1) / n − 1.
    xs = torch.arange(width, dtype=dtype, device=device).mul_(2.0 / width)
    xs = xs.add_(1.0 / width - 1.0).view(1, 1, width)
    ys = torch.arange(height, dtype=dtype, device=device).mul_(2.0 / height)
    ys = ys.add_(1.0 / height - 1.0).view(1, height, 1)
    grid = torch.empty(batch, height, width, 2, dtype=dtype, device=device)
    for axis in range(2):
        a, b, c = (theta[:, axis, k].view(batch, 1, 1) for k in range(3))
        torch.add(a * xs + c, b * ys, out=grid[..., axis])
    return grid


# ---------------------------------------------------------------------------- seeded noise


def _signed(word: int) -> int:
    """A uint64 constant as the int64 with the same bits (torch has no wrapping uint64 math)."""
    return word - (1 << 64) if word >= 1 << 63 else word


_GAMMA_S, _MUL1_S, _MUL2_S = _signed(GOLDEN_GAMMA), _signed(MIX_MUL1), _signed(MIX_MUL2)


def _mix64_torch_(z: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`rankwise.augment.seeds.mix64` on an int64 tensor, in place (same bits; tested).

    int64 multiplication wraps like uint64's; ``>>`` is arithmetic on int64, so each shift is
    masked to make it logical. In place with one scratch buffer: the noise for a batch is
    millions of words, and a fresh tensor per step costs more than the arithmetic.
    """
    scratch = torch.empty_like(z) if scratch is None else scratch
    for shift, mul in ((30, _MUL1_S), (27, _MUL2_S), (31, None)):
        torch.bitwise_right_shift(z, shift, out=scratch)
        z ^= scratch.bitwise_and_((1 << (64 - shift)) - 1)
        if mul is not None:
            z *= mul
    return z


def gaussian_noise(
    seeds: torch.Tensor, shape: tuple[int, ...] | torch.Size, like: torch.Tensor
) -> torch.Tensor:
    """Standard normal noise of ``(B, *shape)``, row ``b`` a pure function of ``seeds[b]``.

    Element pair ``k`` of image ``b`` comes from ``mix64(seed[b] + (k + 1)·γ)`` (SplitMix64's
    sequence from that seed): its two 32-bit halves become two float32 uniforms, and
    Box-Muller turns them into a cosine and a sine normal (the cosines fill the first half of
    the image's elements, the sines the second). float32 uniforms cut the tails at about 5.9
    standard deviations. Runs on ``like``'s device, returns ``like``'s dtype.

    >>> s = torch.tensor([7, 9])
    >>> a = gaussian_noise(s, (1, 4, 4), torch.zeros(1))
    >>> torch.equal(a[1], gaussian_noise(s[1:], (1, 4, 4), torch.zeros(1))[0])
    True
    """
    count = math.prod(shape)
    pairs = (count + 1) // 2
    batch, device = seeds.shape[0], like.device
    seeds = seeds.to(device, torch.int64)
    counter = torch.arange(1, pairs + 1, dtype=torch.int64, device=device).mul_(_GAMMA_S)
    normals = torch.empty(batch, 2, pairs, dtype=torch.float32, device=device)
    # On CPU, a block of images at a time with reused buffers of about 1 MiB: the dozen integer
    # passes then run in cache instead of faulting in fresh pages for each (about 1.5x faster).
    # A GPU takes the batch in one block.
    rows = batch if device.type != "cpu" else max(1, min(batch, (1 << 17) // pairs))
    words = torch.empty(rows, pairs, dtype=torch.int64, device=device)
    scratch = torch.empty_like(words)
    u1 = torch.empty(rows, pairs, dtype=torch.float32, device=device)
    angle = torch.empty_like(u1)
    for start in range(0, batch, rows):
        n = min(rows, batch - start)
        z = torch.add(counter, seeds[start : start + n].view(-1, 1), out=words[:n])
        _mix64_torch_(z, scratch[:n])
        # The two 32-bit halves of each word, read in place as int32: u1 = 1/2 − hi·2⁻³² in
        # (0, 1] (clamped off 0 where float32 rounds it there, so the log stays finite) and
        # the angle lo·2π·2⁻³² in [−π, π).
        halves = z.view(torch.int32).view(n, pairs, 2)
        radius = u1[:n].copy_(halves[..., _HI]).mul_(-(2.0**-32)).add_(0.5)
        radius.clamp_min_(2.0**-25).log_().mul_(-2.0).sqrt_()
        theta = angle[:n].copy_(halves[..., _LO]).mul_(2.0**-32 * 2 * math.pi)
        block = normals[start : start + n]
        torch.cos(theta, out=block[:, 0])
        torch.sin(theta, out=block[:, 1])
        block.mul_(radius.unsqueeze(1))
    flat = normals.view(batch, 2 * pairs)
    return flat[:, :count].reshape(-1, *shape).to(like.dtype)


# Which int32 of an int64 holds its low / high half on this machine.
_LO, _HI = (0, 1) if sys.byteorder == "little" else (1, 0)


def _seeds(value: Any, batch: int) -> torch.Tensor:
    """Per-image seeds as int64 bits (uint64 seeds keep their bit pattern)."""
    if isinstance(value, torch.Tensor):
        seeds = value.detach().cpu()
        if seeds.dtype == torch.uint64:
            seeds = seeds.view(torch.int64)
        elif seeds.dtype.is_floating_point or seeds.dtype == torch.bool:
            raise ValueError(f"params['seed'] must hold integers, got {seeds.dtype}.")
        seeds = seeds.to(torch.int64)
    else:
        arr = np.asarray(value)
        if arr.dtype == object or arr.dtype.kind in "iu":
            words = [int(v) & MAX_U64 for v in arr.reshape(-1).tolist()]
            arr = np.array(words, dtype=np.uint64).reshape(arr.shape)
        else:
            raise ValueError(f"params['seed'] must hold integers, got dtype {arr.dtype}.")
        seeds = torch.from_numpy(arr.view(np.int64).copy())
    return _one_per_image(seeds, "seed", batch)


def _one_per_image(t: torch.Tensor, name: str, batch: int) -> torch.Tensor:
    """A scalar broadcast to the batch; anything but one value per image is an error."""
    if t.ndim == 0:
        return t.expand(batch)
    if tuple(t.shape) != (batch,):
        what = "seed" if name == "seed" else "value"
        raise ValueError(
            f"params[{name!r}] has shape {tuple(t.shape)}; give one {what} per image, "
            f"shape ({batch},), or a single number."
        )
    return t


def _refuse_shared_noise(seeds: torch.Tensor, noisy: torch.Tensor) -> None:
    """Seeds derived from parameter values repeat when two images' parameters do (a scalar
    ``noise`` alone, say): those images would get the very same noise field. Say so instead."""
    first_of: dict[int, int] = {}
    for index in torch.nonzero(noisy).flatten().tolist():
        seed = int(seeds[index])
        if seed in first_of:
            raise ValueError(
                f"params has no 'seed', and images {first_of[seed]} and {index} have identical "
                "parameters, so they would get identical noise. Pass one seed per image as "
                "params['seed'] (generate_params returns it; the sample ids will do)."
            )
        first_of[seed] = index


def _derived_seeds(p: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """A seed per image from the bits of its parameter values (when the caller gave none)."""
    acc = np.zeros(len(next(iter(p.values()))), dtype=np.uint64)
    for name in PARAM_NAMES:
        if name in p:
            acc = mix64(acc ^ p[name].contiguous().numpy().view(np.uint64))
    return torch.from_numpy(acc.view(np.int64).copy())
