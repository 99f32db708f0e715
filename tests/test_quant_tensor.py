"""quantize_tensor and friends against an independent NumPy implementation of the documented rule."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from rlq.quant import parse_precision, quantize_tensor
from rlq.quant.tensor import fake_quantize_ste, integer_range, quantization_params, quantize_to_codes


def reference(t: np.ndarray, bits: int, axis: int | None, symmetric: bool) -> np.ndarray:
    """The rule of rlq.quant.tensor's docstring, written again in NumPy."""
    reduce = None if axis is None else tuple(d for d in range(t.ndim) if d != axis % t.ndim)
    lo = t.min(axis=reduce, keepdims=axis is not None)
    hi = t.max(axis=reduce, keepdims=axis is not None)
    if symmetric:
        top = 2 ** (bits - 1) - 1
        scale = np.maximum(np.abs(lo), np.abs(hi)) / top
        scale = np.where(scale > 0, scale, 1.0)
        return np.clip(np.round(t / scale), -top, top) * scale
    top = 2**bits - 1
    lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    scale = (hi - lo) / top
    scale = np.where(scale > 0, scale, 1.0)
    zero = np.clip(np.round(-lo / scale), 0, top)
    return (np.clip(np.round(t / scale) + zero, 0, top) - zero) * scale


@pytest.mark.parametrize("bits", [2, 3, 4, 8, 12, 16])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("symmetric", [True, False])
def test_matches_numpy_reference(bits, axis, symmetric):
    rng = np.random.default_rng(bits)
    t = rng.normal(size=(6, 5, 3)) * rng.uniform(0.1, 3.0, size=(6, 1, 1)) + 0.3
    got = quantize_tensor(torch.from_numpy(t), bits, per_channel_axis=axis, symmetric=symmetric)
    np.testing.assert_allclose(got.numpy(), reference(t, bits, axis, symmetric), rtol=0, atol=1e-12)


def test_float32_matches_reference_and_keeps_dtype_and_shape():
    t = torch.randn(7, 9, generator=torch.Generator().manual_seed(0))
    got = quantize_tensor(t, 5, per_channel_axis=0)
    assert got.dtype == torch.float32 and got.shape == t.shape and not got.requires_grad
    np.testing.assert_allclose(got.numpy(), reference(t.double().numpy(), 5, 0, True), rtol=1e-6, atol=1e-6)
    half = quantize_tensor(t.half(), 4)
    assert half.dtype == torch.float16


@pytest.mark.parametrize("bits", [2, 3, 4, 6, 8])
def test_level_counts(bits):
    t = torch.rand(64, 300, generator=torch.Generator().manual_seed(bits)) * 2 - 1
    per_tensor = quantize_tensor(t, bits)
    # Dense uniform values use every level of the restricted symmetric range: 2^b - 1 of them.
    assert per_tensor.unique().numel() == 2**bits - 1
    per_row = quantize_tensor(t, bits, per_channel_axis=0)
    assert max(row.unique().numel() for row in per_row) <= 2**bits
    per_col = quantize_tensor(t, bits, per_channel_axis=1)
    assert max(col.unique().numel() for col in per_col.T) <= 2**bits
    asym = quantize_tensor(t.abs() + 1.0, bits, symmetric=False)
    assert asym.unique().numel() <= 2**bits


def test_error_shrinks_monotonically_with_bits_and_is_bounded_by_half_a_step():
    t = torch.randn(4096, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    errors = []
    for bits in range(2, 17):
        q = quantize_tensor(t, bits)
        scale, _ = quantization_params(t, bits)
        assert (q - t).abs().max() <= scale / 2 + 1e-12
        errors.append(float(((q - t) ** 2).mean()))
    assert all(a > b for a, b in zip(errors, errors[1:], strict=False))


def test_exact_values_zero_and_extremes():
    t = torch.tensor([-3.0, -0.1, 0.0, 0.7, 2.0])
    sym = quantize_tensor(t, 4)
    assert sym[0] == -3.0 and sym[2] == 0.0  # the largest magnitude and zero are exact
    asym = quantize_tensor(t.abs(), 3, symmetric=False)
    assert asym[2] == 0.0 and asym.max() == pytest.approx(3.0)
    assert torch.equal(quantize_tensor(torch.zeros(3, 4), 4, per_channel_axis=0), torch.zeros(3, 4))
    assert torch.equal(quantize_tensor(torch.tensor(2.5), 8), torch.tensor(2.5))


def test_straight_through_gradients():
    t = torch.linspace(-2, 2, 9, requires_grad=True)
    scale, zero = torch.tensor(0.5), torch.tensor(0.0)
    y = fake_quantize_ste(t, scale, zero, -2, 2, clipped=False)
    y.sum().backward()
    assert torch.equal(t.grad, torch.ones(9))
    assert torch.equal(y.detach(), torch.clamp(torch.round(t.detach() / 0.5), -2, 2) * 0.5)
    t.grad = None
    fake_quantize_ste(t, scale, zero, -2, 2, clipped=True).sum().backward()
    assert torch.equal(t.grad, ((t.detach() >= -1) & (t.detach() <= 1)).float())  # no gradient where clipped


@pytest.mark.parametrize("bits", [1, 17, 0, -4])
def test_bits_out_of_range(bits):
    with pytest.raises(ValueError, match=r"bits must be in \[2, 16\]"):
        quantize_tensor(torch.ones(3), bits)


@pytest.mark.parametrize("bits", [4.0, "8", True])
def test_bits_of_wrong_type(bits):
    with pytest.raises(TypeError, match="bits must be an int"):
        quantize_tensor(torch.ones(3), bits)


def test_bad_tensor_and_axis():
    with pytest.raises(TypeError, match="floating-point"):
        quantize_tensor(torch.arange(4), 8)
    with pytest.raises(ValueError, match="out of range"):
        quantize_tensor(torch.ones(2, 3), 8, per_channel_axis=2)
    with pytest.raises(ValueError, match="at least one dimension"):
        quantize_tensor(torch.tensor(1.0), 8, per_channel_axis=0)


def test_integer_range():
    assert integer_range(8) == (-127, 127)
    assert integer_range(8, symmetric=False) == (0, 255)
    assert integer_range(2) == (-1, 1)


def test_parse_precision():
    assert parse_precision("int4").bits == 4 and not parse_precision("int4").is_float
    assert parse_precision(" INT8 ").name == "int8"
    assert parse_precision("fp16").dtype == torch.float16
    assert parse_precision("bfloat16").name == "bf16"
    assert parse_precision("fp32").bits == 32
    for bad in ["int1", "int17", "int", "fp8", "float64", "int4b", ""]:
        with pytest.raises(ValueError, match=r"choose one of fp32, fp16, bf16, int2 \.\.\. int16"):
            parse_precision(bad)
    with pytest.raises(TypeError):
        parse_precision(8)
    with pytest.raises(ValueError, match="no float dtype"):
        parse_precision("int8").dtype  # noqa: B018


def test_quant_imports_no_rl_library():
    code = (
        "import sys, rlq.quant, rlq.quant.latency, rlq.quant.size, rlq.quant.onnx_backend\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('stable_baselines3', 'gymnasium', 'gym')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("axis", [None, 0])
@pytest.mark.parametrize("symmetric", [True, False])
def test_non_finite_values_are_refused_not_spread(bad, axis, symmetric):
    """One NaN or inf made the scale NaN, inf or 1 and silently zeroed or NaN-ed the rest of the tensor."""
    t = torch.tensor([[0.1, -0.5, bad, 1.0], [0.2, 0.3, -0.4, 0.5]])
    kind = "NaN" if bad != bad else "inf"
    counts = "1 NaN and 0 inf" if kind == "NaN" else "0 NaN and 1 inf"
    for quantize in (quantize_tensor, quantize_to_codes, quantization_params):
        with pytest.raises(ValueError, match=f"the tensor: it holds {counts} among its 8 values"):
            quantize(t, 8, per_channel_axis=axis, symmetric=symmetric)


def test_non_finite_message_counts_and_names():
    t = torch.tensor([float("nan"), 1.0, float("inf"), float("nan"), -float("inf"), 2.0])
    with pytest.raises(
        ValueError, match=r"cannot quantize the weight 'fc\.weight': it holds 2 NaN and 2 inf among"
    ):
        quantize_tensor(t, 4, what="the weight 'fc.weight'")
