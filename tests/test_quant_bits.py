"""Bits per weight on hand-computed cases: dense, pruned, block-circulant, quantized, and all combined."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlq.compress import make_block_circulant_
from rlq.compress.masks import prune_with_mask_
from rlq.core.blocks import expand_kept_blocks
from rlq.quant import WeightFakeQuant, bits_per_weight, prepare_qat_, ptq, size_report
from rlq.quant.bits import (
    index_bits,
    mark_weight_format_,
    relative_index_codes,
    relative_index_cost,
    relative_index_positions,
    relative_index_width,
    whole_kept_blocks,
)
from rlq.quant.quantizable import quantizable_layers
from rlq.sb3.qat_stacking import stack_fake_quant_


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))


DENSE = 4 * 8 + 8 * 8 + 8 * 2  # 112 weights


def flat_mask(shape, kept) -> torch.Tensor:
    mask = torch.zeros(shape).reshape(-1)
    mask[list(kept)] = 1.0
    return mask.reshape(shape)


def test_dense_fp32_is_exactly_32_and_fp16_16():
    model = mlp()
    assert bits_per_weight(model) == 32.0
    assert bits_per_weight(ptq(model, "fp16")) == 16.0
    assert bits_per_weight(model, bits="fp16") == 16.0


def test_dense_int8_is_8_plus_its_scales():
    per_tensor = prepare_qat_(mlp(), 8, per_channel=False)
    assert bits_per_weight(per_tensor) == (8 * DENSE + 3 * 32) / DENSE
    per_channel = prepare_qat_(mlp(), 8)
    assert bits_per_weight(per_channel) == (8 * DENSE + (8 + 8 + 2) * 32) / DENSE
    kernels = ptq(mlp(), "int8")  # torch.ao dynamic int8, one scale per tensor
    assert bits_per_weight(kernels) == (8 * DENSE + 3 * 32) / DENSE
    kernels = ptq(mlp(), "int8", per_channel_linear=True)
    assert bits_per_weight(kernels) == (8 * DENSE + 18 * 32) / DENSE


def test_simulated_copies_need_their_width_given():
    copy = ptq(mlp(), "int4")  # float values with at most 15 levels per tensor
    assert bits_per_weight(copy) == 32.0
    assert bits_per_weight(copy, bits=4) == (4 * DENSE + 3 * 32) / DENSE
    assert bits_per_weight(copy, bits="int4", per_channel=True) == (4 * DENSE + 18 * 32) / DENSE
    mixed = bits_per_weight(copy, bits={"2": 4})  # only the middle layer as 4-bit codes
    assert mixed == (32 * (32 + 16) + 4 * 64 + 32) / DENSE
    for _, layer in quantizable_layers(copy):
        mark_weight_format_(layer, 4, None)  # what a conversion leaves: no override needed
    assert bits_per_weight(copy) == (4 * DENSE + 3 * 32) / DENSE
    with pytest.raises(ValueError, match="does not have"):
        bits_per_weight(copy, bits={"9": 4})
    with pytest.raises(ValueError, match=r"\[2, 16\]"):
        bits_per_weight(copy, bits=1)


def test_relative_indices_take_the_cheapest_width_with_fillers():
    # kept positions 0, 10, 40, 63 of 64: gaps 1, 10, 30, 23. Fillers (d - 1) // (2^w - 1) per gap:
    # w=1: 60 -> 64 bits; w=2: 19 -> 46; w=3: 8 -> 36; w=4: 2 -> 24; w=5: none -> 20 (widest: 2^5 - 1 >= 30)
    mask = flat_mask((8, 8), [0, 10, 40, 63])
    assert relative_index_cost(mask) == (5, 0, 20)
    assert relative_index_width(mask) == 5
    assert index_bits(mask) == ("relative", 5, 4 * 5)
    # kept 16..63: gaps 17, 1 x 47; w=1 needs 16 fillers: 64 bits, a tie with the bitmask, which wins
    assert index_bits(flat_mask((8, 8), range(16, 64))) == ("bitmask", 1, 64)
    assert relative_index_cost(flat_mask((4,), [0, 1, 2])) == (1, 0, 3)  # every gap 1: one bit each
    assert relative_index_cost(flat_mask((4,), [1, 3])) == (1, 2, 4)  # gaps 2, 2: w=1 and w=2 tie at 4
    assert relative_index_cost(flat_mask((8,), [4])) == (3, 0, 3)  # gap 5: w=1 5 bits, w=2 4, w=3 3
    # eight gaps of 1 and one of 193: w=8 needs no filler (72 bits); w=7 needs one (filler 127): 10 x 7 = 70
    mask = flat_mask((256,), [*range(8), 200])
    assert relative_index_cost(mask) == (7, 1, 70)
    assert index_bits(mask) == ("relative", 7, 70)
    assert relative_index_codes(mask, 7).tolist() == [0] * 8 + [127, 65]  # 7 + 127 + 66 = 200
    assert index_bits(torch.zeros(4, 4)) == ("relative", 0, 0)


def test_relative_index_codes_decode_to_the_kept_positions_at_every_width():
    generator = torch.Generator().manual_seed(0)
    for density in (0.005, 0.1, 0.6):
        mask = torch.rand(40, 50, generator=generator) < density
        kept = torch.nonzero(mask.reshape(-1)).reshape(-1)
        for width in range(1, 13):
            codes = relative_index_codes(mask, width)
            fillers = int((codes == 2**width - 1).sum())
            assert len(codes) == len(kept) + fillers and int(codes.max()) < 2**width
            assert torch.equal(relative_index_positions(codes, width), kept)
        width, fillers, bits = relative_index_cost(mask)
        assert bits == width * len(relative_index_codes(mask, width)) == width * (len(kept) + fillers)
        assert bits == min(w * len(relative_index_codes(mask, w)) for w in range(1, 13))


def test_pruned_layer_counts_kept_values_and_the_cheaper_index():
    model = mlp()
    prune_with_mask_(model[2], "weight", flat_mask((8, 8), [0, 10, 40, 63]))
    (row,) = [r for r in size_report(model) if r["name"] == "2"]
    assert (row["kind"], row["stored"], row["index_format"], row["index_bits"]) == (
        "pruned",
        4,
        "relative",
        20,
    )
    assert row["total_bits"] == 4 * 32 + 20
    assert bits_per_weight(model) == (32 * (32 + 16) + 4 * 32 + 20) / DENSE


def test_zeros_without_a_mask_are_stored():
    model = mlp()
    with torch.no_grad():
        model[2].weight.zero_()
    assert bits_per_weight(model) == 32.0


def test_block_circulant_layer_stores_dense_over_b_values():
    model = mlp()
    make_block_circulant_(model[2], 4)
    (row,) = [r for r in size_report(model) if r["name"] == "2"]
    assert (row["kind"], row["block_size"], row["stored"], row["dense"]) == ("block_circulant", 4, 16, 64)
    assert row["bits_per_weight"] == 8.0
    assert bits_per_weight(model) == (32 * (32 + 16) + 16 * 32) / DENSE


def test_block_circulant_pruned_quantized_layer():
    """B=4 on 8x8: B-vectors (2, 2, 4); 8 of 16 kept; 4 bits; one scale per block row (2)."""
    layer = nn.Linear(8, 8)
    make_block_circulant_(layer, 4)
    # kept 0..3 and 8..11: gaps 1,1,1,1,5,1,1,1 -> w = 1 with 4 fillers: 12 bits < a 16-bit bitmask
    prune_with_mask_(
        layer.parametrizations.weight, "original", flat_mask((2, 2, 4), [0, 1, 2, 3, 8, 9, 10, 11])
    )
    stack_fake_quant_(layer, [WeightFakeQuant(4, axis=0)])
    (row,) = size_report(layer)
    assert row["kind"] == "block_circulant+pruned"
    assert (row["stored"], row["value_bits"], row["index_format"], row["index_bits"], row["scales"]) == (
        8,
        4,
        "relative",
        12,
        2,
    )
    assert row["total_bits"] == 8 * 4 + 12 + 2 * 32
    assert bits_per_weight(layer) == 108 / 64
    layer.parametrizations.weight[-1].axis = None  # per tensor: one scale
    assert bits_per_weight(layer) == (8 * 4 + 12 + 32) / 64


def test_all_combined():
    """fp32 dense first layer, block-circulant + pruned + 4-bit middle layer, pruned + 4-bit last layer."""
    model = mlp()
    make_block_circulant_(model[2], 4)
    prune_with_mask_(model[2].parametrizations.weight, "original", flat_mask((2, 2, 4), range(4)))
    stack_fake_quant_(model[2], [WeightFakeQuant(4, axis=0)])
    prune_with_mask_(model[4], "weight", flat_mask((2, 8), [0, 15]))  # gaps 1, 15 -> w = 4: 8 < 16 bits
    stack_fake_quant_(model[4], [WeightFakeQuant(4, axis=None)])
    first = 32 * 32
    rows = {r["name"]: r for r in size_report(model)}
    assert rows["2"]["index_format"] == "relative" and rows["2"]["index_bits"] == 4
    middle = 4 * 4 + 4 + 2 * 32  # kept 0..3: w = 1, 4 bits of relative indices < a 16-bit bitmask
    last = 2 * 4 + 8 + 32
    assert [rows[n]["total_bits"] for n in ("0", "2", "4")] == [first, middle, last]
    assert bits_per_weight(model) == (first + middle + last) / DENSE


def test_convolutions():
    conv = nn.Conv2d(2, 4, 3)  # 72 weights
    assert bits_per_weight(conv) == 32.0
    prepare_qat_(conv, 8)
    assert bits_per_weight(conv) == (72 * 8 + 4 * 32) / 72
    block = nn.Conv2d(4, 4, 3)  # 144 weights; B=2: vectors (2, 2, 2, 3, 3), 72 values
    make_block_circulant_(block, 2)
    assert bits_per_weight(block) == 16.0


def test_report_rows_make_a_table():
    pandas = pytest.importorskip("pandas")
    table = pandas.DataFrame(size_report(mlp()))
    assert list(table["name"]) == ["0", "2", "4"]
    assert (table["bits_per_weight"] == 32.0).all()


def test_a_module_without_weights_is_named_not_divided_by_zero():
    import math

    from torch import nn

    from rlq.quant import bits_per_weight, size_report

    with pytest.raises(ValueError, match="hold no weight"):
        bits_per_weight(nn.Linear(0, 0))
    assert math.isnan(size_report(nn.Linear(0, 0))[0]["bits_per_weight"])
    mixed = nn.Sequential(nn.Linear(0, 0), nn.Linear(4, 2))  # an empty layer counts for nothing
    assert bits_per_weight(mixed) == pytest.approx(bits_per_weight(nn.Sequential(nn.Linear(4, 2))))


def test_a_mask_of_whole_blocks_counts_a_block_index_when_asked():
    # a 40x12 layer in 16x4 blocks: a 3x3 grid whose last block row holds 8 rows; keep blocks (0, 1) and (2, 2)
    layer = nn.Linear(12, 40)
    grid = torch.zeros(3, 3)
    grid[0, 1] = grid[2, 2] = 1
    mask = torch.zeros(40, 12)
    mask[0:16, 4:8] = 1
    mask[32:40, 8:12] = 1
    prune_with_mask_(layer, "weight", mask)
    assert torch.equal(whole_kept_blocks(layer.weight_mask, (16, 4)), grid.bool())
    assert (expand_kept_blocks(grid.bool().numpy(), (16, 4), (40, 12)) == mask.bool().numpy()).all()
    element = size_report(layer, bits=8)[0]
    (row,) = size_report(layer, bits=8, block=(16, 4))
    # 96 values kept of 480; block positions 1 and 8 of 9: gaps 2 and 7, 3-bit codes: 6 bits < the 9-bit bitmask
    assert (row["stored"], row["index_format"], row["index_width"], row["index_bits"]) == (
        96,
        "block_relative",
        3,
        6,
    )
    assert tuple(row["index_block"]) == (16, 4)
    assert element["index_format"] in ("bitmask", "relative") and element["index_bits"] > 6
    assert row["total_bits"] == 96 * 8 + 6 + 32
    assert bits_per_weight(layer, bits=8, block=(16, 4)) == (96 * 8 + 6 + 32) / 480


def test_a_mask_that_is_not_whole_blocks_keeps_its_element_index():
    layer = nn.Linear(12, 40)
    mask = torch.zeros(40, 12)
    mask[0:16, 4:8] = 1
    mask[5, 4] = 0  # one hole: the block is no longer whole
    prune_with_mask_(layer, "weight", mask)
    assert whole_kept_blocks(layer.weight_mask, (16, 4)) is None
    assert size_report(layer, bits=8, block=(16, 4)) == size_report(layer, bits=8)
    with pytest.raises(ValueError, match="two positive ints"):
        size_report(layer, bits=8, block=(16, 0))


def test_block_indices_agree_with_rlq_compress_on_its_own_block_pruning():
    from rlq.compress import magnitude_prune_
    from rlq.compress.measures import block_storage

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(17, 64), nn.ReLU(), nn.Linear(64, 60), nn.ReLU(), nn.Linear(60, 6))
    magnitude_prune_(net, 0.75, block=(16, 4))
    rows = {r["name"]: r for r in size_report(net, bits=8, per_channel=True, block=(16, 4))}
    stored = block_storage(net[2], (16, 4))
    assert rows["2"]["index_format"].startswith("block_")
    assert int(whole_kept_blocks(net[2].weight_mask, (16, 4)).sum()) == stored["blocks"]
    assert rows["2"]["stored"] == int(net[2].weight_mask.sum())
    # the first and last layers stay dense
    assert rows["0"]["index_format"] is None and rows["4"]["index_format"] is None


def test_a_block_circulant_layer_pruned_in_whole_b_vectors_indexes_its_vectors():
    from rlq.compress import magnitude_prune_

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    make_block_circulant_(net[2], 4)
    magnitude_prune_(net, 0.5, block=(16, 4))  # whole B-vectors of the block-circulant layer
    (row,) = [r for r in size_report(net, bits=8, block=(16, 4)) if r["name"] == "2"]
    # 8 x 8 B-vectors of 4 entries, half of them kept: the index covers 64 vectors, not 256 entries
    assert row["kind"] == "block_circulant+pruned" and tuple(row["index_block"]) == (1, 4)
    assert row["stored"] == 32 * 4
    vectors = net[2].parametrizations["weight"].original_mask.reshape(8, 8, 4)
    kept = vectors.amax(dim=2) > 0  # each B-vector kept or not, computed here from the mask
    assert int(kept.sum()) == 32 and vectors[kept].all() and not vectors[~kept].any()
    assert row["index_bits"] == min(64, relative_index_cost(kept)[2])
