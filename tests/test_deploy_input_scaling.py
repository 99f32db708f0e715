"""Input scaling: per-feature powers of two folded into the first layer (rlq.deploy.input_scaling)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from rlq.compress import block_circulant_, magnitude_prune_
from rlq.deploy import compile_policy, error_bound, kernels_available
from rlq.deploy.input_scaling import INPUT_SCALING, fold_input_scales, input_scales
from rlq.deploy.reader import read_policy

SPREAD = np.r_[np.full(8, 0.3), np.full(9, 8.0)].astype(np.float32)
"""Standard deviations of 17 observation features: 8 narrow (joint angles) and 9 wide (joint velocities)."""


def actor(seed: int = 0, balanced: bool = True) -> nn.Sequential:
    """A 17-64-64-6 tanh actor; ``balanced``: its first layer's columns divided by :data:`SPREAD`, so that every
    feature moves the output alike, as a trained actor weighs its inputs (a random one ignores the narrow ones)."""
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Linear(17, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 6), nn.Tanh()
    )
    if balanced:
        with torch.no_grad():
            net[0].weight.div_(torch.from_numpy(SPREAD))
    return net


def observations(n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, 17)) * SPREAD).astype(np.float32)


def torch_forward(module: nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return module(torch.from_numpy(x)).numpy()


def test_each_scale_is_the_smallest_power_of_two_at_or_above_the_features_largest_magnitude():
    calibration = np.array([[0.3, -5.0, 0.0, 1.0, 3e-12], [-0.7, 2.0, 0.0, -0.25, 0.0]], np.float32)
    scales = input_scales(calibration, 5)
    for j, c in enumerate(scales):
        largest = float(np.abs(calibration[:, j].astype(np.float64)).max())
        mantissa, _ = math.frexp(c)
        assert mantissa == 0.5  # a power of two
        if largest == 0:
            assert c == 1.0
        else:
            assert c / 2 < largest <= c or (c == 2.0**-32 and largest < c)
    assert scales.tolist()[:4] == [1.0, 8.0, 1.0, 1.0]


def test_the_fold_is_exact():
    specs, _ = read_policy(actor())
    x = observations(64, 1)
    scales = input_scales(x, 17)
    scaling, folded = fold_input_scales(specs, scales)
    assert scaling.name == INPUT_SCALING
    # x / c and W * c are exact: the first layer's pre-activation is the same float64 product
    np.testing.assert_array_equal(folded[0].weight / scales.astype(np.float32), specs[0].weight)
    np.testing.assert_array_equal(scaling.forward(x) * scales.astype(np.float32), x)
    assert all(a is b for a, b in zip(folded[1:], specs[1:], strict=True))  # the later layers as they were


@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("pruned", [False, True], ids=["dense", "pruned"])
def test_outputs_stay_within_the_error_bound(precision, pruned, use_kernels):
    net = actor()
    if pruned:
        magnitude_prune_(net, 0.75, skip_first_last=False)
    x = observations(128, 2)
    compiled = compile_policy(net, precision, calibration=observations(256, 3), use_kernels=use_kernels)
    assert compiled.ops[0].name == INPUT_SCALING and compiled.compiled == (
        use_kernels and precision == "int8"
    )
    exact, bound = error_bound(net, compiled, x)
    np.testing.assert_allclose(exact, torch_forward(net, x), rtol=0, atol=1e-5)
    assert np.all(np.abs(compiled.outputs(x) - exact) <= bound)


def test_kernels_and_fallback_compute_the_same_codes():
    if not kernels_available():
        pytest.skip("rlq.deploy._policy_kernels is not built")
    net, calibration, x = actor(), observations(256, 3), observations(64, 4)
    kernels = compile_policy(net, "int8", calibration=calibration, use_kernels=True)(x)
    fallback = compile_policy(net, "int8", calibration=calibration, use_kernels=False)(x)
    np.testing.assert_allclose(kernels, fallback, rtol=0, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_narrow_features_keep_their_resolution(seed):
    # 8 features within about 1 beside 9 reaching 30: one input scale per call leaves the narrow ones a few
    # codes; scaled apart they keep theirs, and the actions come out several times closer to fp32's
    net, x = actor(seed), observations(512, 10 + seed)
    reference = torch_forward(net, x)
    plain = np.abs(compile_policy(net, "int8")(x) - reference).max()
    scaled = np.abs(
        compile_policy(net, "int8", calibration=observations(512, 20 + seed))(x) - reference
    ).max()
    assert scaled < plain / 4, (plain, scaled)


def test_bad_calibration_is_refused_with_one_line():
    net = actor()
    calibration = observations(16, 5)
    with pytest.raises(ValueError, match="precision='fp32' quantizes none"):
        compile_policy(net, "fp32", calibration=calibration)
    with pytest.raises(ValueError, match=r"shape \(n, 17\) with n >= 1, got shape \(16, 3\)"):
        compile_policy(net, "int8", calibration=calibration[:, :3])
    with pytest.raises(ValueError, match=r"got shape \(0, 17\)"):
        compile_policy(net, "int8", calibration=calibration[:0])
    broken = calibration.copy()
    broken[3, 2] = np.nan
    with pytest.raises(ValueError, match="must be finite"):
        compile_policy(net, "int8", calibration=broken)
    circulant = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    block_circulant_(circulant, 4, skip_first_last=False)
    with pytest.raises(ValueError, match="'0' is block-circulant"):
        compile_policy(circulant, "int8", calibration=np.ones((4, 16), np.float32))
