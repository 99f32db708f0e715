"""The compiled fake-quantization kernel (rlq/quant/_fake_quant_kernels.c) against rlq's PyTorch path."""

from __future__ import annotations

import types

import pytest
import torch

from rlq.quant import WeightFakeQuant
from rlq.quant import tensor as quant_tensor
from rlq.quant.tensor import fake_quantize_symmetric, integer_range


@pytest.fixture
def spy(monkeypatch):
    """Count the calls that reach the compiled module."""
    calls = []
    real = quant_tensor._fake_quant_kernels

    def counted(*args):
        calls.append(args[2:])  # rows, cols, qmax
        return real.fake_quant_rows_f32(*args)

    monkeypatch.setattr(
        quant_tensor, "_fake_quant_kernels", types.SimpleNamespace(fake_quant_rows_f32=counted)
    )
    monkeypatch.setattr(quant_tensor, "USE_KERNELS", True)
    return calls


def pytorch_path(x: torch.Tensor, bits: int, axis: int | None, monkeypatch) -> torch.Tensor:
    monkeypatch.setattr(quant_tensor, "USE_KERNELS", False)
    try:
        return fake_quantize_symmetric(x, bits, axis)
    finally:
        monkeypatch.setattr(quant_tensor, "USE_KERNELS", True)


def hard_cases(seed: int) -> list[torch.Tensor]:
    """Return tensors that stress the arithmetic: tiny (subnormal) and huge ranges, zero rows, -0.0, ties."""
    g = torch.Generator().manual_seed(seed)
    cases = []
    for exponent in (-44, -38, -20, -3, 0, 5, 30):
        x = torch.randn(37, 11, generator=g) * 10.0**exponent
        x[3] = 0.0  # an all-zero row: scale 1
        x[4, 2] = -0.0
        cases.append(x)
    cases.append(torch.randn(400, 23, generator=g))
    cases.append(torch.randn(100, 75, 4, generator=g))  # B-vectors: a scale per block row
    cases.append(torch.randn(8, 3, 3, 3, generator=g))  # a convolution weight
    cases.append(torch.randn(1, 1, generator=g))
    return cases


def test_the_kernel_is_built():
    # make venv (pip install -e .) compiles it; without a C compiler rlq still works, by PyTorch ops
    assert quant_tensor.kernels_available(), "rlq.quant._fake_quant_kernels was not built (no C compiler?)"


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8, 12, 16])
@pytest.mark.parametrize("axis", [None, 0])
def test_kernel_values_are_the_pytorch_path_bit_for_bit(bits, axis, spy, monkeypatch):
    for x in hard_cases(bits):
        ours = fake_quantize_symmetric(x, bits, axis)
        reference = pytorch_path(x, bits, axis, monkeypatch)
        assert torch.equal(ours.view(torch.int32), reference.view(torch.int32))
    assert len(spy) == len(hard_cases(0))


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_ties_round_half_to_even_as_pytorch_does(bits, spy, monkeypatch):
    qmax = integer_range(bits)[1]
    codes = torch.arange(-2 * qmax, 2 * qmax + 1, dtype=torch.float32) / 2  # every half step, largest = qmax
    ours = fake_quantize_symmetric(codes, bits)
    assert spy == [(1, codes.numel(), qmax)]
    assert torch.equal(ours, torch.round(codes))  # scale 1: the codes themselves, ties to even
    assert torch.equal(ours.view(torch.int32), pytorch_path(codes, bits, None, monkeypatch).view(torch.int32))
    assert not torch.signbit(ours[ours == 0]).any()  # -0.0 (from -0.5) comes back as +0.0


def test_each_row_gets_its_own_scale(spy):
    x = torch.tensor([[1.0, -0.5, 0.26], [100.0, 30.0, -49.0]])
    ours = fake_quantize_symmetric(x, 3, 0)  # codes -3..3
    expected = torch.tensor([[1.0, -2 / 3, 1 / 3], [100.0, 100 / 3, -100 / 3]])  # -49 is code -1.47
    assert torch.allclose(ours, expected)
    assert spy == [(2, 3, 3)]


@pytest.mark.parametrize(
    "make, axis",
    [
        (lambda: torch.randn(4, 6, dtype=torch.float64), 0),  # not float32
        (lambda: torch.randn(6, 4).t(), 0),  # not contiguous
        (lambda: torch.randn(4, 6), 1),  # a scale per column
    ],
)
def test_what_the_kernel_does_not_take_is_quantized_by_pytorch(make, axis, spy):
    x = make()
    ours = fake_quantize_symmetric(x, 4, axis)
    scale = x.abs().amax(dim=1 - axis, keepdim=True) / 7
    assert torch.allclose(ours, torch.clamp(torch.round(x / scale), -7, 7) * scale)
    assert spy == []


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_value_is_refused_naming_the_tensor(bad, spy):
    x = torch.randn(5, 4)
    x[2, 1] = bad
    with pytest.raises(ValueError, match="cannot quantize fc1.weight: it holds"):
        fake_quantize_symmetric(x, 4, 0, what="fc1.weight")
    assert len(spy) == 1


def test_qat_weight_quantizer_keeps_its_straight_through_gradient(spy):
    weight = torch.randn(30, 20, requires_grad=True)
    quantized = WeightFakeQuant(4, axis=0)(weight)
    upstream = torch.randn(30, 20)
    (grad,) = torch.autograd.grad(quantized, weight, upstream)
    assert torch.equal(grad, upstream)  # the scale follows the weight: nothing clipped, the identity
    assert len(spy) == 1
    assert all(row.unique().numel() <= 15 for row in quantized.detach())
