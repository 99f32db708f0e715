"""Block-circulant layers in place: eligibility per network, training, save/load, deepcopy, forward paths."""

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
    eligible_layers,
    expand_circulant,
    find_networks,
    is_block_circulant,
    load_compressed_state_dict_,
    remove_block_circulant_,
    reset_optimizer_state_,
    set_forward_path_,
)
from rlq.compress.circulant import is_block_circulant_matrix


class TwinCritic(nn.Module):
    """Shaped like SB3's ContinuousCritic: two Q-networks as attributes, also kept in a plain list."""

    def __init__(self, obs: int = 5, hidden: int = 16):
        super().__init__()
        self.features_extractor = nn.Flatten()
        self.qf0 = mlp((obs, hidden, hidden, 1))
        self.qf1 = mlp((obs, hidden, hidden, 1))
        self.q_networks = [self.qf0, self.qf1]

    def forward(self, x):
        x = self.features_extractor(x)
        return torch.cat([q(x) for q in self.q_networks], dim=1)


def small_cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
        nn.Conv2d(8, 4, 1), nn.Flatten(), nn.Linear(4 * 4 * 4, 5),
    )  # fmt: skip


def test_first_and_last_layer_are_found_per_network():
    critic = TwinCritic()
    assert [name for name, _ in eligible_layers(critic)] == ["qf0.2", "qf1.2"]
    assert [[n for n, _ in net] for net in find_networks(critic)] == [
        ["qf0.0", "qf0.2", "qf0.4"],
        ["qf1.0", "qf1.2", "qf1.4"],
    ]
    assert len(eligible_layers(critic, skip_first_last=False)) == 6
    assert len(eligible_layers(critic, networks="whole")) == 4  # one network: only qf0.0 and qf1.4 skipped
    groups = [["qf0.0", "qf0.2"], ["qf1.0", "qf1.2", "qf1.4"]]
    assert [name for name, _ in eligible_layers(critic, networks=groups)] == ["qf1.2"]


def test_leaf_chains_outside_sequentials_are_networks():
    class Policy(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c, self.d = (
                nn.Linear(4, 8),
                nn.Linear(8, 8),
                nn.Linear(8, 8),
                nn.Linear(8, 2),
            )

    assert [name for name, _ in eligible_layers(Policy())] == ["b", "c"]


def test_bad_network_groups_are_rejected():
    critic = TwinCritic()
    with pytest.raises(ValueError, match="not a compressible layer"):
        eligible_layers(critic, networks=[["qf0.1"]])
    with pytest.raises(ValueError, match="more than one network"):
        eligible_layers(critic, networks=[["qf0.0"], ["qf0.0"]])
    with pytest.raises(ValueError, match="'sequential', 'whole'"):
        eligible_layers(critic, networks="all")


def test_block_circulant_compresses_eligible_layers_and_reports_the_rest():
    torch.manual_seed(0)
    net = mlp((6, 16, 16, 12, 3))  # 16x16 and 12x16 hidden layers
    report = block_circulant_(net, 8)
    assert report.compressed == ["2"]
    assert "does not divide its 12x16" in report.dense["4"]
    assert "first layer" in report.dense["0"] and "last layer" in report.dense["6"]
    assert report.covered_fraction == pytest.approx(256 / (96 + 256 + 192 + 36))
    assert block_size_of(net[2]) == 8 and not is_block_circulant(net[4])
    assert net[2].parametrizations.weight.original.shape == (2, 2, 8)


def test_vectors_are_the_projection_of_the_weight_and_function_follows():
    torch.manual_seed(0)
    net = mlp()
    dense_weight = net[2].weight.detach().clone()
    block_circulant_(net, 4)
    vectors = net[2].parametrizations.weight.original.detach()
    for d in range(4):  # diagonal d of block (0, 0) averaged by hand
        expected = sum(dense_weight[r, (r - d) % 4] for r in range(4)) / 4
        assert vectors[0, 0, d] == pytest.approx(float(expected), abs=1e-6)
    x = torch.randn(3, 16)
    assert torch.allclose(net[2](x), x @ expand_circulant(vectors).T + net[2].bias, atol=1e-6)


def test_training_keeps_layers_block_circulant_and_updates_the_same_parameters():
    torch.manual_seed(0)
    critic = TwinCritic()
    params_before = {id(p) for p in critic.parameters()}
    optimizer = torch.optim.Adam(critic.parameters(), lr=1e-2)  # built before the transform
    block_circulant_(critic, 4)
    assert {id(p) for p in critic.parameters()} == params_before
    vectors_before = critic.qf0[2].parametrizations.weight.original.detach().clone()
    x = torch.randn(32, 5)
    for _ in range(5):
        optimizer.zero_grad()
        critic(x).square().mean().backward()
        optimizer.step()
    for q in critic.q_networks:
        assert is_block_circulant_matrix(q[2].weight.detach(), 4)
    assert not torch.equal(critic.qf0[2].parametrizations.weight.original, vectors_before)


def test_optimizer_state_must_be_reset_after_a_structural_change():
    torch.manual_seed(0)
    net = mlp()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    x = torch.randn(8, 6)
    net(x).sum().backward()
    optimizer.step()  # Adam moments now have the dense shape
    block_circulant_(net, 4)
    optimizer.zero_grad()
    net(x).sum().backward()
    with pytest.raises(RuntimeError):
        optimizer.step()
    assert reset_optimizer_state_(optimizer, net.parameters()) == len(list(net.parameters()))
    optimizer.step()
    assert is_block_circulant_matrix(net[2].weight.detach(), 4)


def test_state_dict_round_trip_into_a_fresh_dense_model():
    torch.manual_seed(0)
    critic = TwinCritic()
    block_circulant_(critic, 4)
    state = critic.state_dict()
    assert "qf0.2.parametrizations.weight.original" in state
    fresh = TwinCritic()
    with pytest.raises(RuntimeError):
        fresh.load_state_dict(state)
    structure = load_compressed_state_dict_(fresh, state)
    assert structure["qf0.2"] == {"block_size": 4, "pruned": False}
    x = torch.randn(4, 5)
    assert torch.equal(fresh(x), critic(x))
    assert is_block_circulant(fresh.qf1[2]) and not is_block_circulant(fresh.qf1[0])


@pytest.mark.parametrize("hidden", [8, 24])
def test_a_state_dict_of_another_architecture_is_refused_and_leaves_the_module_as_it_was(hidden):
    torch.manual_seed(0)
    critic = TwinCritic(hidden=16)
    block_circulant_(critic, 4)
    other = TwinCritic(hidden=hidden)  # dense, and another width
    before = {k: v.clone() for k, v in other.state_dict().items()}
    parameters = list(other.parameters())  # what an optimizer built on it holds
    x = torch.randn(3, 5)
    out_before = other(x)
    with pytest.raises(ValueError, match="does not fit this TwinCritic"):
        load_compressed_state_dict_(other, critic.state_dict())
    after = other.state_dict()
    assert list(after) == list(before)  # no layer stayed block-circulant: the keys are the dense ones
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert not any(is_block_circulant(layer) for net in other.q_networks for layer in net)
    assert all(a is b for a, b in zip(other.parameters(), parameters, strict=True))
    assert torch.equal(other(x), out_before)


def test_state_dict_round_trip_into_the_same_structure(tmp_path):
    torch.manual_seed(0)
    net, other = mlp(), mlp()
    block_circulant_(net, 4)
    block_circulant_(other, 4)
    torch.save(net.state_dict(), tmp_path / "net.pt")
    other.load_state_dict(torch.load(tmp_path / "net.pt"))
    x = torch.randn(4, 6)
    assert torch.equal(other(x), net(x))


def test_deepcopy_is_independent_and_block_circulant():
    torch.manual_seed(0)
    net = mlp()
    block_circulant_(net, 4)
    net(torch.randn(2, 6)).sum().backward()
    clone = copy.deepcopy(net)
    x = torch.randn(4, 6)
    assert torch.equal(clone(x), net(x)) and is_block_circulant(clone[2])
    with torch.no_grad():
        clone[2].parametrizations.weight.original.add_(1.0)
    assert not torch.equal(clone(x), net(x))


def test_conv2d_layers_are_block_circulant_at_every_kernel_position():
    torch.manual_seed(0)
    cnn = small_cnn()
    report = block_circulant_(cnn, 4)
    assert report.compressed == ["2", "4"]
    assert circulant_vectors(cnn[2]).shape == (2, 2, 4, 3, 3)
    weight = cnn[2].weight.detach()
    for kh in range(3):
        for kw in range(3):
            assert is_block_circulant_matrix(weight[:, :, kh, kw], 4)
    x = torch.randn(2, 3, 4, 4)
    expected = nn.functional.conv2d(
        torch.relu(cnn[0](x)), expand_circulant(circulant_vectors(cnn[2])), cnn[2].bias, padding=1
    )
    assert torch.allclose(cnn[2](torch.relu(cnn[0](x))), expected, atol=1e-6)
    clone = copy.deepcopy(cnn)
    assert torch.equal(clone(x), cnn(x))


def test_remove_makes_the_expanded_weight_permanent():
    torch.manual_seed(0)
    net = mlp()
    parameter = net[2].weight
    block_circulant_(net, 4)
    x = torch.randn(4, 6)
    before = net(x)
    assert remove_block_circulant_(net) == ["2", "4"]
    assert type(net[2]) is nn.Linear and net[2].weight is parameter
    assert torch.equal(net(x), before)
    assert is_block_circulant_matrix(net[2].weight.detach(), 4)
    assert set(net.state_dict()) == set(mlp().state_dict())


def test_reapplying_is_idempotent_but_another_block_size_is_an_error():
    net = mlp()
    block_circulant_(net, 4)
    assert block_circulant_(net, 4).compressed == ["2", "4"]
    with pytest.raises(ValueError, match="transition"):
        block_circulant_(net, 2)
    with pytest.raises(ValueError, match="positive int"):
        block_circulant_(net, 0)
    with pytest.raises(ValueError, match="forward_path"):
        block_circulant_(mlp(), 4, forward_path="sparse")


@pytest.mark.parametrize("path", ["fft", "auto"])
def test_fft_and_auto_forward_paths_match_the_dense_path(path):
    torch.manual_seed(0)
    net = mlp((6, 32, 32, 3))
    block_circulant_(net, 8)
    x = torch.randn(5, 6)
    dense_out = net(x)
    dense_grad = torch.autograd.grad(dense_out.sum(), net[2].parametrizations.weight.original)[0]
    assert set_forward_path_(net, path) == 1
    assert net[2].parametrizations.weight[0].forward_path == path
    out = net(x)
    assert torch.allclose(out, dense_out, atol=1e-5)
    grad = torch.autograd.grad(out.sum(), net[2].parametrizations.weight.original)[0]
    assert torch.allclose(grad, dense_grad, atol=1e-5)
    clone = copy.deepcopy(net)
    assert torch.allclose(clone(x), dense_out, atol=1e-5)
    assert set_forward_path_(net, "dense") == 1 and "forward" not in net[2].__dict__
    assert torch.equal(net(x), dense_out)


def test_removing_block_circulant_from_a_deep_copy_leaves_the_original_working():
    import copy

    from rlq.compress import block_circulant_, remove_block_circulant_

    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    block_circulant_(net, 4)
    twin = copy.deepcopy(net)
    x = torch.randn(3, 8)
    expected = net(x)
    remove_block_circulant_(twin)
    assert torch.allclose(net(x), expected)  # torch's shared ParametrizedLinear class would lose `weight`
    assert torch.allclose(twin(x), expected, atol=1e-6)


def spectral_norm(weight: torch.Tensor) -> float:
    return float(torch.linalg.matrix_norm(weight, 2))


@pytest.mark.parametrize("block_size", [2, 4, 8])
def test_scaled_init_keeps_a_fresh_layers_std_and_spectral_norm(block_size):
    """The plain projection of a fresh init shrinks it by about sqrt(B); ``init="scaled"`` keeps its scale."""
    torch.manual_seed(0)
    dense = mlp((17, 400, 304, 304, 6))  # PyTorch's default (i.i.d. uniform) init, as SB3's TD3 uses
    weight = dense[2].weight.detach().clone()
    scaled, projected = copy.deepcopy(dense), copy.deepcopy(dense)
    block_circulant_(scaled, block_size, init="scaled")
    block_circulant_(projected, block_size)  # the default stays the nearest block-circulant matrix
    kept, shrunk = scaled[2].weight.detach(), projected[2].weight.detach()
    assert is_block_circulant_matrix(kept, block_size)
    torch.testing.assert_close(kept / kept.norm(), shrunk / shrunk.norm())  # the same direction
    assert float(kept.norm()) == pytest.approx(float(weight.norm()), rel=1e-5)
    assert float(kept.std()) == pytest.approx(float(weight.std()), rel=0.02)
    assert spectral_norm(kept) == pytest.approx(spectral_norm(weight), rel=0.05)
    assert float(shrunk.std()) == pytest.approx(float(weight.std()) / block_size**0.5, rel=0.05)
    assert spectral_norm(shrunk) < 0.75 * spectral_norm(weight)
    # a stack of such layers keeps its features' scale (the projection shrinks it layer by layer)
    x = torch.randn(512, 17)
    features = lambda net: net[:5](x)  # noqa: E731  (after the two compressed layers)
    assert float(features(scaled).std()) == pytest.approx(float(features(dense).std()), rel=0.25)
    assert float(features(projected).std()) < 0.8 * float(features(dense).std())


def test_scaled_init_of_zero_weights_and_a_bad_init_name():
    layer = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 2))
    nn.init.zeros_(layer[1].weight)
    block_circulant_(layer, 4, init="scaled")
    assert float(layer[1].weight.abs().sum()) == 0.0
    with pytest.raises(ValueError, match="init must be one of"):
        block_circulant_(mlp(), 4, init="orthogonal")
