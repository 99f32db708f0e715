"""Compression measures against hand-counted numbers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import relu_mlp
from rlq.compress import (
    average_compression_ratio,
    block_circulant_,
    compression_ratio,
    covered_fraction,
    layer_report,
    magnitude_prune_,
    weight_bytes_per_update,
)


def mlp(sizes=(8, 16, 16, 16, 4)) -> nn.Sequential:
    return relu_mlp(sizes)


# Weights of mlp(): 8*16 = 128, 16*16 = 256, 256, 16*4 = 64; 704 in all (biases not counted).
TOTAL = 128 + 256 + 256 + 64


def test_dense_module_has_zero_compression():
    assert compression_ratio(mlp()) == 0.0
    assert covered_fraction(mlp()) == 0.0


def test_block_circulant_layers_store_one_in_b():
    net = mlp()
    block_circulant_(net, 4)
    assert compression_ratio(net) == pytest.approx(1 - (128 + 64 + 64 + 64) / TOTAL)
    rows = {r["name"]: r for r in layer_report(net)}
    expected = dict(name="2", shape=(16, 16), kind="block_circulant", block_size=4, stored=64, dense=256)
    assert rows["2"] == {**expected, "ratio": 0.75}
    assert rows["0"]["kind"] == "dense" and rows["0"]["ratio"] == 0.0
    assert covered_fraction(net) == pytest.approx(512 / TOTAL)


def test_pruned_and_pruned_block_circulant_layers_store_their_kept_entries():
    net = mlp()
    magnitude_prune_(net, 0.5)
    assert compression_ratio(net) == pytest.approx(1 - (128 + 128 + 128 + 64) / TOTAL)
    net = mlp()
    block_circulant_(net, 4)
    magnitude_prune_(net, 0.25)  # 64 vector entries per layer, 16 pruned
    assert compression_ratio(net) == pytest.approx(1 - (128 + 48 + 48 + 64) / TOTAL)
    assert {r["kind"] for r in layer_report(net)} == {"dense", "block_circulant+pruned"}


def test_unenforced_zeros_do_not_count_and_convolutions_do():
    net = mlp()
    with torch.no_grad():
        net[2].weight.zero_()
    assert compression_ratio(net) == 0.0
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 1))
    block_circulant_(cnn, 8)
    # 3*8*9 = 216, 8*8*9 = 576 stored as 1*1*8*9 = 72, 8*4 = 32.
    assert compression_ratio(cnn) == pytest.approx(1 - (216 + 72 + 32) / (216 + 576 + 32))
    deconv = nn.Sequential(nn.ConvTranspose2d(4, 6, 2))  # counted, always dense
    assert layer_report(deconv)[0]["dense"] == 4 * 6 * 4 and compression_ratio(deconv) == 0.0


def test_no_layers_is_an_error():
    with pytest.raises(ValueError, match="no nn.Linear"):
        compression_ratio(nn.ReLU())


def test_average_compression_ratio():
    assert average_compression_ratio([0.0, 0.5, 1.0]) == pytest.approx(0.5)
    # Recorded at steps 0 and 10 of 40: 0.2 holds for 10 steps, 0.6 for 30.
    assert average_compression_ratio([0.2, 0.6], steps=[0, 10], total_steps=40) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="empty"):
        average_compression_ratio([])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        average_compression_ratio([1.5])
    with pytest.raises(ValueError, match="increasing"):
        average_compression_ratio([0.1, 0.2], steps=[5, 5], total_steps=10)
    with pytest.raises(ValueError, match="total_steps"):
        average_compression_ratio([0.1, 0.2], steps=[0, 5], total_steps=5)


def test_weight_bytes_per_update():
    net = mlp()
    dense = weight_bytes_per_update(net)
    assert dense == {"dense_bytes": 4.0 * TOTAL, "compressed_bytes": 4.0 * TOTAL, "reduction": 0.0}
    block_circulant_(net, 4)
    result = weight_bytes_per_update(net, passes=2)
    assert result["compressed_bytes"] == 2 * 4.0 * (128 + 64 + 64 + 64)
    assert result["reduction"] == pytest.approx(1 - (128 + 64 + 64 + 64) / TOTAL)

    pruned = mlp()
    magnitude_prune_(pruned, 0.9)  # 26 of 256 kept per hidden layer: CSR beats dense
    csr = 26 * (4 + 4) + (16 + 1) * 4
    assert weight_bytes_per_update(pruned)["compressed_bytes"] == 4.0 * (128 + 64) + 2 * csr
    light = mlp()
    magnitude_prune_(light, 0.1)  # CSR would cost more than the dense values: dense counted
    assert weight_bytes_per_update(light)["compressed_bytes"] == 4.0 * TOTAL
    with pytest.raises(ValueError, match="value_bytes"):
        weight_bytes_per_update(net, value_bytes=0)
