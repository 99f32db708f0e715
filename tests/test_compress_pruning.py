"""Magnitude pruning (torch.nn.utils.prune) of dense and block-circulant layers; the gradual schedule."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from conftest import relu_mlp as mlp
from rlq.compress import (
    block_circulant_,
    circulant_vectors,
    gradual_sparsity,
    is_block_circulant,
    is_pruned,
    load_compressed_state_dict_,
    magnitude_prune_,
    remove_block_circulant_,
    remove_pruning_,
    sparsity_of,
)
from rlq.compress.circulant import is_block_circulant_matrix


def train(net: nn.Module, steps: int = 5, in_features: int = 6) -> torch.optim.Optimizer:
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    x = torch.randn(32, in_features)
    for _ in range(steps):
        optimizer.zero_grad()
        net(x).square().mean().backward()
        optimizer.step()
    return optimizer


def test_layer_scope_prunes_exactly_the_smallest_weights_of_each_eligible_layer():
    torch.manual_seed(0)
    net = mlp()
    weight = net[2].weight.detach().clone()
    report = magnitude_prune_(net, 0.25)
    assert report.compressed == ["2", "4"] and "first layer" in report.dense["0"]
    assert not is_pruned(net[0]) and not is_pruned(net[6])
    assert sparsity_of(net[2]) == pytest.approx(0.25) and sparsity_of(net[4]) == pytest.approx(0.25)
    threshold = weight.abs().reshape(-1).sort().values[63]  # 64 of 256 pruned
    kept = net[2].weight_mask.bool()
    assert torch.equal(kept, weight.abs() > threshold)
    assert torch.equal(net[2].weight.detach(), weight * kept)


def test_pruned_weights_stay_exactly_zero_through_training():
    torch.manual_seed(0)
    net = mlp()
    magnitude_prune_(net, 0.6)
    mask = net[2].weight_mask.clone()
    train(net)
    assert torch.equal(net[2].weight.detach()[mask == 0], torch.zeros(int((mask == 0).sum())))
    assert torch.equal(net[2].weight_mask, mask)


def test_global_scope_prunes_a_fraction_of_all_eligible_weights_together():
    torch.manual_seed(0)
    net = mlp((6, 16, 16, 32, 3))
    with torch.no_grad():
        net[4].weight.mul_(10.0)  # layer 4 much larger: a global threshold spares it
    magnitude_prune_(net, 0.5, scope="global")
    pruned = (1 - net[2].weight_mask).sum() + (1 - net[4].weight_mask).sum()
    assert int(pruned) == round(0.5 * (256 + 512))
    assert sparsity_of(net[2]) > 0.9 and sparsity_of(net[4]) < 0.3


def test_sparsity_is_absolute_raising_keeps_zeros_and_lowering_regrows_from_zero():
    torch.manual_seed(0)
    net = mlp()
    magnitude_prune_(net, 0.5)
    first_mask = net[2].weight_mask.clone()
    train(net)
    magnitude_prune_(net, 0.75)
    assert sparsity_of(net[2]) == pytest.approx(0.75)
    assert torch.all(net[2].weight_mask <= first_mask)  # every earlier zero still pruned
    magnitude_prune_(net, 0.25)
    assert sparsity_of(net[2]) == pytest.approx(0.25)
    regrown = (net[2].weight_mask == 1) & (first_mask == 0)
    assert regrown.any() and torch.all(net[2].weight_orig.detach()[regrown] == 0)


def test_block_circulant_layers_are_pruned_on_their_vector_entries():
    torch.manual_seed(0)
    net = mlp()
    block_circulant_(net, 4)
    magnitude_prune_(net, 0.5)
    assert is_block_circulant(net[2]) and is_pruned(net[2])
    plist = net[2].parametrizations.weight
    assert plist.original_mask.shape == (4, 4, 4) and sparsity_of(net[2]) == pytest.approx(0.5)
    train(net)
    vectors = circulant_vectors(net[2]).detach()
    assert torch.equal(vectors[plist.original_mask == 0], torch.zeros(32))
    weight = net[2].weight.detach()
    assert is_block_circulant_matrix(weight, 4)
    assert (weight == 0).float().mean().item() == pytest.approx(0.5)  # each vector entry fills B positions


def test_pruned_modules_deepcopy_and_state_dict_round_trip():
    torch.manual_seed(0)
    net = mlp()
    block_circulant_(net, 4, networks=[["0", "2"], ["4", "6"]], skip_first_last=False)
    magnitude_prune_(net, 0.5, skip_first_last=False, networks="whole")
    train(net)  # after a training forward, torch's prune alone would make deepcopy fail
    clone = copy.deepcopy(net)
    x = torch.randn(4, 6)
    assert torch.equal(clone(x), net(x))
    fresh = mlp()
    structure = load_compressed_state_dict_(fresh, net.state_dict())
    assert structure["2"] == {"block_size": 4, "pruned": True} and structure["6"]["block_size"] is None
    assert torch.equal(fresh(x), net(x))
    train(fresh)
    assert torch.all(
        circulant_vectors(fresh[2]).detach()[fresh[2].parametrizations.weight.original_mask == 0] == 0
    )


def test_removing_block_circulant_keeps_the_vector_mask_as_a_dense_mask():
    torch.manual_seed(0)
    net = mlp()
    block_circulant_(net, 4)
    magnitude_prune_(net, 0.5)
    x = torch.randn(4, 6)
    before = net(x)
    remove_block_circulant_(net)
    assert not is_block_circulant(net[2]) and sparsity_of(net[2]) == pytest.approx(0.5)
    assert torch.allclose(net(x), before, atol=1e-6)
    train(net)
    assert torch.all(net[2].weight.detach()[net[2].weight_mask == 0] == 0)


def test_remove_pruning_makes_zeros_permanent():
    torch.manual_seed(0)
    net = mlp()
    magnitude_prune_(net, 0.5)
    assert remove_pruning_(net) == ["2", "4"]
    assert not is_pruned(net[2]) and (net[2].weight == 0).float().mean().item() == pytest.approx(0.5)
    assert set(net.state_dict()) == set(mlp().state_dict())


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan"), True, "0.5"])
def test_bad_sparsity_is_rejected(bad):
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        magnitude_prune_(mlp(), bad)


def test_bad_scope_and_layer_names_are_rejected():
    with pytest.raises(ValueError, match="scope"):
        magnitude_prune_(mlp(), 0.5, scope="network")
    with pytest.raises(ValueError, match="not compressible"):
        magnitude_prune_(mlp(), 0.5, layers=["1"])
    net = mlp()
    assert magnitude_prune_(net, 0.5, layers=["0"]).compressed == ["0"] and is_pruned(net[0])


def zhu_gupta(t, s_f, t0, t1, s_i=0.0):
    """Equation 1 of Zhu & Gupta (2017), written out independently."""
    if t < t0:
        return s_i
    if t >= t1:
        return s_f
    return s_f + (s_i - s_f) * (1 - (t - t0) / (t1 - t0)) ** 3


@pytest.mark.parametrize("s_i", [0.0, 0.2])
def test_gradual_sparsity_follows_zhu_and_gupta(s_i):
    for t in range(0, 1001, 7):
        assert gradual_sparsity(t, 0.9, 200, 800, initial_sparsity=s_i) == pytest.approx(
            zhu_gupta(t, 0.9, 200, 800, s_i)
        )
    assert gradual_sparsity(500, 0.9, 200, 800) == pytest.approx(0.9 * (1 - 0.5**3))
    # Updated every k steps: piecewise constant between updates.
    assert gradual_sparsity(549, 0.9, 200, 800, update_every=100) == gradual_sparsity(500, 0.9, 200, 800)


def test_average_of_the_gradual_schedule_is_about_065_final_sparsity():
    total, s_f = 100_000, 0.9
    schedule = [gradual_sparsity(t, s_f, int(0.2 * total), int(0.8 * total)) for t in range(total)]
    average = float(np.mean(schedule))
    # Exactly: 0.6 * 3/4 (the cubic's mean over its ramp) + 0.2 (final) = 0.65.
    assert average / s_f == pytest.approx(0.65, abs=1e-3)


def test_gradual_sparsity_rejects_bad_arguments():
    with pytest.raises(ValueError, match="final_sparsity"):
        gradual_sparsity(0, 1.0, 0, 10)
    with pytest.raises(ValueError, match="start_step <= end_step"):
        gradual_sparsity(0, 0.5, 10, 5)
    with pytest.raises(ValueError, match="exceeds"):
        gradual_sparsity(0, 0.5, 0, 10, initial_sparsity=0.6)
    with pytest.raises(ValueError, match="update_every"):
        gradual_sparsity(0, 0.5, 0, 10, update_every=0)


def test_gradual_pruning_schedule_counts_fractions_from_start_step():
    from rlq.compress import GradualPruning, GradualPruningConfig

    config = GradualPruningConfig(total_steps=1100, final_sparsity=0.8, start_step=100, prune_every=1)
    schedule = GradualPruning(config)
    # training steps [100, 1100): t0 = 100 + 0.2 * 1000, t1 = 100 + 0.8 * 1000
    assert (schedule.start_step, schedule.end_step) == (300, 900)
    assert schedule.target(299) == 0.0 and schedule.target(900) == pytest.approx(0.8)
    assert schedule.target(600) == pytest.approx(0.8 * (1 - 0.5**3))  # halfway: s_f (1 - (1/2)^3)
    assert (
        GradualPruning(GradualPruningConfig(total_steps=1000, start_fraction=0.0, end_fraction=1.0)).every
        == 10
    )  # 1% of t1 - t0
    model = mlp()
    assert schedule.apply_(model, 299) == [] and schedule.apply_(model, 600)[0].sparsity == pytest.approx(0.7)
    with pytest.raises(ValueError, match="start_step must be an int >= 0"):
        GradualPruningConfig(total_steps=10, start_step=-1)
    with pytest.raises(ValueError, match="start_fraction 0.9 must not exceed end_fraction 0.5"):
        GradualPruningConfig(total_steps=10, start_fraction=0.9, end_fraction=0.5)
