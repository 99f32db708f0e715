"""Block-circulant math checked against independent computations (loops, least squares, dense products)."""

from __future__ import annotations

import pytest
import torch

from rlq.compress import (
    CirculantCall,
    choose_forward_path,
    circulant,
    circulant_matmul_fft,
    circulant_projection,
    clear_forward_path_cache,
    expand_circulant,
    measure_forward_paths,
    residue_permutation,
    split_circulant_vectors,
)
from rlq.compress.circulant import circulant_vectors_exact, is_block_circulant_matrix


def setup_module(module):
    torch.set_default_dtype(torch.float64)  # tight tolerances below are easier in double precision


def teardown_module(module):
    torch.set_default_dtype(torch.float32)


def projection_by_loops(weight: torch.Tensor, b: int) -> torch.Tensor:
    """Average every cyclic diagonal with explicit Python loops (an independent implementation)."""
    out, inp = weight.shape[:2]
    vectors = torch.zeros(out // b, inp // b, b, *weight.shape[2:])
    for i in range(out // b):
        for j in range(inp // b):
            for r in range(b):
                for c in range(b):
                    vectors[i, j, (r - c) % b] += weight[i * b + r, j * b + c] / b
    return vectors


def expand_by_loops(vectors: torch.Tensor) -> torch.Tensor:
    n_out, n_in, b = vectors.shape[:3]
    weight = torch.zeros(n_out * b, n_in * b, *vectors.shape[3:])
    for i in range(n_out):
        for j in range(n_in):
            for r in range(b):
                for c in range(b):
                    weight[i * b + r, j * b + c] = vectors[i, j, (r - c) % b]
    return weight


@pytest.mark.parametrize(
    "shape, b", [((8, 12), 4), ((6, 4), 2), ((8, 8), 8), ((4, 8, 3, 3), 4), ((6, 6, 2), 3)]
)
def test_projection_matches_explicit_diagonal_averaging(shape, b):
    weight = torch.randn(shape)
    assert torch.allclose(circulant_projection(weight, b), projection_by_loops(weight, b), atol=1e-12)


EXPAND_SHAPES = [
    (2, 3, 4),
    (1, 1, 5),
    (2, 2, 3, 3, 3),
    (3, 2, 2),
    (2, 3, 8),
    (1, 2, 16),
    (2, 1, 1),
    (2, 2, 4, 1, 3),
]


@pytest.fixture(params=["default", "index map", "copies"])
def expansion_path(request, monkeypatch):
    """Run a test with the measured choice of paths, with the index map for every B, and with no index map."""
    if request.param == "index map":
        monkeypatch.setattr(circulant, "INDEX_EXPANSION_MAX_BLOCK", 10**6)
        monkeypatch.setattr(circulant, "INDEX_BACKWARD_MIN_BLOCK", 1)
    elif request.param == "copies":  # every weight counts as too large for an index map
        monkeypatch.setattr(circulant, "INDEX_EXPANSION_MAX_NUMEL", 0)
        monkeypatch.setattr(circulant, "INDEX_BACKWARD_MAX_NUMEL", 0)
    return request.param


# the copy path has two branches itself: B <= 4 by slices, larger by a gather
@pytest.mark.parametrize("shape", EXPAND_SHAPES)
def test_expand_matches_the_index_definition(shape, expansion_path):
    vectors = torch.randn(shape)
    assert torch.equal(expand_circulant(vectors), expand_by_loops(vectors))


@pytest.mark.parametrize("shape", EXPAND_SHAPES)
def test_expand_gradient_sums_each_cyclic_diagonal(shape, expansion_path):
    # expand_circulant has its own backward; the gradient must equal autograd through the loop definition
    vectors = torch.randn(shape, requires_grad=True)
    upstream = torch.randn(shape[0] * shape[2], shape[1] * shape[2], *shape[3:])
    (ours,) = torch.autograd.grad(expand_circulant(vectors), vectors, upstream)
    (reference,) = torch.autograd.grad(expand_by_loops(vectors), vectors, upstream)
    assert torch.allclose(ours, reference, atol=1e-12)
    assert torch.autograd.gradcheck(expand_circulant, (vectors.detach().clone().requires_grad_(),))


@pytest.mark.parametrize("shape", [(2, 3, 4), (3, 2, 8, 2, 2), (4, 5, 16), (100, 75, 4)])
def test_gathered_gradient_is_bit_for_bit_the_index_add_into_zeros(shape):
    """The backward's gather and row additions add in the order an index_add_ into zeros does, -0.0 included."""
    from rlq.compress.circulant import _cyclic_diagonal_sums, _expansion_index

    b = shape[2]
    grad = torch.randn(shape[0] * b, shape[1] * b, *shape[3:], generator=torch.Generator().manual_seed(0))
    grad[:b, :b] = -0.0  # a whole block: its vector entries sum only negative zeros
    index = _expansion_index(shape, grad.device)
    reference = grad.new_zeros(grad.numel() // b).index_add_(0, index, grad.reshape(-1)).view(shape)
    ours = _cyclic_diagonal_sums(grad, b)
    assert torch.equal(ours.view(torch.int32), reference.view(torch.int32))
    assert not torch.signbit(ours[0, 0]).any()


def test_projection_is_the_least_squares_solution():
    b = 4
    weight = torch.randn(b, b)
    # Basis of the circulant subspace: P_d has ones where (r - c) mod B == d.
    basis = torch.stack(
        [expand_by_loops(torch.eye(b)[d].reshape(1, 1, b)).reshape(-1) for d in range(b)], dim=1
    )
    coefficients = torch.linalg.lstsq(basis, weight.reshape(-1, 1)).solution.reshape(-1)
    assert torch.allclose(circulant_projection(weight, b).reshape(-1), coefficients, atol=1e-12)
    # And no other circulant matrix is nearer.
    best = torch.linalg.norm(expand_circulant(circulant_projection(weight, b)) - weight)
    for _ in range(20):
        other = circulant_projection(weight, b) + 0.01 * torch.randn(1, 1, b)
        assert torch.linalg.norm(expand_circulant(other) - weight) > best


def test_projection_is_idempotent_and_exact_on_block_circulant_matrices():
    weight = torch.randn(12, 8)
    once = expand_circulant(circulant_projection(weight, 4))
    twice = expand_circulant(circulant_projection(once, 4))
    assert torch.allclose(once, twice, atol=1e-12)
    vectors = torch.randn(3, 2, 4)
    assert torch.allclose(circulant_projection(expand_circulant(vectors), 4), vectors, atol=1e-12)
    assert torch.equal(circulant_vectors_exact(expand_circulant(vectors), 4), vectors)
    assert is_block_circulant_matrix(once, 4, atol=1e-12)
    assert not is_block_circulant_matrix(weight, 4)


def test_block_size_one_is_the_identity_and_block_size_n_is_one_circulant():
    weight = torch.randn(6, 6)
    assert torch.equal(expand_circulant(circulant_projection(weight, 1)), weight)
    assert circulant_projection(weight, 6).shape == (1, 1, 6)


@pytest.mark.parametrize("n_out, n_in, b, lead", [(3, 2, 4, (5,)), (2, 2, 16, (2, 3)), (4, 1, 3, ())])
def test_fft_product_equals_dense_product(n_out, n_in, b, lead):
    vectors = torch.randn(n_out, n_in, b)
    x = torch.randn(*lead, n_in * b)
    expected = x @ expand_circulant(vectors).T
    assert torch.allclose(circulant_matmul_fft(x, vectors), expected, atol=1e-10)


def test_fft_product_gradients_equal_dense_gradients():
    vectors = torch.randn(2, 3, 4, requires_grad=True)
    x = torch.randn(5, 12)
    (grad_fft,) = torch.autograd.grad(circulant_matmul_fft(x, vectors).square().sum(), vectors)
    (grad_dense,) = torch.autograd.grad((x @ expand_circulant(vectors).T).square().sum(), vectors)
    assert torch.allclose(grad_fft, grad_dense, atol=1e-10)


def test_residue_permutation_is_the_papers_reordering():
    assert residue_permutation(4, 4, 2).tolist() == [0, 2, 1, 3]
    assert residue_permutation(8, 4, 2).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    assert residue_permutation(6, 6, 3).tolist() == [0, 3, 1, 4, 2, 5]


@pytest.mark.parametrize("b, factor", [(4, 2), (8, 2), (8, 4), (6, 3), (6, 2)])
def test_reordered_circulant_splits_exactly(b, factor):
    vectors = torch.randn(2, 3, b)
    weight = expand_circulant(vectors)
    rows = residue_permutation(weight.shape[0], b, factor)
    cols = residue_permutation(weight.shape[1], b, factor)
    reordered = weight[rows][:, cols]
    assert is_block_circulant_matrix(reordered, b // factor)  # exactly, atol=0
    split = split_circulant_vectors(vectors, factor)
    assert split.shape == (2 * factor, 3 * factor, b // factor)
    assert torch.equal(expand_circulant(split), reordered)
    # Only moved: every split vector entry is one of the original entries.
    assert set(split.reshape(-1).tolist()) <= set(vectors.reshape(-1).tolist())
    # Without the reordering the split is not exact.
    assert not is_block_circulant_matrix(weight, b // factor)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: circulant_projection(torch.randn(4, 4), 0), "positive int"),
        (lambda: circulant_projection(torch.randn(4, 4), -2), "positive int"),
        (lambda: circulant_projection(torch.randn(4, 4), 2.0), "positive int"),
        (lambda: circulant_projection(torch.randn(6, 4), 4), "must divide"),
        (lambda: circulant_projection(torch.randn(4), 2), "at least 2 dimensions"),
        (lambda: expand_circulant(torch.randn(4, 4)), "shape"),
        (lambda: circulant_matmul_fft(torch.randn(2, 5), torch.randn(1, 1, 4)), "features"),
        (lambda: residue_permutation(8, 4, 3), "factor 3 must divide"),
    ],
)
def test_bad_inputs_raise_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_forward_path_is_measured_once_per_shape(monkeypatch):
    clear_forward_path_cache()
    calls = []
    import rlq.compress.circulant as circulant

    def fake_measure(*args, **kwargs):
        calls.append(args)
        return {"dense": 2.0, "fft": 1.0, "plain": 0.5}

    monkeypatch.setattr(circulant, "measure_forward_paths", fake_measure)
    assert choose_forward_path(CirculantCall(64, 64, 16, 8)) == "fft"
    assert choose_forward_path(CirculantCall(64, 64, 16, 8)) == "fft"
    assert len(calls) == 1
    assert choose_forward_path(CirculantCall(64, 64, 16, 9)) == "fft"
    assert len(calls) == 2
    clear_forward_path_cache()


def test_measure_forward_paths_times_every_path():
    seconds = measure_forward_paths(CirculantCall(16, 16, 4, 2), repeats=1, warmup=0)
    assert set(seconds) == {"dense", "fft", "plain"} and all(t > 0 for t in seconds.values())
    seconds = measure_forward_paths(CirculantCall(16, 16, 4, 2, training=True), repeats=1, warmup=0)
    assert all(t > 0 for t in seconds.values())
    clear_forward_path_cache()
    assert choose_forward_path(CirculantCall(16, 16, 4, 2), repeats=1) in ("dense", "fft")
