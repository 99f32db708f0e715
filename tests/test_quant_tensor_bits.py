"""Fake quantization is bit for bit the textbook arithmetic it was first written as, values and gradients.

``rlq.quant.tensor`` computes in place with fewer torch calls (QAT runs it on every forward pass). The
reference here is that first implementation, written again: scale and zero point from min/max, divide,
round, add the zero point, clamp, subtract it, multiply, and ``quantized + (t - t.detach())`` for the
straight-through estimator. Every comparison is of the bits (so -0.0 differs from +0.0) or of NaN positions.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from rlq.quant.qat import WeightFakeQuant
from rlq.quant.tensor import (
    fake_quantize,
    fake_quantize_ste,
    integer_range,
    quantization_params,
    quantize_tensor,
    quantize_to_codes,
    straight_through,
)

BITS = [2, 3, 4, 5, 6, 7, 8, 12, 16]
INT_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16}
INT_VIEW[torch.bfloat16] = torch.int16


def ref_params(t, bits, axis, symmetric):
    """The reference scale and zero point: min/max per tensor or per slice along ``axis``."""
    x = t.detach().to(torch.float64 if t.dtype == torch.float64 else torch.float32)
    if axis is None:
        lo, hi = x.min(), x.max()
    else:
        dims = tuple(d for d in range(t.dim()) if d != axis % t.dim())
        lo, hi = x.amin(dim=dims, keepdim=True), x.amax(dim=dims, keepdim=True)
    qmin, qmax = integer_range(bits, symmetric)
    if symmetric:
        scale = torch.maximum(lo.abs(), hi.abs()) / qmax
        zero_point = torch.zeros_like(scale)
    else:
        lo, hi = lo.clamp(max=0), hi.clamp(min=0)
        scale = (hi - lo) / (qmax - qmin)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    if not symmetric:
        zero_point = torch.clamp(torch.round(-lo / scale), qmin, qmax)
    return scale, zero_point


def ref_fake_quantize(t, scale, zero_point, qmin, qmax):
    x = t.to(scale.dtype)
    codes = torch.clamp(torch.round(x / scale) + zero_point, qmin, qmax)
    return ((codes - zero_point) * scale).to(t.dtype)


def ref_ste(t, scale, zero_point, qmin, qmax, clipped):
    quantized = ref_fake_quantize(t.detach(), scale, zero_point, qmin, qmax)
    passthrough = t - t.detach()
    if clipped:
        lo = ((qmin - zero_point) * scale).to(t.dtype)
        hi = ((qmax - zero_point) * scale).to(t.dtype)
        passthrough = passthrough * ((t.detach() >= lo) & (t.detach() <= hi)).to(t.dtype)
    return quantized + passthrough


def ref_weight_ste(w, bits, axis):
    """The reference WeightFakeQuant: symmetric, scale from the weight itself, unclipped straight-through."""
    scale, zero_point = ref_params(w, bits, axis, True)
    qmin, qmax = integer_range(bits)
    return ref_ste(w, scale, zero_point, qmin, qmax, clipped=False)


def assert_same_bits(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(torch.isnan(got), torch.isnan(want)), "NaN positions differ"
    finite = ~torch.isnan(want)
    view = INT_VIEW[want.dtype]
    assert torch.equal(got.detach()[finite].view(view), want.detach()[finite].view(view)), "bits differ"


def edge_tensors(dtype=torch.float32):
    """Tensors of shape (6, 8): random scales per row, zeros, -0.0, constants, exact ties, tiny and huge values."""
    g = torch.Generator().manual_seed(0)
    out = {}
    out["random"] = torch.randn(6, 8, generator=g) * torch.rand(6, 1, generator=g) * 3
    out["zeros"] = torch.zeros(6, 8)
    out["negative_zeros"] = torch.full((6, 8), -0.0)
    out["constant"] = torch.full((6, 8), 0.37)
    out["negative_constant"] = torch.full((6, 8), -2.5)
    mixed = torch.randn(6, 8, generator=g)
    mixed[1] = 0.0
    mixed[2] = -0.0
    mixed[3, ::2] = -0.0
    mixed[4] = 5.0
    mixed[:, 0] = 0.0
    out["zero_rows_and_columns"] = mixed
    # Every entry a multiple of 1/8 in [-1.75, 1.75]: at 4 bits the scale is 0.25 and half the entries are
    # exact ties (k + 0.5 codes) that round half to even; other bit widths meet other ties.
    ties = (torch.randint(-14, 15, (6, 8), generator=g) / 8.0).float()
    ties[:, 0] = 1.75
    ties[:, 1] = -1.75
    out["ties"] = ties
    small = torch.randn(6, 8, generator=g) * 1e-3
    small[0] = 1e-3 * torch.tensor([0.5, -0.5, 0.25, -0.25, 0.0, -0.0, 1.0, -1.0])  # tiny and signed zeros
    out["small"] = small
    subnormal = torch.randn(6, 8, generator=g) * 1e-43  # scales underflow, some to 0
    subnormal[5] = torch.tensor([1e-45, -1e-45, 0.0, 3e-45, -7e-45, 1e-44, 0.0, -0.0])
    out["subnormal"] = subnormal
    out["huge"] = torch.randn(6, 8, generator=g) * 1e37
    return {name: t.to(dtype) for name, t in out.items()}


CASES = list(edge_tensors())


def assert_matches_reference(t, bits, axis, symmetric):
    """Scale, zero point, fake_quantize (and its symmetric shortcut), quantize_tensor: the reference's bits.

    Returns the reference's ``(scale, zero_point)``.
    """
    qmin, qmax = integer_range(bits, symmetric)
    scale, zero_point = quantization_params(t, bits, axis, symmetric)
    want_scale, want_zero = ref_params(t, bits, axis, symmetric)
    assert_same_bits(scale, want_scale)
    assert_same_bits(zero_point, want_zero)
    want = ref_fake_quantize(t, want_scale, want_zero, qmin, qmax)
    assert_same_bits(fake_quantize(t, scale, zero_point, qmin, qmax), want)
    assert_same_bits(quantize_tensor(t, bits, axis, symmetric), want)
    if symmetric:  # zero point None: the symmetric shortcut
        assert_same_bits(fake_quantize(t, scale, None, qmin, qmax), want)
    return want_scale, want_zero


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("case", CASES)
def test_params_and_fake_quantize_match_reference(case, axis, symmetric):
    t = edge_tensors()[case]
    for bits in BITS:
        qmin, qmax = integer_range(bits, symmetric)
        want_scale, want_zero = assert_matches_reference(t, bits, axis, symmetric)
        codes, _, _ = quantize_to_codes(t, bits, axis, symmetric)
        want_codes = torch.clamp(torch.round(t / want_scale) + want_zero, qmin, qmax).to(torch.int64)
        assert torch.equal(codes, want_codes)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("symmetric", [True, False])
def test_other_dtypes_match_reference(dtype, symmetric):
    for _case, t in edge_tensors(dtype).items():
        if not torch.isfinite(t).all():  # huge values overflow float16
            continue
        for bits, axis in itertools.product([2, 4, 8, 16], [None, 0, 1]):
            qmin, qmax = integer_range(bits, symmetric)
            scale, zero_point = quantization_params(t, bits, axis, symmetric)
            want_scale, want_zero = ref_params(t, bits, axis, symmetric)
            assert_same_bits(scale, want_scale)
            want = ref_fake_quantize(t, want_scale, want_zero, qmin, qmax)
            assert_same_bits(quantize_tensor(t, bits, axis, symmetric), want)


def grad_and_value(t, upstream, fn, *args):
    """Return ``fn(t, *args)`` and the gradient it sends back to ``t`` from ``upstream``."""
    leaf = t.detach().clone().requires_grad_(True)
    out = fn(leaf, *args)
    out.backward(upstream)
    return out.detach(), leaf.grad


@pytest.mark.parametrize("clipped", [False, True])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_straight_through_values_and_gradients_match_reference(axis, symmetric, clipped):
    g = torch.Generator().manual_seed(1)
    for _case, t in edge_tensors().items():
        upstream = torch.randn(t.shape, generator=g)  # negative entries: grad * 0 is -0.0 where clipped
        for bits in BITS:
            qmin, qmax = integer_range(bits, symmetric)
            scale, zero_point = ref_params(t, bits, axis, symmetric)
            scale = scale * 0.6 if clipped else scale  # a narrower range clips the largest values
            want = grad_and_value(t, upstream, ref_ste, scale, zero_point, qmin, qmax, clipped)
            zero_points = [zero_point, None] if symmetric else [zero_point]
            for zp in zero_points:
                got = grad_and_value(t, upstream, fake_quantize_ste, scale, zp, qmin, qmax, clipped)
                assert_same_bits(got[0], want[0])
                assert_same_bits(got[1], want[1])
            with torch.no_grad():  # without gradients, the same values
                assert_same_bits(fake_quantize_ste(t, scale, zero_point, qmin, qmax, clipped), want[0])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_straight_through_in_other_dtypes_matches_reference(dtype):
    t = edge_tensors()["random"].to(dtype)
    upstream = torch.randn(t.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    for clipped, symmetric in itertools.product([False, True], [True, False]):
        qmin, qmax = integer_range(4, symmetric)
        scale, zero_point = ref_params(t, 4, 0, symmetric)
        scale = scale * 0.7
        want = grad_and_value(t, upstream, ref_ste, scale, zero_point, qmin, qmax, clipped)
        got = grad_and_value(t, upstream, fake_quantize_ste, scale, zero_point, qmin, qmax, clipped)
        assert_same_bits(got[0], want[0])
        assert_same_bits(got[1], want[1])


def test_straight_through_of_non_finite_values_is_nan_as_before():
    """fake_quantize(t) + (t - t): inf - inf is NaN, so the textbook output was NaN at inf and NaN entries."""
    t = torch.tensor([[1.0, math.inf, -0.2, math.nan], [-math.inf, 0.0, -0.0, 3.0]])
    scale, zero_point = torch.tensor([[0.5], [0.25]]), torch.zeros(2, 1)
    upstream = torch.ones_like(t)
    for clipped, zp in itertools.product([False, True], [zero_point, None]):
        want = grad_and_value(t, upstream, ref_ste, scale, zero_point, -7, 7, clipped)
        got = grad_and_value(t, upstream, fake_quantize_ste, scale, zp, -7, 7, clipped)
        assert_same_bits(got[0], want[0])
        assert_same_bits(got[1], want[1])
        assert torch.isnan(got[0][0, 1]) and torch.isnan(got[0][1, 0])


@pytest.mark.parametrize("shape", [(400, 17), (300, 400), (6, 300), (75, 100, 4), (8, 3, 3, 3)])
@pytest.mark.parametrize("axis", [0, 1, None])
def test_weight_fake_quant_matches_reference_on_layer_shapes(shape, axis, one_thread):
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(shape, generator=g) * 0.05
    weight[0] = 0.0  # an all-zero output channel
    upstream = torch.randn(shape, generator=g)
    for bits in [2, 4, 8]:
        quantizer = WeightFakeQuant(bits, axis)
        want = grad_and_value(weight, upstream, ref_weight_ste, bits, axis)
        got = grad_and_value(weight, upstream, quantizer)
        assert_same_bits(got[0], want[0])
        assert_same_bits(got[1], want[1])
        transposed = weight.t().contiguous().t() if weight.dim() == 2 else weight  # non-contiguous input
        assert_same_bits(grad_and_value(transposed, upstream, quantizer)[0], want[0])


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_random_tensors_match_reference(axis, symmetric):
    g = torch.Generator().manual_seed(4)
    for trial in range(20):
        t = torch.randn(9, 13, generator=g) * 10 ** float(torch.randint(-6, 6, (), generator=g))
        t = t + float(torch.randn((), generator=g)) * t.abs().mean() * (trial % 3)  # shifted off zero
        for bits in BITS:
            assert_matches_reference(t, bits, axis, symmetric)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values_still_raise(bad, axis, symmetric):
    t = torch.randn(4, 5)
    t[2, 3] = bad
    with pytest.raises(ValueError, match="cannot quantize the weight"):
        quantization_params(t, 4, axis, symmetric, what="the weight")
    every = torch.full((4, 5), bad)
    with pytest.raises(ValueError, match="cannot quantize"):
        quantization_params(every, 4, axis, symmetric)


def test_straight_through_gives_values_with_the_identity_gradient():
    """straight_through(t, q): q's bits (no copy) and t's gradient, as q + (t - t.detach())."""
    g = torch.Generator().manual_seed(5)
    t = torch.randn(40, 17, generator=g)
    quantized = quantize_tensor(t, 4, 0)
    upstream = torch.randn(t.shape, generator=g)
    want = grad_and_value(t, upstream, lambda w: quantized + (w - w.detach()))
    got = grad_and_value(t, upstream, straight_through, quantized)
    assert_same_bits(got[0], want[0])
    assert_same_bits(got[1], want[1])
    leaf = t.clone().requires_grad_(True)
    assert straight_through(leaf, quantized).data_ptr() == quantized.data_ptr()
    with torch.no_grad():
        assert straight_through(leaf, quantized) is quantized
