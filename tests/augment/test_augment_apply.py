"""apply_augmentation: each operation's maths, identity, batching invariance, seeded noise."""

from __future__ import annotations

import math
import random
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rankwise.augment import (
    apply_augmentation,
    gaussian_noise,
    gen_distributed_augmentation_params,
    generate_params,
    get_preset,
)
from rankwise.augment.apply import _mix64_torch_, affine_grid
from rankwise.augment.seeds import GOLDEN_GAMMA, mix64


def ramp(batch: int, height: int, width: int, a: float = 1.0, b: float = 0.0) -> torch.Tensor:
    """Images holding ``a·x + b·y``, with x, y pixel offsets from the centre (y down)."""
    ys = torch.arange(height, dtype=torch.float64) - (height - 1) / 2
    xs = torch.arange(width, dtype=torch.float64) - (width - 1) / 2
    img = a * xs.view(1, -1) + b * ys.view(-1, 1)
    return img.expand(batch, 1, height, width).clone()


def interior(t: torch.Tensor, margin: int) -> torch.Tensor:
    return t[..., margin:-margin, margin:-margin]


# ---------------------------------------------------------------------------- geometry


@pytest.mark.parametrize(("height", "width"), [(21, 21), (17, 29)])
@pytest.mark.parametrize("degrees", [90.0, 30.0, -45.0])
def test_rotation_is_counter_clockwise_and_rigid(height: int, width: int, degrees: float) -> None:
    # Bilinear sampling reproduces a linear image exactly, so the interior of a rotated ramp
    # must equal the ramp evaluated at the inversely rotated coordinates.
    x = ramp(1, height, width, a=1.0, b=0.5)
    out = apply_augmentation(x, {"rotation": [degrees]})
    t = math.radians(degrees)
    # Displayed counter-clockwise with y pointing down: a point p comes from R(-t)·p, i.e.
    # x_in = cos·x − sin·y, y_in = sin·x + cos·y.
    ys = (torch.arange(height, dtype=torch.float64) - (height - 1) / 2).view(-1, 1)
    xs = (torch.arange(width, dtype=torch.float64) - (width - 1) / 2).view(1, -1)
    expected = (math.cos(t) * xs - math.sin(t) * ys) + 0.5 * (math.sin(t) * xs + math.cos(t) * ys)
    torch.testing.assert_close(interior(out[0, 0], 6), interior(expected, 6), atol=1e-4, rtol=0)


def test_rotating_a_dot_90_degrees_moves_it_up() -> None:
    x = torch.zeros(1, 1, 9, 9)
    x[0, 0, 4, 7] = 1.0  # right of the centre
    out = apply_augmentation(x, {"rotation": np.array([90.0])})
    assert (out[0, 0] > 0.99).nonzero().tolist() == [[1, 4]]  # above the centre


def test_scale_zooms_about_the_centre() -> None:
    x = ramp(2, 24, 32, a=1.0, b=-2.0)
    out = apply_augmentation(x, {"scale": np.array([2.0, 0.5])})
    # Zooming in by 2 shows the point at half the distance from the centre: out(p) = x(p / 2).
    torch.testing.assert_close(interior(out[0], 4), interior(x[0] * 0.5, 4), atol=1e-4, rtol=0)
    # Zooming out: out(p) = x(2p) in the middle, zeros where 2p leaves the image.
    mid = (..., slice(7, 17), slice(9, 23))
    torch.testing.assert_close(out[1][mid], (x[1] * 2.0)[mid], atol=1e-4, rtol=0)
    assert float(out[1, 0, 0, 0]) == 0.0


@pytest.mark.parametrize(("height", "width"), [(8, 8), (5, 12)])
def test_affine_grid_matches_torch(height: int, width: int) -> None:
    theta = torch.randn(6, 2, 3, generator=torch.Generator().manual_seed(0))
    ours = affine_grid(theta, height, width)
    ref = F.affine_grid(theta, [6, 1, height, width], align_corners=False)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-6)


# ------------------------------------------------------------------------------- tone


def test_brightness_is_exactly_multiplicative() -> None:
    x = torch.rand(3, 2, 5, 5)
    out = apply_augmentation(x, {"brightness": [0.5, 1.0, 1.5]})
    assert torch.equal(out[0], x[0] * 0.5) and torch.equal(out[1], x[1])
    torch.testing.assert_close(out[2], x[2] * 1.5)


def test_contrast_scales_deviations_around_each_image_mean() -> None:
    x = torch.rand(2, 3, 6, 7, dtype=torch.float64) + torch.tensor([0.0, 5.0]).view(2, 1, 1, 1)
    out = apply_augmentation(x, {"contrast": [0.5, 2.0]})
    for i, c in enumerate((0.5, 2.0)):
        mean = x[i].mean()
        torch.testing.assert_close(out[i].mean(), mean)
        torch.testing.assert_close(out[i] - mean, c * (x[i] - mean))


def test_brightness_then_contrast() -> None:
    x = torch.rand(1, 3, 4, 4, dtype=torch.float64)
    out = apply_augmentation(x, {"brightness": [1.2], "contrast": [0.7]})
    y = x * 1.2
    torch.testing.assert_close(out, y.mean() + 0.7 * (y - y.mean()))


# ------------------------------------------------------------------------------ noise


def numpy_noise(seed: int, count: int) -> np.ndarray:
    """The documented noise construction, written out in numpy uint64 as a reference."""
    pairs = (count + 1) // 2
    with np.errstate(over="ignore"):
        states = np.uint64(seed) + np.arange(1, pairs + 1, dtype=np.uint64) * np.uint64(
            GOLDEN_GAMMA
        )
    halves = mix64(states).view(np.int32).reshape(pairs, 2)  # little-endian: (low, high)
    u1 = np.float32(0.5) - halves[:, 1].astype(np.float32) * np.float32(2.0**-32)
    u1 = np.maximum(u1, np.float32(2.0**-25)).astype(np.float64)
    u2 = halves[:, 0].astype(np.float64) * 2.0**-32
    r = np.sqrt(-2 * np.log(u1))
    return np.concatenate([r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)])[:count]


def test_torch_mix_equals_numpy_mix_on_all_bit_patterns() -> None:
    words = np.random.default_rng(1).integers(0, 2**64, 5000, dtype=np.uint64, endpoint=False)
    words[:4] = [0, 1, 2**63, 2**64 - 1]
    ours = _mix64_torch_(torch.from_numpy(words.view(np.int64).copy())).numpy().view(np.uint64)
    np.testing.assert_array_equal(ours, mix64(words))


@pytest.mark.skipif(sys.byteorder != "little", reason="the reference reads little-endian halves")
def test_noise_matches_the_numpy_reference() -> None:
    seeds = np.array([0, 5, 2**63 + 7, 2**64 - 1], dtype=np.uint64)
    z = gaussian_noise(torch.from_numpy(seeds.view(np.int64).copy()), (3, 5, 7), torch.zeros(1))
    for i, seed in enumerate(seeds):
        ref = numpy_noise(int(seed), 105).reshape(3, 5, 7)
        np.testing.assert_allclose(z[i].numpy(), ref, atol=2e-5)


def test_noise_is_standard_normal_and_independent_across_images() -> None:
    z = gaussian_noise(torch.arange(64), (3, 32, 32), torch.zeros(1, dtype=torch.float64))
    assert z.dtype == torch.float64
    assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1) < 0.01
    assert float(z.abs().max()) < 6.0
    flat = z.view(64, -1)
    off = (torch.corrcoef(flat) - torch.eye(64, dtype=torch.float64)).abs()
    # Independent rows of n = 3072: |r| ~ 0.018 (1/sqrt(n)); 0.1 is over 5 sigma.
    assert float(off.max()) < 0.1 and float(off.sum() / (64 * 63)) < 0.02


def test_noise_uses_the_std_and_seed_of_each_image() -> None:
    x = torch.full((3, 2, 8, 8), 0.5)
    params = {"noise": [0.1, 0.1, 0.0], "seed": np.array([7, 7, 9], dtype=np.uint64)}
    out = apply_augmentation(x, params)
    assert torch.equal(out[0], out[1]) and torch.equal(out[2], x[2])
    expected = 0.5 + 0.1 * gaussian_noise(torch.tensor([7]), (2, 8, 8), x)[0]
    torch.testing.assert_close(out[0], expected)
    other = apply_augmentation(x[:1], {"noise": [0.1], "seed": [8]})
    assert not torch.equal(other[0], out[0])


def test_noise_without_seed_is_still_deterministic() -> None:
    x = torch.rand(2, 1, 6, 6)
    params = {"noise": np.array([0.2, 0.2]), "rotation": np.array([1.0, 2.0])}
    a, b = apply_augmentation(x, params), apply_augmentation(x, params)
    assert torch.equal(a, b)
    assert not torch.equal(a[0] - x[0], a[1] - x[1])  # different values -> different noise


# ---------------------------------------------------------------- identity and batching


def test_identity_and_missing_keys_return_the_input() -> None:
    x = torch.rand(4, 3, 8, 8)
    assert apply_augmentation(x, {}) is x
    identity = {
        "rotation": np.zeros(4),
        "scale": np.ones(4),
        "brightness": np.ones(4),
        "contrast": np.ones(4),
        "noise": np.zeros(4),
        "seed": np.arange(4),
    }
    assert apply_augmentation(x, identity) is x


def test_identity_images_stay_bit_exact_in_a_mixed_batch() -> None:
    x = torch.rand(4, 3, 9, 9)
    params = generate_params(np.arange(4), config=get_preset("aggressive"))
    for name, neutral in (
        ("rotation", 0),
        ("scale", 1),
        ("brightness", 1),
        ("contrast", 1),
        ("noise", 0),
    ):
        params[name][[1, 3]] = neutral
    out = apply_augmentation(x, params)
    assert torch.equal(out[1], x[1]) and torch.equal(out[3], x[3])
    assert not torch.equal(out[0], x[0]) and not torch.equal(out[2], x[2])


def test_batch_result_equals_per_image_results_in_any_order() -> None:
    x = torch.rand(16, 3, 12, 10, generator=torch.Generator().manual_seed(3))
    ids = np.arange(100, 116)
    params = generate_params(ids, epoch=2, config=get_preset("aggressive"))
    whole = apply_augmentation(x, params)
    perm = np.random.default_rng(0).permutation(16)
    shuffled = apply_augmentation(
        x[perm], generate_params(ids[perm], epoch=2, config=get_preset("aggressive"))
    )
    torch.testing.assert_close(shuffled, whole[perm], atol=1e-6, rtol=1e-6)
    for i in (0, 7, 15):
        one = apply_augmentation(
            x[i : i + 1], generate_params(ids[i : i + 1], epoch=2, config=get_preset("aggressive"))
        )
        torch.testing.assert_close(one[0], whole[i], atol=1e-6, rtol=1e-6)


def test_param_formats_tensors_lists_scalars_and_dpa_dicts() -> None:
    x = torch.rand(2, 1, 6, 6)
    ref = apply_augmentation(x, {"rotation": np.array([10.0, 10.0]), "brightness": [1.1, 1.1]})
    for params in (
        {"rotation": torch.tensor([10.0, 10.0]), "brightness": torch.tensor([1.1, 1.1])},
        {"rotation": 10.0, "brightness": 1.1},
        {"rotation": [10, 10], "brightness": np.float32(1.1).item()},
    ):
        torch.testing.assert_close(apply_augmentation(x, params), ref)
    dpa = gen_distributed_augmentation_params(3, rank=1, world_size=2)  # hash, rank ignored
    out = apply_augmentation(x[:1], dpa)
    assert out.shape == (1, 1, 6, 6) and torch.equal(out, apply_augmentation(x[:1], dpa))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_float_dtypes(dtype: torch.dtype) -> None:
    x = torch.rand(3, 2, 8, 8).to(dtype)
    params = generate_params(np.arange(3))
    out = apply_augmentation(x, params)
    assert out.dtype == dtype
    ref = apply_augmentation(x.float(), params)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu() -> None:
    x = torch.rand(8, 3, 16, 16)
    params = generate_params(np.arange(8), config=get_preset("aggressive"))
    out = apply_augmentation(x.cuda(), params)
    assert out.is_cuda
    torch.testing.assert_close(out.cpu(), apply_augmentation(x, params), atol=1e-4, rtol=1e-4)


def test_apply_leaves_global_rngs_alone() -> None:
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    apply_augmentation(torch.ones(4, 3, 8, 8), generate_params(np.arange(4)))
    assert random.getstate() == states[0]
    np.testing.assert_array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2])


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("images", "params", "message"),
    [
        (torch.rand(3, 4, 4), {}, r"\(B, C, H, W\) batch, got shape \(3, 4, 4\).*unsqueeze"),
        (torch.ones(1, 1, 2, 2, dtype=torch.uint8), {}, r"floating point.*images.float\(\)"),
        (np.ones((1, 1, 2, 2)), {}, r"must be a torch.Tensor"),
        (torch.rand(2, 1, 4, 4), {"rotaton": [1, 2]}, r"unknown .*'rotaton'.*valid keys"),
        (torch.rand(2, 1, 4, 4), {"rotation": [1, 2, 3]}, r"shape \(3,\); .*shape \(2,\)"),
        (torch.rand(2, 1, 4, 4), {"rotation": [1, float("nan")]}, r"'rotation'.* finite"),
        (torch.rand(2, 1, 4, 4), {"rotation": ["a", "b"]}, r"'rotation'.* numbers"),
        (torch.rand(2, 1, 4, 4), {"scale": [1.0, 0.0]}, r"scale must be > 0"),
        (torch.rand(2, 1, 4, 4), {"noise": [0.1, -0.1]}, r"noise must be >= 0"),
        (torch.rand(2, 1, 4, 4), {"noise": 0.1, "seed": [0.5, 1.5]}, r"'seed'.* integers"),
        (torch.rand(2, 1, 4, 4), {"noise": 0.1, "seed": [1, 2, 3]}, r"'seed'.* one seed per"),
    ],
)
def test_errors_name_the_problem(images: object, params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        apply_augmentation(images, params)  # type: ignore[arg-type]


def test_gradients_flow_to_the_images() -> None:
    x = torch.rand(4, 3, 8, 8, requires_grad=True)
    apply_augmentation(x, generate_params(np.arange(4))).sum().backward()
    assert x.grad is not None and bool((x.grad != 0).any())


def test_noise_blocks_do_not_show_in_the_result() -> None:
    # 3 x 64 x 64 images are generated ~21 at a time on CPU: rows across block edges must
    # equal the same seeds generated alone.
    seeds = torch.arange(50) * 1_000_003
    z = gaussian_noise(seeds, (3, 64, 64), torch.zeros(1))
    for i in (0, 20, 21, 41, 42, 49):
        assert torch.equal(z[i], gaussian_noise(seeds[i : i + 1], (3, 64, 64), torch.zeros(1))[0])


def test_noise_without_seeds_refuses_to_repeat_itself_across_images() -> None:
    x = torch.zeros(4, 1, 8, 8)
    with pytest.raises(ValueError, match=r"images 0 and 1 have identical parameters"):
        apply_augmentation(x, {"noise": 0.1})
    # distinct parameters derive distinct seeds; explicit seeds are the caller's choice
    distinct = apply_augmentation(x, {"noise": [0.1, 0.2, 0.3, 0.4]})
    assert not torch.equal(distinct[0] / 0.1, distinct[1] / 0.2)
    seeded = apply_augmentation(x, {"noise": 0.1, "seed": np.arange(4)})
    assert not torch.equal(seeded[0], seeded[1])
    # one noisy image among identical identity ones is fine
    apply_augmentation(x, {"noise": [0.0, 0.0, 0.1, 0.0]})
