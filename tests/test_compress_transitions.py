"""Block-size transitions: the exact split keeps the function and moves no value; projection moves values."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from conftest import relu_mlp as mlp
from rlq.compress import (
    block_circulant_,
    block_size_of,
    circulant_vectors,
    expand_circulant,
    magnitude_prune_,
    parameter_shift,
    residue_permutation,
    sparsity_of,
    split_blocks_exact_,
    transition_exact_,
    transition_projection_,
)
from rlq.compress.circulant import is_block_circulant_matrix


def random_block_circulant(net: nn.Module, block_size: int) -> None:
    """Make ``net`` block-circulant and give its B-vectors fresh N(0, 1) values (a random BC matrix)."""
    block_circulant_(net, block_size)
    for layer in net.modules():
        if block_size_of(layer) is not None:
            with torch.no_grad():
                layer.parametrizations.weight.original.normal_()


def test_exact_split_keeps_the_function_of_a_three_layer_mlp():
    torch.manual_seed(0)
    net = mlp((6, 16, 16, 3))  # 3 layers: the middle one is block-circulant
    random_block_circulant(net, 4)
    x = torch.randn(64, 6)
    before = net(x).detach()
    shifts = split_blocks_exact_(net, 2)
    assert shifts == [None, 0.0, None]
    assert block_size_of(net[2]) == 2 and is_block_circulant_matrix(net[2].weight.detach(), 2)
    assert (net(x) - before).abs().max().item() < 1e-5
    split_blocks_exact_(net, 2)  # and again, 2 -> 1
    assert block_size_of(net[2]) == 1 and (net(x) - before).abs().max().item() < 1e-5


def test_exact_split_values_are_the_reordered_old_weight_bit_for_bit():
    torch.manual_seed(0)
    net = mlp((6, 16, 16, 16, 3))
    random_block_circulant(net, 8)
    old = [expand_circulant(circulant_vectors(net[i])).detach().clone() for i in (2, 4)]
    old_vectors = circulant_vectors(net[2]).detach().clone()
    transition_exact_(net, 2)  # factor 4 at once
    p = residue_permutation(16, 8, 4)
    for weight, i in zip(old, (2, 4), strict=True):
        assert torch.equal(net[i].weight.detach(), weight[p][:, p])
    new_vectors = circulant_vectors(net[2]).detach()
    assert new_vectors.shape == (8, 8, 2)
    assert set(new_vectors.reshape(-1).tolist()) == set(old_vectors.reshape(-1).tolist())


def test_projection_moves_values_while_the_exact_split_does_not():
    torch.manual_seed(0)
    projected = mlp((6, 64, 64, 3))
    random_block_circulant(projected, 4)
    exact = copy.deepcopy(projected)
    shift_projection = transition_projection_(projected, 2).shift["2"]
    shift_exact = transition_exact_(exact, 2).shift["2"]
    assert shift_exact == 0.0
    # For a BC matrix with i.i.d. zero-mean vectors the expected relative shift is 0.5: each 2x2 block loses
    # the difference of the two off-diagonal entries, (v1 - v3) / 2, in 2 of its 4 positions.
    assert 0.4 < shift_projection < 0.6
    assert is_block_circulant_matrix(projected[2].weight.detach(), 2)


def test_projection_shift_by_hand_on_one_4x4_block():
    v = torch.tensor([1.0, 2.0, 3.0, 4.0])
    weight = expand_circulant(v.reshape(1, 1, 4))
    net = nn.Sequential(nn.Linear(4, 4, bias=False))
    block_circulant_(net, 4, skip_first_last=False)
    with torch.no_grad():
        net[0].parametrizations.weight.original.copy_(v.reshape(1, 1, 4))
    shift = transition_projection_(net, 2).shift["0"]
    # Each of the four 2x2 blocks moves (v1 - v3) / 2 = -1 at its two off-diagonal positions.
    assert shift == pytest.approx((8 * 1.0) ** 0.5 / float(weight.norm()))


def test_exact_split_keeps_pruned_vector_entries_and_their_sparsity():
    torch.manual_seed(0)
    net = mlp()
    random_block_circulant(net, 4)
    magnitude_prune_(net, 0.5)
    x = torch.randn(16, 6)
    before = net(x).detach()
    transition_exact_(net, 2)
    assert sparsity_of(net[2]) == pytest.approx(0.5) and block_size_of(net[4]) == 2
    assert (net(x) - before).abs().max().item() < 1e-5


def test_projection_re_prunes_to_the_same_sparsity():
    torch.manual_seed(0)
    net = mlp()
    random_block_circulant(net, 4)
    magnitude_prune_(net, 0.5)
    transition_projection_(net, 2)
    assert block_size_of(net[2]) == 2 and sparsity_of(net[2]) == pytest.approx(0.5)


def test_training_after_a_transition_needs_reset_state_and_stays_block_circulant():
    from rlq.compress import reset_optimizer_state_

    torch.manual_seed(0)
    net = mlp()
    random_block_circulant(net, 4)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    x = torch.randn(8, 6)
    net(x).sum().backward()
    optimizer.step()
    transition_exact_(net, 2)
    reset_optimizer_state_(optimizer)
    for _ in range(3):
        optimizer.zero_grad()
        net(x).square().sum().backward()
        optimizer.step()
    assert is_block_circulant_matrix(net[2].weight.detach(), 2)


def test_exact_split_refuses_what_it_cannot_do():
    torch.manual_seed(0)
    net = mlp((8, 16, 3))
    block_circulant_(net, 4, skip_first_last=False, networks=[["0"], ["2"]])  # first layer block-circulant
    with pytest.raises(ValueError, match="first layer"):
        split_blocks_exact_(net, 2)
    net = mlp((6, 16, 16, 3))
    block_circulant_(net, 4)
    with pytest.raises(ValueError, match="factor 3"):
        split_blocks_exact_(net, 3)
    normed = nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    block_circulant_(normed, 4)
    with pytest.raises(ValueError, match="LayerNorm"):
        split_blocks_exact_(normed, 2)
    mismatched = [nn.Linear(6, 16), nn.Linear(8, 16), nn.Linear(16, 3)]
    block_circulant_(mismatched[1], 4, skip_first_last=False)
    with pytest.raises(ValueError, match="plain chain"):
        split_blocks_exact_(mismatched, 2)
    with pytest.raises(ValueError, match="does not divide the current block size"):
        transition_exact_(net, 3)


def test_parameter_shift():
    a = torch.tensor([3.0, 4.0])
    assert parameter_shift(a, a) == 0.0
    assert parameter_shift(a, torch.zeros(2)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="shapes differ"):
        parameter_shift(a, torch.zeros(3))


def test_exact_transition_refuses_a_network_that_is_not_one_sequential_chain():
    from rlq.compress import block_circulant_, transition_exact_

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            h = self.a(x)
            return self.c(h + self.b(h))  # a shortcut: reordering b's units alone would break it

    net = Residual()
    block_circulant_(net, 4, skip_first_last=False, networks="whole")
    with pytest.raises(ValueError, match="one nn.Sequential chain"):
        transition_exact_(net, 2, networks="whole")
