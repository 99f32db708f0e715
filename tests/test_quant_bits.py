"""Bits per weight on hand-computed cases: dense, pruned, block-circulant, quantized, and all combined."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlq.compress import make_block_circulant_
from rlq.compress.masks import prune_with_mask_
from rlq.quant import WeightFakeQuant, bits_per_weight, prepare_qat_, ptq, size_report
from rlq.quant.bits import index_bits, mark_weight_format_, relative_index_width
from rlq.quant.layers import quantizable_layers
from rlq.sb3.qat import stack_fake_quant_


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


def test_relative_indices_use_the_largest_gap():
    # kept positions 0, 10, 40, 63 of 64: gaps 1, 10, 30, 23 -> w = ceil(log2 30) = 5
    mask = flat_mask((8, 8), [0, 10, 40, 63])
    assert relative_index_width(mask) == 5
    assert index_bits(mask) == ("relative", 5, 4 * 5)
    # kept 16..63: first gap 17 -> w = 5, 48 * 5 bits > a 64-bit bitmask
    assert index_bits(flat_mask((8, 8), range(16, 64))) == ("bitmask", 5, 64)
    assert relative_index_width(flat_mask((4,), [0, 1, 2])) == 1  # every gap 1: still one bit
    assert relative_index_width(flat_mask((4,), [1, 3])) == 1  # gaps 2, 2: d - 1 = 1 fits one bit
    assert relative_index_width(flat_mask((8,), [4])) == 3  # gap 5: d - 1 = 4 needs 3 bits
    assert index_bits(torch.zeros(4, 4)) == ("relative", 0, 0)


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
    # kept 0..3 and 8..11: gaps 1,1,1,1,5,1,1,1 -> w = 3, 24 bits > a 16-bit bitmask
    prune_with_mask_(
        layer.parametrizations.weight, "original", flat_mask((2, 2, 4), [0, 1, 2, 3, 8, 9, 10, 11])
    )
    stack_fake_quant_(layer, [WeightFakeQuant(4, axis=0)])
    (row,) = size_report(layer)
    assert row["kind"] == "block_circulant+pruned"
    assert (row["stored"], row["value_bits"], row["index_format"], row["index_bits"], row["scales"]) == (
        8,
        4,
        "bitmask",
        16,
        2,
    )
    assert row["total_bits"] == 8 * 4 + 16 + 2 * 32
    assert bits_per_weight(layer) == 112 / 64
    layer.parametrizations.weight[-1].axis = None  # per tensor: one scale
    assert bits_per_weight(layer) == (8 * 4 + 16 + 32) / 64


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
