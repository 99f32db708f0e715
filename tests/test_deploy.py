"""rlq.deploy's compiled policies against the PyTorch forward of the same modules, kernels on and off."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rlq.compress import block_circulant_, circulant_vectors, magnitude_prune_
from rlq.compress.masks import prune_with_mask_
from rlq.deploy import FP32_RTOL, compile_policy, error_bound, kernels_available
from rlq.deploy import runtime as deploy_runtime
from rlq.deploy.formats import SPARSE_BLOCKS, DenseI8, SparseI8
from rlq.deploy.frequency import Circulant

BLOCK_SIZES = (2, 4, 8, 16, 32)
PRECISIONS = [("fp32", None), ("int8", None), ("int8", "int16"), ("fp32", "int8")]


def mlp(widths=(17, 64, 64, 64, 6), last=nn.Tanh, seed=0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1], last())


def torch_forward(module: nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return module(torch.from_numpy(x)).numpy()


def inputs(n=32, dim=17, seed=1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def expand_by_loops(vectors: torch.Tensor) -> torch.Tensor:
    """Return the dense weight entry by entry from rlq's definition weight[iB+r, jB+c] = v[i, j, (r-c) mod B]."""
    n_out, n_in, b = vectors.shape
    weight = torch.empty(n_out * b, n_in * b)
    for r in range(b):
        for c in range(b):
            weight[r::b, c::b] = vectors[:, :, (r - c) % b]
    return weight


def assert_fp32_close(y: np.ndarray, ref: np.ndarray) -> None:
    """float32 storage: within FP32_RTOL of the largest output magnitude."""
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(y, ref, rtol=0, atol=FP32_RTOL * scale)


def test_the_kernels_are_built():
    # make venv (pip install -e .) compiles them; without a C compiler compiled policies run in NumPy
    assert kernels_available(), "rlq.deploy._policy_kernels was not built (no C compiler?)"


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_frequency_domain_layer_is_rlqs_dense_expansion(block_size, use_kernels):
    # the circulant convention: one block-circulant Linear against its expansion entry by entry
    torch.manual_seed(block_size)
    layer = nn.Linear(64, 96)
    block_circulant_(nn.Sequential(layer), block_size, skip_first_last=False)
    x = inputs(9, 64)
    expected = x @ expand_by_loops(circulant_vectors(layer).detach()).numpy().T + layer.bias.detach().numpy()
    compiled = compile_policy(nn.Sequential(layer), use_kernels=use_kernels)
    assert isinstance(compiled.ops[0], Circulant) and compiled.compiled == use_kernels
    assert_fp32_close(compiled(x), expected)
    assert_fp32_close(compiled(x), torch_forward(nn.Sequential(layer), x))


@pytest.mark.parametrize("precision,circulant", PRECISIONS)
@pytest.mark.parametrize("block_size", [4, 16])
def test_outputs_are_within_the_documented_bound(precision, circulant, block_size, use_kernels):
    model = mlp()
    block_circulant_(model, block_size)
    compiled = compile_policy(model, precision, circulant_precision=circulant, use_kernels=use_kernels)
    x = inputs()
    y, ref = compiled(x), torch_forward(model, x)
    exact, bound = error_bound(model, compiled, x)
    assert np.all(np.abs(y - ref) <= bound), float(np.max(np.abs(y - ref) - bound))
    assert np.all(np.abs(ref - exact) <= bound)  # PyTorch's own float32 rounding is within the allowance
    if precision == "fp32" and circulant is None:
        assert_fp32_close(y, ref)
    else:
        assert 0 < np.abs(y - ref).max() < 0.05 * np.abs(ref).max()  # quantized, and not broken


def test_the_bound_after_relu_and_tanh_is_the_step_to_the_ends_of_the_input_interval(use_kernels):
    """A saturated tanh and a ReLU unit held off pass almost none of their input's bound on."""
    from rlq.deploy.bounds import _activated

    y, b = np.array([[50.0, 0.0, -10.0, 0.3]]), np.array([[5.0, 0.5, 3.0, 0.2]])
    out, bound = _activated(y, b, "tanh")
    ends = np.abs(np.tanh(np.stack([y - b, y + b])) - np.tanh(y)).max(axis=0)  # tanh is monotone: its ends
    np.testing.assert_allclose(bound, ends + FP32_RTOL * np.abs(np.tanh(y)))  # and tanhf's rounding
    assert bound[0, 0] == pytest.approx(FP32_RTOL) and bound[0, 1] == pytest.approx(np.tanh(0.5))
    _, relu = _activated(y, b, "relu")
    np.testing.assert_allclose(relu, [[5.0, 0.5, 0.0, 0.2]])  # -10 +- 3 stays off; 0 +- 0.5 moves up by 0.5
    # end to end: a last layer driven deep into tanh's saturation keeps the actions' bound near 0
    model = mlp((17, 32, 6))
    with torch.no_grad():
        model[-2].bias.fill_(40.0)
    compiled = compile_policy(model, "int8", use_kernels=use_kernels)
    x = inputs()
    _, bounded = error_bound(model, compiled, x)
    assert np.all(np.abs(compiled(x) - torch_forward(model, x)) <= bounded)
    assert bounded.max() < 2e-5  # tanhf's rounding of 1.0 (0.21 when the bound passed through tanh whole)


def dense_int8_reference(layer: nn.Linear, x: np.ndarray) -> np.ndarray:
    """The documented int8 arithmetic in PyTorch: weights per output row, input rows asymmetric uint8."""
    w = layer.weight.detach()
    w_scale = w.abs().amax(dim=1, keepdim=True) / 127
    w_scale = torch.where(w_scale > 0, w_scale, torch.ones_like(w_scale))  # an all-zero row
    w_hat = torch.round(w / w_scale).clamp(-127, 127) * w_scale
    t = torch.from_numpy(x)
    lo, hi = t.amin(dim=1, keepdim=True).clamp(max=0), t.amax(dim=1, keepdim=True).clamp(min=0)
    s = (hi - lo) / 255
    s = torch.where(s > 0, s, torch.ones_like(s))
    z = torch.round(-lo / s).clamp(0, 255)
    x_hat = (torch.clamp(torch.round(t / s) + z, 0, 255) - z) * s
    return F.linear(x_hat.double(), w_hat.double(), layer.bias.detach().double()).float().numpy()


@pytest.mark.parametrize("block", SPARSE_BLOCKS)
def test_every_sparse_block_shape_computes_the_documented_arithmetic(block, use_kernels):
    # 64-byte blocks (16x4, 8x8, 4x16) take the kernels' vector path, the others their plain loops
    torch.manual_seed(1)
    layer = nn.Linear(250, 150)  # neither a whole number of blocks nor of accumulator steps
    rows, cols = block
    keep = torch.rand(-(-150 // rows), -(-250 // cols)) < 0.2
    full = keep.repeat_interleave(rows, 0).repeat_interleave(cols, 1).float()
    prune_with_mask_(layer, "weight", full[:150, :250])
    compiled = compile_policy(nn.Sequential(layer), "int8", sparse_block=block, use_kernels=use_kernels)
    op = compiled.ops[0]
    assert isinstance(op, SparseI8) and op.block == block
    x = inputs(16, 250, seed=2)
    x[3] = np.abs(x[3])  # a row with no negative value
    reference = dense_int8_reference(layer, x)
    y = compiled(x)
    np.testing.assert_allclose(y, reference, rtol=0, atol=1e-5 * np.abs(reference).max())
    if use_kernels:  # a batch is its rows, bit for bit
        np.testing.assert_array_equal(y, np.concatenate([compiled(x[i : i + 1]) for i in range(len(x))]))


@pytest.mark.parametrize("mask", ["dense", "blocks16x4", "blocks4x16"])
def test_int8_layers_compute_the_documented_arithmetic(mask, use_kernels):
    torch.manual_seed(0)
    layer = nn.Linear(250, 150)  # neither a whole number of blocks nor of accumulator steps
    if mask != "dense":
        rows, cols = (16, 4) if mask == "blocks16x4" else (4, 16)
        keep = torch.rand(-(-150 // rows), -(-250 // cols)) < 0.1
        full = keep.repeat_interleave(rows, 0).repeat_interleave(cols, 1).float()
        prune_with_mask_(layer, "weight", full[:150, :250])
    compiled = compile_policy(nn.Sequential(layer), "int8", use_kernels=use_kernels)
    op = compiled.ops[0]
    assert isinstance(op, DenseI8 if mask == "dense" else SparseI8)
    if mask != "dense":
        assert op.block == (16, 4) if mask == "blocks16x4" else op.block in ((4, 16), (4, 4))
    x = inputs(16, 250)
    x[3] = 0.0  # an all-zero row
    x[4] = np.abs(x[4])  # a row with no negative value
    reference = dense_int8_reference(layer, x)
    np.testing.assert_allclose(compiled(x), reference, rtol=0, atol=1e-5 * np.abs(reference).max())


def test_kernels_and_fallback_agree_on_every_kernel():
    if not kernels_available():
        pytest.skip("rlq.deploy._policy_kernels is not built")
    model = mlp((17, 128, 128, 128, 128, 6))
    block_circulant_(model[2], 8, skip_first_last=False)
    rows = torch.rand(128 // 16, 128 // 4) < 0.2
    prune_with_mask_(model[4], "weight", rows.repeat_interleave(16, 0).repeat_interleave(4, 1).float())
    x = inputs()
    for precision, circulant in PRECISIONS:
        fast = compile_policy(model, precision, circulant_precision=circulant)
        slow = compile_policy(model, precision, circulant_precision=circulant, use_kernels=False)
        assert fast.compiled and not slow.compiled
        assert [op.kernel for op in fast.ops] == [op.kernel for op in slow.ops]
        _, bound = error_bound(model, fast, x)
        assert np.all(np.abs(fast(x) - slow(x)) <= 2 * bound)
        if circulant != "int8":  # int8 DFT codes may round the other way at a boundary (float order)
            np.testing.assert_allclose(fast(x), slow(x), rtol=0, atol=1e-5)


def test_the_environment_variable_forces_the_fallback(monkeypatch):
    monkeypatch.setattr(deploy_runtime, "USE_KERNELS", False)
    model = mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # asked for: no warning
        compiled = compile_policy(model)
    assert not compiled.compiled
    assert_fp32_close(compiled(inputs()), torch_forward(model, inputs()))


def test_without_the_compiled_module_everything_runs_in_numpy(monkeypatch):
    monkeypatch.setattr(deploy_runtime, "_policy_kernels", None)  # as an install without a C compiler
    monkeypatch.setattr(deploy_runtime, "_fallback_warned", [False])
    assert not kernels_available()
    model = mlp()
    block_circulant_(model, 16)
    with pytest.warns(RuntimeWarning, match="NumPy fallback") as caught:
        compiled = compile_policy(model, "int8", use_kernels=True)
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process: the second compile is silent
        compile_policy(model, "int8")
        compile_policy(model, use_kernels=False)
    assert not compiled.compiled
    _, bound = error_bound(model, compiled, inputs())
    assert np.all(np.abs(compiled(inputs()) - torch_forward(model, inputs())) <= bound)


def test_pruned_layers_go_block_sparse_only_where_their_zeros_fill_blocks():
    model = mlp((17, 256, 256, 256, 6))
    magnitude_prune_(model, 0.5)  # unstructured: too many blocks keep something
    assert [op.kernel for op in compile_policy(model, "int8").ops[:3]] == ["dense_int8"] * 3
    model = mlp((17, 256, 256, 256, 6))
    keep = torch.rand(256 // 16, 256 // 4) < 0.05
    prune_with_mask_(model[2], "weight", keep.repeat_interleave(16, 0).repeat_interleave(4, 1).float())
    op = compile_policy(model, "int8").ops[1]
    assert isinstance(op, SparseI8) and op.block == (16, 4)
    assert op.weight_bytes() < 0.15 * 256 * 256
    forced = compile_policy(model, "int8", sparse_block=(1, 4)).ops[1]
    assert isinstance(forced, SparseI8) and forced.block == (1, 4)
    assert isinstance(compile_policy(model, "fp32").ops[1], type(compile_policy(mlp(), "fp32").ops[1]))


def test_choose_block_is_the_first_shape_that_fits_by_an_exhaustive_search():
    from rlq.deploy.formats import SPARSE_BLOCKS, choose_block

    def exhaustive(nonzero, max_density):  # every candidate's kept blocks counted, here with numpy alone
        for rows, cols in SPARSE_BLOCKS:
            out, inp = nonzero.shape
            padded = np.zeros((-(-out // rows) * rows, -(-inp // cols) * cols), bool)
            padded[:out, :inp] = nonzero
            kept = padded.reshape(padded.shape[0] // rows, rows, padded.shape[1] // cols, cols).any(
                axis=(1, 3)
            )
            stored = int(kept.sum()) * rows * cols
            if stored <= 1.25 * max(int(nonzero.sum()), 1) and stored <= max_density * nonzero.size:
                return rows, cols
        return None

    rng = np.random.default_rng(0)
    blocky = np.kron(rng.random((6, 10)) < 0.3, np.ones((16, 4), bool))[:90]  # whole 16x4 blocks, cropped
    for density in (0.02, 0.3, 0.49, 0.51, 0.9, 0.999):
        for nonzero in (rng.random((90, 40)) < density, blocky & (rng.random((90, 40)) < density * 2)):
            for max_density in (0.5, 0.25):
                assert choose_block(nonzero, max_density=max_density) == exhaustive(nonzero, max_density)
    assert choose_block(blocky) == (16, 4)


def test_with_a_vector_path_the_fewest_64_byte_blocks_win_by_an_exhaustive_search():
    from rlq.deploy.formats import SPARSE_BLOCKS, VECTOR_BLOCKS, choose_block

    def exhaustive(nonzero, max_density):  # each 64-byte shape's kept blocks counted with numpy alone
        best = None
        for rows, cols in VECTOR_BLOCKS:
            out, inp = nonzero.shape
            padded = np.zeros((-(-out // rows) * rows, -(-inp // cols) * cols), bool)
            padded[:out, :inp] = nonzero
            kept = int(padded.reshape(-1, rows, padded.shape[1] // cols, cols).any(axis=(1, 3)).sum())
            if best is None or kept < best[0]:
                best = (kept, (rows, cols))
        return best[1] if best[0] * 64 <= max_density * nonzero.size else None

    assert all(rows * cols == 64 for rows, cols in VECTOR_BLOCKS) and set(VECTOR_BLOCKS) <= set(SPARSE_BLOCKS)
    rng = np.random.default_rng(1)
    for shape in ((16, 4), (8, 8), (4, 16)):
        structured = np.kron(rng.random((96 // shape[0], 64 // shape[1])) < 0.2, np.ones(shape, bool))
        for density in (0.02, 0.3, 0.7, 1.0):
            for nonzero in (rng.random((96, 64)) < density, structured & (rng.random((96, 64)) < density)):
                for max_density in (0.5, 0.25):
                    found = choose_block(nonzero, max_density=max_density, vector_blocks=True)
                    assert found == exhaustive(nonzero, max_density) or (
                        found is None and nonzero.sum() > max_density * nonzero.size
                    )
        assert choose_block(structured, vector_blocks=True) == shape


def test_the_kernels_keep_64_byte_blocks_where_the_loops_take_smaller_ones(use_kernels):
    # whole 16x4 blocks kept, a third of each kept block's rows zero (units that lost every incoming weight):
    # 16x4 then stores 1.5 times the nonzero entries, which plain loops refuse and the vector path takes
    torch.manual_seed(4)
    model = mlp((17, 256, 256, 6))
    keep = torch.rand(256 // 16, 256 // 4) < 0.1
    mask = keep.repeat_interleave(16, 0).repeat_interleave(4, 1).float()
    mask[torch.arange(256) % 3 == 0] = 0.0
    prune_with_mask_(model[2], "weight", mask)
    compiled = compile_policy(model, "int8", use_kernels=use_kernels)
    op = compiled.ops[1]
    assert isinstance(op, SparseI8)
    assert op.block == ((16, 4) if deploy_runtime.vector_blocks(use_kernels) else (1, 4))
    x = inputs(16)
    exact, bound = error_bound(model, compiled, x)
    assert np.all(np.abs(compiled(x) - exact) <= bound)
    # the same integer sums in either layout
    other = compile_policy(model, "int8", sparse_block=(1, 4) if op.block == (16, 4) else (16, 4))
    np.testing.assert_allclose(compiled(x), other(x), rtol=0, atol=1e-6)


def test_int8_codes_that_arrived_are_taken_as_they_are_and_give_what_quantizing_again_gives():
    from rlq.deploy.reader import LinearSpec
    from rlq.quant.tensor import quantize_to_codes

    rng = np.random.default_rng(1)
    weight = rng.standard_normal((48, 40)).astype(np.float32)
    codes, scale, _ = quantize_to_codes(torch.from_numpy(weight), 8, per_channel_axis=0)
    codes, scale = codes.numpy().astype(np.int8), scale.reshape(-1).numpy().astype(np.float32)
    arrived = codes.astype(np.float32) * scale[:, None]  # the weight as an int8 broadcast carries it
    bias = rng.standard_normal(48).astype(np.float32)
    given = DenseI8(LinearSpec("0", arrived, bias, activation="relu", int8=(codes, scale)))
    again = DenseI8(LinearSpec("0", arrived, bias, activation="relu"))
    assert np.array_equal(given.codes, codes)  # the codes it arrived as
    assert np.array_equal(again.codes, codes)  # quantizing the dequantized weight gives them back
    np.testing.assert_allclose(given.arrays["scale"], again.arrays["scale"], rtol=1e-6)
    x = rng.standard_normal((5, 40)).astype(np.float32)
    np.testing.assert_allclose(given.forward(x), again.forward(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="int8 codes must be int8"):
        LinearSpec("0", arrived, bias, int8=(codes.astype(np.int16), scale))
    with pytest.raises(ValueError, match="one scale per row"):
        LinearSpec("0", arrived, bias, int8=(codes, scale[:-1]))


def test_activations_in_a_row_flatten_identity_and_nesting():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Flatten(),
        nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Tanh()),
        nn.Identity(),
        nn.Linear(32, 3, bias=False),
    )
    x = inputs(4, 5)
    compiled = compile_policy(model)
    assert [op.kernel for op in compiled.ops] == ["dense_fp32", "affine", "dense_fp32"]
    assert_fp32_close(compiled(x), torch_forward(model, x))


def test_pruned_block_circulant_and_qat_layers_run_as_their_forward_does():
    from rlq.quant.activations import attach_input_quantizers
    from rlq.quant.qat import prepare_qat_

    model = mlp()
    block_circulant_(model, 8)
    magnitude_prune_(model, 0.5)  # on the B-vectors: the layers stay block-circulant
    compiled = compile_policy(model)
    assert [op.kernel for op in compiled.ops[1:3]] == ["circulant_fp32"] * 2
    assert_fp32_close(compiled(inputs()), torch_forward(model, inputs()))
    prepare_qat_(model, 4)  # the B rows of a block row hold the same values: one scale, still circulant
    compiled = compile_policy(model)
    assert compiled.ops[1].kernel == "circulant_fp32"
    assert_fp32_close(compiled(inputs()), torch_forward(model, inputs()))
    attach_input_quantizers(model, 8)
    with pytest.raises(TypeError, match=r"layer '0' has forward hooks \(_quantize_input\)"):
        compile_policy(model)


@pytest.mark.parametrize("batch", [7, 130])  # 130: two tiles of 64 rows and a tile of 2
@pytest.mark.parametrize("compression", ["circulant", "block_sparse", "circulant_fp32"])
def test_a_batch_is_its_rows(compression, batch):
    model = mlp((17, 64, 128, 64, 6))
    if compression.startswith("circulant"):
        block_circulant_(model, 8)
    else:  # the hidden layers pruned in 16x4 blocks, 3 of 4 masked
        for layer in (model[2], model[4]):
            keep = torch.rand(layer.out_features // 16, layer.in_features // 4) < 0.25
            prune_with_mask_(layer, "weight", keep.repeat_interleave(16, 0).repeat_interleave(4, 1).float())
    compiled = compile_policy(model, "fp32" if compression.endswith("fp32") else "int8")
    if compression == "block_sparse":
        assert [op.kernel for op in compiled.ops] == [
            "dense_int8",
            "sparse_int8",
            "sparse_int8",
            "dense_int8",
        ]
    x = inputs(batch)
    rows = np.concatenate([compiled(x[i : i + 1]) for i in range(len(x))])
    np.testing.assert_array_equal(compiled(x), rows)
    assert compiled(x[:0]).shape == (0, 6)


LAYER_KINDS = (
    "dense_fp32",
    "dense_int8",
    "sparse_int8",
    "circulant_fp32",
    "circulant_int8",
    "circulant_int16",
)


def one_layer(kind: str) -> tuple[nn.Sequential, str, str | None]:
    """Return a Linear(72 -> 48) + Tanh that compiles to ``kind``, with compile_policy's precisions."""
    torch.manual_seed(LAYER_KINDS.index(kind))
    layer = nn.Linear(72, 48)
    if kind == "sparse_int8":
        keep = torch.rand(48 // 16, 72 // 4) < 0.3
        prune_with_mask_(layer, "weight", keep.repeat_interleave(16, 0).repeat_interleave(4, 1).float())
    if kind.startswith("circulant"):
        block_circulant_(nn.Sequential(layer), 8, skip_first_last=False)
        return nn.Sequential(layer, nn.Tanh()), "fp32", kind.split("_")[1]
    return nn.Sequential(layer, nn.Tanh()), kind.split("_")[1], None


@pytest.mark.parametrize("batch", [1, 8, 64, 65])
@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_every_layer_kind_at_batch_1_and_more_matches_pytorch(kind, batch, use_kernels):
    model, precision, circulant = one_layer(kind)
    compiled = compile_policy(model, precision, circulant_precision=circulant, use_kernels=use_kernels)
    assert compiled.ops[0].kernel == kind and compiled.compiled == use_kernels
    x = inputs(batch, 72, seed=batch)
    y = compiled(x)
    if kind.endswith("int8") and not kind.startswith("circulant"):
        reference = np.tanh(dense_int8_reference(model[0], x))  # the documented int8 arithmetic, in PyTorch
        np.testing.assert_allclose(y, reference, rtol=0, atol=1e-5)
    elif kind in ("dense_fp32", "circulant_fp32"):
        assert_fp32_close(y, torch_forward(model, x))
    else:  # int8 and int16 DFT codes: within the worst-case bound of their quantization
        _, bound = error_bound(model, compiled, x)
        assert np.all(np.abs(y - torch_forward(model, x)) <= bound)
    rows = np.concatenate([compiled(x[i : i + 1]) for i in range(batch)])
    if use_kernels:  # the kernels compute a batch as its rows, bit for bit
        np.testing.assert_array_equal(y, rows)
    else:  # NumPy's matrix products may sum a batch in another order than a row
        np.testing.assert_allclose(y, rows, rtol=0, atol=1e-5)


def test_weight_bytes_count_the_stored_forms():
    model = mlp((17, 512, 512, 512, 6))
    dense = compile_policy(model, "int8").weight_bytes
    block_circulant_(model, 16)
    circulant = compile_policy(model, "int8").weight_bytes
    assert circulant < 0.2 * dense  # two of the 512x512 layers stored as B-vectors' DFTs
    assert compile_policy(model, "fp32").weight_bytes > circulant
    rows = compile_policy(model, "int8").describe()
    assert [r["kernel"] for r in rows][1:3] == ["circulant_int8 B=16"] * 2


def test_unsupported_layers_are_named():
    with pytest.raises(TypeError, match=r"unsupported layer '1' \(ELU\)"):
        compile_policy(nn.Sequential(nn.Linear(3, 4), nn.ELU()))
    with pytest.raises(TypeError, match=r"'0' \(Conv2d\)"):
        compile_policy(nn.Sequential(nn.Conv2d(1, 2, 3)))
    with pytest.raises(TypeError, match="nn.Sequential or a Stable-Baselines3"):
        compile_policy(nn.Linear(3, 4))
    with pytest.raises(TypeError, match="before any nn.Linear"):
        compile_policy(nn.Sequential(nn.ReLU(), nn.Linear(3, 4)))
    with pytest.raises(TypeError, match="no nn.Linear"):
        compile_policy(nn.Sequential(nn.Identity()))
    broken = nn.Sequential(nn.Linear(3, 4))
    with torch.no_grad():
        broken[0].weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="layer '0' holds NaN"):
        compile_policy(broken)
    with pytest.raises(ValueError, match="more than int32 sums hold"):
        compile_policy(nn.Sequential(nn.Linear(70_000, 1)), "int8")


def test_bad_options_and_inputs_are_refused():
    model = mlp()
    with pytest.raises(ValueError, match="precision must be one of"):
        compile_policy(model, "int1")
    with pytest.raises(ValueError, match="circulant_precision"):
        compile_policy(model, circulant_precision="fp16")
    with pytest.raises(ValueError, match="sparse block shape"):
        compile_policy(model, "int8", sparse_block=(0, 4))
    compiled = compile_policy(model)
    with pytest.raises(TypeError, match="float32 observations, got dtype float64"):
        compiled(inputs().astype(np.float64))
    with pytest.raises(ValueError, match=r"shape \(batch, 17\), got \(17,\)"):
        compiled(inputs()[0])
    with pytest.raises(ValueError, match=r"got \(2, 16\)"):
        compiled(inputs()[:2, :16])
    with pytest.raises(TypeError, match="numpy float32 array, got list"):
        compiled([[0.0] * 17])
    assert compiled(np.asfortranarray(inputs())).shape == (32, 6)  # non-contiguous input is copied
    with pytest.raises(ValueError, match="not compiled from this module"):
        error_bound(mlp((17, 32, 6)), compiled, inputs())


def test_the_kernel_refuses_a_batch_holding_a_non_finite_value_and_computes_nothing():
    if not kernels_available():
        pytest.skip("rlq.deploy._policy_kernels is not built")
    torch.manual_seed(0)
    policy = compile_policy(nn.Sequential(nn.Linear(3, 2), nn.Tanh()), "int8")
    obs = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    finite = obs.copy()
    obs[1, 0], obs[3, 2] = np.nan, -np.inf
    out = np.full((4, 2), 7.0, np.float32)
    kernel = deploy_runtime._policy_kernels
    assert kernel.forward(policy._program_ptr, obs, out, 4) == 2  # the rows refused, and nothing written
    assert (out == 7.0).all()
    assert kernel.forward(policy._program_ptr, finite, out, 4) == 0
    np.testing.assert_array_equal(out, policy(finite))
    # through the policy: the finite rows get their own actions, the others none
    actions = policy(obs)
    np.testing.assert_array_equal(actions[[0, 2]], out[[0, 2]])
    assert np.isnan(actions[[1, 3]]).all()
