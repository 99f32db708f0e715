"""The compiled block-circulant kernels (rlq/compress/_circulant_kernels.c) against independent definitions."""

from __future__ import annotations

import types

import pytest
import torch

from rlq.compress import circulant
from rlq.compress.circulant import _cyclic_diagonal_sums, _expand, expand_circulant

KERNEL_SHAPES = [(1, 1, 2), (3, 5, 2), (2, 3, 4), (100, 75, 4), (3, 2, 8), (4, 4, 8)]


def expand_by_loops(vectors: torch.Tensor) -> torch.Tensor:
    """Return the dense weight, entry by entry from the definition weight[iB+r, jB+c] = v[i, j, (r-c) mod B]."""
    n_out, n_in, b = vectors.shape
    weight = torch.empty(n_out * b, n_in * b, dtype=vectors.dtype)
    for r in range(b):
        for c in range(b):
            weight[r::b, c::b] = vectors[:, :, (r - c) % b]
    return weight


def sums_by_index_add(grad: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """Return the cyclic-diagonal sums as an index_add_ of the dense gradient into zeros (dense order)."""
    n_out, n_in, b = shape
    rows = torch.arange(n_out * b)[:, None]
    cols = torch.arange(n_in * b)[None, :]
    target = ((rows // b) * n_in + cols // b) * b + (rows % b - cols % b) % b  # flat vector index
    return grad.new_zeros(n_out * n_in * b).index_add_(0, target.reshape(-1), grad.reshape(-1)).view(shape)


@pytest.fixture
def spy(monkeypatch):
    """Count the calls that reach the compiled module."""
    calls = {"expand_f32": 0, "cyclic_sums_f32": 0}
    real = circulant._circulant_kernels

    def counted(name):
        def call(*args):
            calls[name] += 1
            return getattr(real, name)(*args)

        return call

    monkeypatch.setattr(
        circulant, "_circulant_kernels", types.SimpleNamespace(**{n: counted(n) for n in calls})
    )
    monkeypatch.setattr(circulant, "USE_KERNELS", True)
    return calls


def test_the_kernels_are_built():
    # make venv (pip install -e .) compiles them; without a C compiler rlq still works, by PyTorch ops
    assert circulant.kernels_available(), "rlq.compress._circulant_kernels was not built (no C compiler?)"


@pytest.mark.parametrize("shape", KERNEL_SHAPES)
def test_kernel_expansion_is_the_definition_bit_for_bit(shape, spy):
    vectors = torch.randn(shape)
    vectors[0, 0, 0] = -0.0
    dense = _expand(vectors)
    assert spy["expand_f32"] == 1
    assert torch.equal(dense.view(torch.int32), expand_by_loops(vectors).view(torch.int32))


@pytest.mark.parametrize("shape", KERNEL_SHAPES)
def test_kernel_gradient_sums_are_an_index_add_into_zeros_bit_for_bit(shape, spy):
    n_out, n_in, b = shape
    grad = torch.randn(n_out * b, n_in * b, generator=torch.Generator().manual_seed(1))
    grad[:b, :b] = -0.0  # a whole block of negative zeros sums to +0.0 from a zero start, as index_add_ does
    sums = _cyclic_diagonal_sums(grad, b)
    assert spy["cyclic_sums_f32"] == 1
    assert torch.equal(sums.view(torch.int32), sums_by_index_add(grad, shape).view(torch.int32))
    assert not torch.signbit(sums[0, 0]).any()


def test_autograd_through_the_kernels_matches_the_pytorch_path_bit_for_bit(spy, monkeypatch):
    vectors = torch.randn(100, 75, 4, requires_grad=True)
    upstream = torch.randn(400, 300)
    (with_kernels,) = torch.autograd.grad(expand_circulant(vectors), vectors, upstream)
    assert spy == {"expand_f32": 1, "cyclic_sums_f32": 1}
    monkeypatch.setattr(circulant, "USE_KERNELS", False)
    (without,) = torch.autograd.grad(expand_circulant(vectors), vectors, upstream)
    assert spy == {"expand_f32": 1, "cyclic_sums_f32": 1}
    assert torch.equal(with_kernels, without)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(2, 3, 4, dtype=torch.float64),  # not float32
        lambda: torch.randn(3, 2, 4).transpose(0, 1),  # not contiguous
        lambda: torch.randn(2, 3, 3),  # B without a kernel
    ],
)
def test_vectors_the_kernel_does_not_take_are_expanded_by_pytorch(make, spy):
    vectors = make()
    assert torch.equal(_expand(vectors), expand_by_loops(vectors))
    assert spy["expand_f32"] == 0


def test_a_convolution_is_expanded_by_pytorch(spy):
    vectors = torch.randn(2, 2, 4, 3, 3)  # every kernel position is its own block-circulant matrix
    dense = _expand(vectors)
    for k in range(3):
        for m in range(3):
            assert torch.equal(dense[:, :, k, m], expand_by_loops(vectors[..., k, m].contiguous()))
    assert spy["expand_f32"] == 0


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(8, 12, dtype=torch.float64),  # not float32
        lambda: torch.randn(12, 8).t(),  # not contiguous
    ],
)
def test_gradients_the_kernel_does_not_take_are_summed_by_pytorch(make, spy):
    grad = make()
    sums = _cyclic_diagonal_sums(grad, 4)
    assert torch.allclose(sums, sums_by_index_add(grad.contiguous(), (2, 3, 4)), rtol=1e-6, atol=1e-6)
    assert spy["cyclic_sums_f32"] == 0


def test_the_compiled_module_refuses_a_block_size_without_kernel():
    a, b = torch.zeros(2, 2, 3), torch.zeros(6, 6)
    with pytest.raises(ValueError, match="block size 3 has no compiled kernel"):
        circulant._circulant_kernels.expand_f32(a.data_ptr(), b.data_ptr(), 2, 2, 3)
