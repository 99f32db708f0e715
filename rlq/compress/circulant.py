"""Block-circulant matrices as plain tensor math: projection, expansion, exact block splitting, FFT product.

Layout used everywhere in :mod:`rlq.compress`: a weight of shape ``(out, in, *kernel)`` (``kernel`` is
empty for ``nn.Linear``, ``(kh, kw)`` for ``nn.Conv2d``) is cut into ``B x B`` blocks over its first two
dimensions; block ``(i, j)`` is circulant and defined by one B-vector, so the layer is stored as
``vectors`` of shape ``(out/B, in/B, B, *kernel)`` with

    weight[i*B + r, j*B + c, ...] = vectors[i, j, (r - c) mod B, ...]

i.e. ``vectors[i, j]`` is the first column of block ``(i, j)``. Every kernel position of a convolution
is an independent block-circulant matrix over (out_channels, in_channels).
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from rlq.core.kernels import kernel_readable, kernels_switched_on
from rlq.core.validation import check_non_negative_int, check_positive_int


def check_block_size(block_size: int) -> int:
    """Return ``block_size`` if it is a positive int, else raise ValueError saying what was given."""
    return check_positive_int("block_size", block_size)


def _check_divides(shape: torch.Size | tuple[int, ...], block_size: int) -> tuple[int, int]:
    if len(shape) < 2:
        raise ValueError(f"a block-circulant weight needs at least 2 dimensions, got shape {tuple(shape)}")
    out, inp = shape[0], shape[1]
    if out % block_size or inp % block_size:
        raise ValueError(
            f"block_size {block_size} must divide both leading dimensions of the weight, "
            f"got shape {tuple(shape)}"
        )
    return out // block_size, inp // block_size


def expand_circulant(vectors: Tensor) -> Tensor:
    """Return the dense ``(out, in, *kernel)`` weight that B-vectors ``(out/B, in/B, B, *kernel)`` define."""
    if vectors.dim() < 3:
        raise ValueError(f"vectors must have shape (out/B, in/B, B, *kernel), got {tuple(vectors.shape)}")
    if torch.is_grad_enabled() and vectors.requires_grad:
        return _ExpandCirculant.apply(vectors)
    return _expand(vectors)


INDEX_EXPANSION_MAX_NUMEL = 1 << 22
"""Largest dense weight (in entries) expanded through a cached index map; larger ones use strided copies.

An index map costs 8 bytes per dense entry (32 MiB at this bound), so layers above it (AlexNet's 9216x4096
classifier) are expanded by :func:`_expand_by_copies` instead, which needs no extra memory.
"""
INDEX_EXPANSION_MAX_BLOCK = 8
"""Largest B expanded through the index map. Measured on CPU (one thread, 256 to 2048 wide): the map is
1.3x to 2.5x faster than the copy paths for B = 2 to 8 (400x300, B = 4: 69 against 151 us), but for
B >= 16 the windowed gather of :func:`_expand_by_copies` is as fast at 256 wide and 1.5x to 2x faster
from 512 wide."""
INDEX_BACKWARD_MIN_BLOCK = 4
INDEX_BACKWARD_MAX_NUMEL = 1 << 18
"""The backward sums cyclic diagonals through the index map (one gather and B - 1 row additions) when
B >= INDEX_BACKWARD_MIN_BLOCK and the weight has at most this many entries (512x512), else by slice
additions. Measured as above with an ``index_add_`` through the map (the gather is faster still): 1.2x to
3.6x faster than the slices for B = 4 to 16 at 256 wide (400x300, B = 4: 142 against 171 us) and as fast at 512
wide, but slower for B = 2 at every size and for every B from 768 wide."""


try:  # built by setup.py where a C compiler is present; optional
    from rlq.compress import _circulant_kernels
except ImportError:  # pragma: no cover - depends on the install
    _circulant_kernels = None

KERNEL_BLOCK_SIZES = (2, 4, 8)
"""Block sizes the compiled kernels (``rlq/compress/_circulant_kernels.c``) handle, for float32 Linear
layouts on CPU. Measured side by side (``benchmarks/bench_circulant_kernels.py``, load 1.0): at 400x300,
B = 4, one thread, the expansion takes 8.4 us against the index map's 41 (4.9x) and the gradient sums 7.6
against 62 (8.1x); 4-6x and 7-11x for B = 2 and 4 from 256 to 1024 wide, 1.5-2.6x for B = 8. Results are
bit for bit the same."""
USE_KERNELS = kernels_switched_on("RLQ_CIRCULANT_KERNELS")
"""Whether to use the compiled kernels when they are built (set ``RLQ_CIRCULANT_KERNELS=0`` to compare)."""


def kernels_available() -> bool:
    """Return whether the compiled block-circulant kernels were built with this install of rlq."""
    return _circulant_kernels is not None


def _kernel_fits(x: Tensor, block_size: int) -> bool:
    """Return whether a compiled kernel takes ``x`` (:func:`rlq.core.kernels.kernel_readable`) at this B."""
    return (
        USE_KERNELS
        and _circulant_kernels is not None
        and block_size in KERNEL_BLOCK_SIZES
        and kernel_readable(x)
    )


def _expand(vectors: Tensor) -> Tensor:
    n_out, n_in, b = vectors.shape[:3]
    shape = (n_out * b, n_in * b, *vectors.shape[3:])
    if vectors.dim() == 3 and _kernel_fits(vectors, b):
        dense = torch.empty(shape, dtype=vectors.dtype)
        _circulant_kernels.expand_f32(vectors.data_ptr(), dense.data_ptr(), n_out, n_in, b)
        return dense
    if b > INDEX_EXPANSION_MAX_BLOCK or vectors.numel() * b > INDEX_EXPANSION_MAX_NUMEL:
        return _expand_by_copies(vectors)
    # One gather through a cached map from dense entries to vector entries, one op instead of 2B
    index = _expansion_index(tuple(vectors.shape), vectors.device)
    return vectors.reshape(-1).index_select(0, index).view(shape)


@functools.lru_cache(maxsize=64)
def _expansion_index(shape: tuple[int, ...], device: torch.device) -> Tensor:
    """Return, for every entry of the dense weight (flattened), the flat index of its B-vector entry."""
    positions = torch.arange(math.prod(shape), dtype=torch.int64).view(shape)
    return _expand_by_copies(positions).reshape(-1).to(device)


def clear_expansion_index_cache() -> None:
    """Forget the index maps cached for expanding B-vectors and their gradients (rebuilt on the next use)."""
    _expansion_index.cache_clear()
    _gradient_index.cache_clear()


SLICE_EXPANSION_MAX_BLOCK = 4
"""Largest B expanded by slice copies; larger blocks use one gather (each measured faster there, on CPU)."""


def _expand_by_copies(vectors: Tensor) -> Tensor:
    """Return the dense expansion built by strided copies, with no index map (any dtype, any size)."""
    n_out, n_in, b = vectors.shape[:3]
    kernel = vectors.shape[3:]
    if b <= SLICE_EXPANSION_MAX_BLOCK:
        # Row r of a block is v[(r - c) mod B] over c; with the reversed vector u[e] = v[B-1-e] that is
        # u[(B-1-r+c) mod B], increasing in c: two contiguous slices of u per row, 2B copies in all
        # (1.4x to 3x faster than the gather below for B = 2 and 4 at 256 to 512 wide).
        reversed_vectors = vectors.flip(2).reshape(n_out, n_in, b, -1)
        out = vectors.new_empty(n_out, b, n_in, b, reversed_vectors.shape[-1])
        for r in range(b):
            s = b - 1 - r
            out[:, r, :, : b - s] = reversed_vectors[:, :, s:]
            if s:
                out[:, r, :, b - s :] = reversed_vectors[:, :, :s]
        return out.reshape(n_out * b, n_in * b, *kernel)
    # Row r of a block is the window z[B-1-r : 2B-1-r] of z = flip(cat(v, v)). Windows are a view
    # (unfold); one index_select then writes the final layout (about 1.6x faster than advanced indexing).
    n_kernel = len(kernel)
    last = vectors.movedim(2, -1)  # (n_out, n_in, *kernel, B)
    doubled = torch.cat([last, last], dim=-1).flip(-1)
    windows = doubled.unfold(-1, b, 1)  # (n_out, n_in, *kernel, window, c)
    # to (n_out, window, n_in, c, *kernel): the final layout once the window index is reversed
    windows = windows.permute(0, 2 + n_kernel, 1, 3 + n_kernel, *range(2, 2 + n_kernel))
    rows = torch.arange(b - 1, -1, -1, device=vectors.device)  # row r uses window B-1-r
    return windows.index_select(1, rows).reshape(n_out * b, n_in * b, *kernel)


def _cyclic_diagonal_sums(grad: Tensor, block_size: int) -> Tensor:
    """Return ``g[i, j, d, ...] = sum_r grad[i*B + r, j*B + (r - d) mod B, ...]``: the B-vectors' gradient.

    The adjoint of :func:`_expand`: the compiled kernel where it applies (:func:`_kernel_fits`), else one
    gather of the dense gradient by the inverse of the same index map and B - 1 row additions, or the slice
    sums of :func:`_cyclic_diagonal_sums_by_slices`, whichever measured faster for this B and size (see
    :data:`INDEX_BACKWARD_MAX_NUMEL`).
    """
    b = block_size
    vector_shape = (grad.shape[0] // b, grad.shape[1] // b, b, *grad.shape[2:])
    if grad.dim() == 2 and _kernel_fits(grad, b):
        sums = torch.empty(vector_shape, dtype=grad.dtype)
        _circulant_kernels.cyclic_sums_f32(
            grad.data_ptr(), sums.data_ptr(), vector_shape[0], vector_shape[1], b
        )
        return sums
    if b < INDEX_BACKWARD_MIN_BLOCK or grad.numel() > INDEX_BACKWARD_MAX_NUMEL:
        return _cyclic_diagonal_sums_by_slices(grad, b)
    # One gather puts the B dense entries of every vector entry in B rows; adding the rows in order from a
    # zero start is the same sum, bit for bit, as an index_add_ of the dense gradient into zeros (which
    # adds in dense order), and 1.1x to 1.7x faster than it (400x300, B = 4: 131 against 195 us, loaded).
    rows = grad.reshape(-1).index_select(0, _gradient_index(vector_shape, grad.device)).view(b, -1)
    sums = rows[0] + 0.0  # 0.0 + x, as index_add_ starts: -0.0 becomes 0.0
    for r in range(1, b):
        sums += rows[r]
    return sums.view(vector_shape)


@functools.lru_cache(maxsize=64)
def _gradient_index(shape: tuple[int, ...], device: torch.device) -> Tensor:
    """Return the dense positions of every B-vector entry, as B rows in increasing dense order (flattened)."""
    index = _expansion_index(shape, torch.device("cpu"))
    positions = torch.argsort(index, stable=True).view(-1, shape[2])  # each vector entry has B positions
    return positions.t().contiguous().reshape(-1).to(device)


def _cyclic_diagonal_sums_by_slices(grad: Tensor, block_size: int) -> Tensor:
    """Return the same sums as :func:`_cyclic_diagonal_sums` by 2B strided slice additions, with no index map.

    In reversed order ``e = B - 1 - d`` the column is ``(r + 1 + e) mod B``, which increases with e: row r
    adds two contiguous column slices of its block, so the sum is 2B strided slice additions on views of
    ``grad`` and one small flip, with no copy of ``grad``.
    """
    b = block_size
    n_out, n_in = grad.shape[0] // b, grad.shape[1] // b
    kernel = grad.shape[2:]
    blocks = grad.reshape(n_out, b, n_in, b, -1)  # (i, r, j, c, kernel)
    reversed_sums = blocks[:, b - 1].clone()  # row B-1: column (B + e) mod B = e
    for r in range(b - 1):
        s = r + 1  # reversed_sums[..., e] += blocks[:, r, :, (s + e) mod B]
        reversed_sums[:, :, : b - s] += blocks[:, r, :, s:]
        reversed_sums[:, :, b - s :] += blocks[:, r, :, :s]
    return reversed_sums.flip(2).reshape(n_out, n_in, b, *kernel)


class _ExpandCirculant(torch.autograd.Function):
    """:func:`expand_circulant` with a backward that sums cyclic diagonals directly (first order only).

    ``dense``, when given, is the expansion of ``vectors`` computed earlier (:class:`ExpansionCache`): the
    output aliases it instead of expanding again; the gradient is the same linear adjoint either way.
    """

    @staticmethod
    def forward(ctx, vectors: Tensor, dense: Tensor | None = None) -> Tensor:  # type: ignore[override]
        ctx.block_size = vectors.shape[2]
        # detach(): a new tensor object for autograd to attach its node to, so the cached one stays a leaf
        return _expand(vectors) if dense is None else dense.detach()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return _cyclic_diagonal_sums(grad, ctx.block_size), None


def circulant_projection(weight: Tensor, block_size: int) -> Tensor:
    """Return the B-vectors of the block-circulant matrix nearest to ``weight`` in Frobenius norm.

    The nearest circulant block averages each cyclic diagonal of the dense block (the orthogonal projection
    onto the circulant subspace, whose basis, the cyclic shifts, is orthogonal). ``weight`` has shape
    ``(out, in, *kernel)``; the result has shape ``(out/B, in/B, B, *kernel)``.
    """
    check_block_size(block_size)
    n_out, n_in = _check_divides(weight.shape, block_size)
    kernel = weight.shape[2:]
    blocks = weight.reshape(n_out, block_size, n_in, block_size, *kernel).transpose(1, 2)  # (.., r, c, ..)
    r = torch.arange(block_size, device=weight.device)
    cols = (r[None, :] - r[:, None]) % block_size  # cols[d, r]: the column of diagonal d in row r
    return blocks[:, :, r[None, :].expand(block_size, -1), cols].mean(dim=3)


def circulant_vectors_exact(weight: Tensor, block_size: int) -> Tensor:
    """Return the B-vectors of a weight that is exactly block-circulant, read off without arithmetic.

    Unlike :func:`circulant_projection`, which averages B equal numbers (and may round in the last bit),
    this takes each block's first column, so ``expand_circulant`` of the result reproduces ``weight`` bit
    for bit. Only meaningful when ``weight`` is block-circulant.
    """
    check_block_size(block_size)
    n_out, n_in = _check_divides(weight.shape, block_size)
    kernel = weight.shape[2:]
    blocks = weight.reshape(n_out, block_size, n_in, block_size, *kernel)
    return blocks[:, :, :, 0].transpose(1, 2).contiguous()  # first column of each block: (n_out, n_in, B, ..)


def is_block_circulant_matrix(weight: Tensor, block_size: int, atol: float = 0.0) -> bool:
    """Return whether ``weight`` is block-circulant with block size B to within ``atol`` (every entry).

    Compares the weight with the expansion of its blocks' first columns, so ``atol=0`` is an exact test.
    """
    try:
        vectors = circulant_vectors_exact(weight, block_size)
    except ValueError:
        return False
    return bool(torch.allclose(expand_circulant(vectors), weight, rtol=0.0, atol=atol))


def residue_permutation(size: int, block_size: int, factor: int = 2) -> Tensor:
    """Return the index permutation that reorders every B-block of ``size`` units by residue mod ``factor``.

    Inside each block the order becomes ``[0, f, 2f, ..., 1, f+1, ...]`` (for B=4, f=2: ``[0, 2, 1, 3]``).
    Applied to both the rows and the columns of a B-block-circulant matrix, it yields an exactly
    (B/f)-block-circulant matrix: entry ``(f*a + p, f*b + q)`` of a circulant block is
    ``v[(f*(a - b) + p - q) mod B]``, which for fixed residues ``p, q`` depends on ``a - b`` mod B/f only.
    """
    check_block_size(block_size)
    check_positive_int("factor", factor)
    if block_size % factor:
        raise ValueError(f"factor {factor} must divide block_size {block_size}")
    if size % block_size:
        raise ValueError(f"block_size {block_size} must divide the number of units {size}")
    within = torch.arange(block_size).reshape(block_size // factor, factor).t().reshape(-1)
    starts = torch.arange(0, size, block_size)
    return (starts[:, None] + within[None, :]).reshape(-1)


def split_circulant_vectors(vectors: Tensor, factor: int = 2) -> Tensor:
    """Return the (B/f)-vectors of the same matrix after :func:`residue_permutation` of its rows and columns.

    Exact: the values are only moved (each entry of ``vectors`` appears f times in the result), so the
    split has zero parameter shift. Works on masks as well as on values.
    """
    if vectors.dim() < 3:
        raise ValueError(f"vectors must have shape (out/B, in/B, B, *kernel), got {tuple(vectors.shape)}")
    n_out, n_in, block_size = vectors.shape[:3]
    weight = expand_circulant(vectors)
    rows = residue_permutation(n_out * block_size, block_size, factor).to(vectors.device)
    cols = residue_permutation(n_in * block_size, block_size, factor).to(vectors.device)
    return circulant_vectors_exact(weight[rows][:, cols], block_size // factor)


def circulant_matmul_fft(x: Tensor, vectors: Tensor) -> Tensor:
    """Return ``x @ expand_circulant(vectors).T`` computed with real FFTs of length B (Linear layout only).

    Each circulant block acts as a circular convolution with its B-vector, so in the frequency domain a
    layer is ``Y_i = sum_j V_ij * X_j`` per frequency. ``x`` has shape ``(..., in)``, ``vectors``
    ``(out/B, in/B, B)``; the result has shape ``(..., out)``.
    """
    if vectors.dim() != 3:
        raise ValueError(
            f"the FFT product needs Linear vectors of shape (out/B, in/B, B), got {tuple(vectors.shape)}"
        )
    n_out, n_in, block_size = vectors.shape
    if x.shape[-1] != n_in * block_size:
        raise ValueError(
            f"input has {x.shape[-1]} features, the block-circulant weight expects {n_in * block_size}"
        )
    lead = x.shape[:-1]
    x_freq = torch.fft.rfft(x.reshape(*lead, n_in, block_size), dim=-1)  # (..., n_in, F)
    v_freq = torch.fft.rfft(vectors, dim=-1)  # (n_out, n_in, F)
    y_freq = torch.einsum("...jf,ijf->...if", x_freq, v_freq)
    y = torch.fft.irfft(y_freq, n=block_size, dim=-1)  # (..., n_out, B)
    return y.reshape(*lead, n_out * block_size)


def _median_seconds(fn, repeats: int, warmup: int, sync) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclass(frozen=True)
class CirculantCall:
    """One block-circulant Linear layer applied to one batch: what decides which forward path is faster.

    Hashable, so that :func:`choose_forward_path` memoises its measurement per call shape.
    """

    out_features: int
    """Output width of the layer."""
    in_features: int
    """Input width of the layer."""
    block_size: int
    """B, the side of each circulant block."""
    batch: int
    """Rows in the batch."""
    training: bool = False
    """Whether each call also runs the backward pass to the B-vectors and the input."""
    device: torch.device = torch.device("cpu")
    """Where the tensors live (a string such as ``"cuda:0"`` is converted)."""
    dtype: torch.dtype = torch.float32
    """The tensors' floating-point type."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", torch.device(self.device))


def measure_forward_paths(call: CirculantCall, *, repeats: int = 5, warmup: int = 1) -> dict[str, float]:
    """Return median seconds per call of each way to apply one block-circulant Linear layer to a batch.

    Keys: ``"dense"`` (expand the B-vectors to a dense weight, then one matmul: rlq's default forward path),
    ``"fft"`` (:func:`circulant_matmul_fft`) and ``"plain"`` (a matmul with an already dense weight: what
    an uncompressed ``nn.Linear`` costs, for reference). With ``call.training`` each call also runs the
    backward pass to the B-vectors and the input.
    """
    out_features, in_features, block_size = call.out_features, call.in_features, call.block_size
    batch, training, device, dtype = call.batch, call.training, call.device, call.dtype
    check_block_size(block_size)
    _check_divides((out_features, in_features), block_size)
    check_positive_int("batch", batch)
    check_positive_int("repeats", repeats)
    check_non_negative_int("warmup", warmup)
    generator = torch.Generator().manual_seed(0)
    shape = (out_features // block_size, in_features // block_size, block_size)
    vectors = torch.randn(shape, generator=generator, dtype=dtype).to(device).requires_grad_(training)
    dense_weight = expand_circulant(vectors.detach()).requires_grad_(training)
    x = torch.randn(batch, in_features, generator=generator, dtype=dtype).to(device).requires_grad_(training)

    def run(compute):
        def once():
            y = compute()
            if training:
                y.sum().backward()

        return once

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    paths = {
        "dense": lambda: torch.nn.functional.linear(x, expand_circulant(vectors)),
        "fft": lambda: circulant_matmul_fft(x, vectors),
        "plain": lambda: torch.nn.functional.linear(x, dense_weight),
    }
    with torch.set_grad_enabled(training):
        return {name: _median_seconds(run(fn), repeats, warmup, sync) for name, fn in paths.items()}


class ForwardPathCache:
    """Measured choices of forward path per layer shape, so each shape is timed once per process.

    Like cuDNN's benchmark mode, this is a memo of measurements of this machine, not experiment state;
    :func:`choose_forward_path` uses one shared instance, which :func:`clear_forward_path_cache` empties.
    """

    def __init__(self) -> None:
        self.choices: dict[CirculantCall, str] = {}

    def clear(self) -> None:
        """Forget every measured choice."""
        self.choices.clear()


_FORWARD_PATHS = ForwardPathCache()


def clear_forward_path_cache() -> None:
    """Forget every forward-path choice measured so far in this process."""
    _FORWARD_PATHS.clear()


def choose_forward_path(call: CirculantCall, *, repeats: int = 3) -> str:
    """Return ``"dense"`` or ``"fft"``, whichever measured faster for this call shape.

    Both paths are timed once (median of ``repeats`` calls, see :func:`measure_forward_paths`) the first
    time a call shape is asked for; the decision is cached per :class:`CirculantCall`.
    Ties go to ``"dense"``, rlq's default.
    """
    choice = _FORWARD_PATHS.choices.get(call)
    if choice is None:
        seconds = measure_forward_paths(call, repeats=repeats)
        choice = "fft" if seconds["fft"] < seconds["dense"] else "dense"
        _FORWARD_PATHS.choices[call] = choice
    return choice
