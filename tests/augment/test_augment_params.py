"""AugmentationConfig, presets and the vectorised training path ``generate_params``."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwise.augment import (
    PARAM_NAMES,
    AugmentationConfig,
    counter_hash,
    generate_params,
    get_preset,
)
from rankwise.augment.seeds import mix64
from rankwise.data import contiguous_range, strided_positions

PRESETS = {
    "mild": ((-15, 15), (0.9, 1.1), (0, 0.05), (0.9, 1.1), (0.85, 1.15)),
    "moderate": ((-30, 30), (0.8, 1.2), (0, 0.1), (0.8, 1.2), (0.7, 1.3)),
    "aggressive": ((-45, 45), (0.7, 1.3), (0, 0.15), (0.7, 1.3), (0.6, 1.4)),
}


# ------------------------------------------------------------------------------ config


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_have_the_issue_ranges(name: str) -> None:
    cfg = get_preset(name)
    got = tuple(getattr(cfg, f"{p}_range") for p in PARAM_NAMES)
    assert got == tuple((float(lo), float(hi)) for lo, hi in PRESETS[name])


def test_presets_are_fresh_objects() -> None:
    a = get_preset("mild")
    a.rotation_range = (0.0, 0.0)
    assert get_preset("mild").rotation_range == (-15.0, 15.0)
    assert get_preset("mild") is not get_preset("mild")


def test_unknown_preset_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"'wild'.*'mild', 'moderate', 'aggressive'"):
        get_preset("wild")


def test_default_config_is_moderate() -> None:
    assert AugmentationConfig() == get_preset("moderate")
    assert AugmentationConfig().augmentation_depth == 10


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"rotation_range": (10, -10)},
            r"rotation_range \(\(10, -10\)\) must have low <= high; swap",
        ),
        ({"noise_range": (-0.1, 0.1)}, r"noise_range .* low >= 0"),
        ({"scale_range": (0.0, 1.0)}, r"scale_range .* low > 0"),
        ({"scale_range": (-1.0, 1.0)}, r"scale_range .* low > 0"),
        ({"contrast_range": (0.0, 1.0)}, r"contrast_range .* low > 0"),
        ({"brightness_range": (1.0,)}, r"brightness_range .* \(low, high\) pair"),
        ({"brightness_range": "ab"}, r"brightness_range .* \(low, high\) pair"),
        ({"rotation_range": (0, float("inf"))}, r"rotation_range .* finite"),
        ({"augmentation_depth": 0}, r"augmentation_depth \(0\) must be >= 1"),
        ({"augmentation_depth": 2.5}, r"augmentation_depth \(2.5\) must be an integer"),
    ],
)
def test_config_rejects_bad_values_with_the_fix(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AugmentationConfig(**kwargs)


def test_config_accepts_lists_and_fixed_ranges() -> None:
    cfg = AugmentationConfig(rotation_range=[5, 5], noise_range=[0, 0])  # type: ignore[arg-type]
    assert cfg.rotation_range == (5.0, 5.0) and cfg.noise_range == (0.0, 0.0)


# ------------------------------------------------------------------------ counter hash


def test_mix64_is_splitmix64() -> None:
    # Reference values of SplitMix64 seeded with 0: next() = mix64(state += gamma).
    gamma = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        states = np.arange(1, 4, dtype=np.uint64) * gamma
    assert [hex(int(v)) for v in mix64(states)] == [
        "0xe220a8397b1dcdaf",
        "0x6e789e6aa1b965f4",
        "0x6c45d188009454f",
    ]


def test_counter_hash_separates_seed_epoch_and_stream() -> None:
    ids = np.arange(1000)
    base = counter_hash(ids, base_seed=0, epoch=1)
    # seed + epoch would make these equal; a mixed key keeps them apart.
    assert not np.any(base == counter_hash(ids, base_seed=1, epoch=0))
    assert not np.any(base == counter_hash(ids, base_seed=0, epoch=1, stream=1))
    assert len(np.unique(base)) == 1000


# ------------------------------------------------------------------- generate_params


def test_generate_params_keys_shapes_dtypes() -> None:
    p = generate_params(np.arange(12).reshape(3, 4))
    assert sorted(p) == sorted([*PARAM_NAMES, "seed"])
    for name in PARAM_NAMES:
        assert p[name].shape == (3, 4) and p[name].dtype == np.float64
    assert p["seed"].dtype == np.uint64
    assert generate_params(np.array([], dtype=np.int64))["rotation"].shape == (0,)


def test_generate_params_is_deterministic() -> None:
    a = generate_params(np.arange(100), epoch=3, base_seed=9)
    b = generate_params(np.arange(100), epoch=3, base_seed=9)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


@settings(max_examples=60, deadline=None)
@given(
    ids=st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=40),
    epoch=st.integers(0, 2**64 - 1),
    seed=st.integers(0, 2**64 - 1),
    preset=st.sampled_from(sorted(PRESETS)),
)
def test_params_stay_in_range(ids: list[int], epoch: int, seed: int, preset: str) -> None:
    cfg = get_preset(preset)
    p = generate_params(np.array(ids, dtype=np.int64), epoch=epoch, base_seed=seed, config=cfg)
    for name in PARAM_NAMES:
        low, high = getattr(cfg, f"{name}_range")
        assert np.all(p[name] >= low) and np.all(p[name] <= high), name


@settings(max_examples=40, deadline=None)
@given(
    ranges=st.lists(st.tuples(st.floats(-1e6, 1e6), st.floats(0, 1e6)), min_size=5, max_size=5),
)
def test_any_valid_range_is_respected(ranges: list[tuple[float, float]]) -> None:
    bounds = [(lo, lo + span) for lo, span in ranges]
    bounds[2] = (abs(bounds[2][0]), abs(bounds[2][0]) + ranges[2][1])  # noise >= 0
    for i in (3, 4):  # scale, contrast > 0
        bounds[i] = (abs(bounds[i][0]) + 1e-3, abs(bounds[i][0]) + 1e-3 + ranges[i][1])
    cfg = AugmentationConfig(**{f"{n}_range": b for n, b in zip(PARAM_NAMES, bounds, strict=True)})
    p = generate_params(np.arange(500), config=cfg)
    for name, (low, high) in zip(PARAM_NAMES, bounds, strict=True):
        assert np.all(p[name] >= low) and np.all(p[name] <= high)


def test_params_fill_the_range_uniformly() -> None:
    p = generate_params(np.arange(20000), config=get_preset("moderate"))
    rot = p["rotation"]
    assert rot.min() < -29.9 and rot.max() > 29.9
    counts, _ = np.histogram(rot, bins=10, range=(-30, 30))
    assert np.all(np.abs(counts - 2000) < 200)  # ~4.5 sigma
    # The five parameters of a sample are not correlated with one another.
    corr = np.corrcoef(np.stack([p[n] for n in PARAM_NAMES]))
    assert np.all(np.abs(corr - np.eye(5)) < 0.05)


def test_fixed_range_gives_exactly_that_value() -> None:
    cfg = AugmentationConfig(rotation_range=(0, 0), scale_range=(1, 1), noise_range=(0, 0))
    p = generate_params(np.arange(50), config=cfg)
    assert np.all(p["rotation"] == 0) and np.all(p["scale"] == 1) and np.all(p["noise"] == 0)


@settings(max_examples=40, deadline=None)
@given(
    ids=st.lists(st.integers(0, 10**9), min_size=1, max_size=50, unique=True),
    data=st.data(),
)
def test_invariant_to_order_and_batching(ids: list[int], data: st.DataObject) -> None:
    whole = generate_params(np.array(ids), epoch=2, base_seed=5)
    order = data.draw(st.permutations(range(len(ids))))
    shuffled = generate_params(np.array(ids)[order], epoch=2, base_seed=5)
    cut = data.draw(st.integers(0, len(ids)))
    parts = [
        generate_params(np.array(ids[:cut]), epoch=2, base_seed=5),
        generate_params(np.array(ids[cut:]), epoch=2, base_seed=5),
    ]
    for name in whole:
        np.testing.assert_array_equal(shuffled[name], whole[name][order])
        np.testing.assert_array_equal(np.concatenate([q[name] for q in parts]), whole[name])
    # One at a time, as a per-sample dataset would ask.
    single = generate_params(np.array([ids[-1]]), epoch=2, base_seed=5)
    assert single["rotation"][0] == whole["rotation"][-1]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7, 64])
def test_invariant_to_world_size_simulated(world_size: int) -> None:
    n = 1003
    reference = generate_params(np.arange(n), epoch=4, base_seed=11)
    # Contiguous (DPA) shards and strided (torch sampler) shards, every rank of the world.
    contiguous = [np.arange(*contiguous_range(n, world_size, r)) for r in range(world_size)]
    strided = [np.array(strided_positions(n, world_size, r)) for r in range(world_size)]
    for shards in (contiguous, strided):
        got = {name: np.empty(n, dtype=reference[name].dtype) for name in reference}
        for ids in shards:
            part = generate_params(ids.astype(np.int64), epoch=4, base_seed=11)
            for name in reference:
                got[name][ids] = part[name]
        for name in reference:
            np.testing.assert_array_equal(got[name], reference[name])


def test_samples_differ_from_one_another() -> None:
    p = generate_params(np.arange(10000))
    for name in [*PARAM_NAMES, "seed"]:
        assert len(np.unique(p[name])) == 10000, name


def test_epoch_and_base_seed_change_every_sample() -> None:
    ids = np.arange(1000)
    e0 = generate_params(ids, epoch=0, base_seed=1)
    e1 = generate_params(ids, epoch=1, base_seed=1)
    s2 = generate_params(ids, epoch=0, base_seed=2)
    for name in PARAM_NAMES:
        assert not np.any(e0[name] == e1[name]), name
        assert not np.any(e0[name] == s2[name]), name
    # Not "seed + epoch": seed 1 epoch 0 is unrelated to seed 0 epoch 1.
    s0e1 = generate_params(ids, epoch=1, base_seed=0)
    assert not np.any(e0["rotation"] == s0e1["rotation"])


def test_generate_params_accepts_lists_ranges_and_unsigned() -> None:
    ref = generate_params(np.arange(5))
    for ids in ([0, 1, 2, 3, 4], range(5), np.arange(5, dtype=np.uint32)):
        np.testing.assert_array_equal(generate_params(ids)["rotation"], ref["rotation"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sample_ids": [1, -2]}, r"sample_id \(-2\) must be >= 0"),
        ({"sample_ids": [1.5]}, r"sample_ids must be integers, got dtype float64"),
        ({"sample_ids": [True]}, r"sample_ids must be integers, got dtype bool"),
        ({"sample_ids": [1], "epoch": -1}, r"epoch \(-1\) must be >= 0"),
        ({"sample_ids": [1], "epoch": 1.0}, r"epoch \(1.0\) must be an integer"),
        ({"sample_ids": [1], "base_seed": -3}, r"base_seed \(-3\) must be >= 0"),
        ({"sample_ids": [1], "base_seed": 2**64}, r"base_seed .* must be <= "),
        ({"sample_ids": [1], "config": "mild"}, r"config must be an AugmentationConfig"),
    ],
)
def test_generate_params_errors(kwargs: dict, message: str) -> None:
    ids = kwargs.pop("sample_ids")
    with pytest.raises(ValueError, match=message):
        generate_params(ids, **kwargs)


def test_global_rng_state_is_untouched() -> None:
    random.seed(123)
    np.random.seed(123)
    torch.manual_seed(123)
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    generate_params(np.arange(100), epoch=1)
    counter_hash(np.arange(10))
    assert random.getstate() == states[0]
    np.testing.assert_array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2])


def test_a_bad_range_assigned_later_is_refused_at_the_assignment() -> None:
    config = get_preset("mild")
    with pytest.raises(ValueError, match=r"noise_range \(\(-1.0, 0.0\)\) must have low >= 0"):
        config.noise_range = (-1.0, 0.0)
    with pytest.raises(ValueError, match=r"augmentation_depth \(0\) must be >= 1"):
        config.augmentation_depth = 0
    assert config == get_preset("mild")  # a refused value is not stored
    config.rotation_range = [1, 2]  # type: ignore[assignment]
    assert config.rotation_range == (1.0, 2.0)
