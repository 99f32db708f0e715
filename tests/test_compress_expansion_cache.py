"""The expansion cache of block-circulant layers: reused only while the B-vectors are bit for bit unchanged."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from stable_baselines3.common.utils import polyak_update
from torch import nn

from conftest import trained_td3_parameters
from rlq.compress import (
    block_circulant_,
    circulant_vectors,
    expand_circulant,
    transition_exact_,
    transition_projection_,
)
from rlq.compress.block_circulant import set_circulant_vectors_
from rlq.compress.expansion_cache import ExpansionCache
from rlq.compress.masks import prune_with_mask_

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one PyTorch thread per test


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))


def hidden_cache(net: nn.Sequential) -> ExpansionCache:
    return net[2].parametrizations.weight[0].expansion_cache


def expected(layer: nn.Module) -> torch.Tensor:
    """Return the dense weight computed from scratch, without any cache."""
    return expand_circulant(circulant_vectors(layer).detach())


def assert_fresh(layer: nn.Module) -> None:
    with torch.no_grad():
        weight = layer.weight
    assert torch.equal(weight, expected(layer))


@pytest.fixture
def net() -> nn.Sequential:
    network = mlp()
    block_circulant_(network, 4)
    return network


def test_a_no_grad_access_reuses_the_expansion_while_the_vectors_are_unchanged(net):
    layer = net[2]
    with torch.no_grad():
        first, second = layer.weight, layer.weight
    assert first is second
    assert torch.equal(first, expected(layer))


def test_polyak_update_through_data_invalidates_the_cache(net):
    """SB3's polyak_update writes through ``.data``, which bumps no version counter: the bits decide."""
    target = copy.deepcopy(net)
    with torch.no_grad():
        target(torch.randn(3, 6))
        before = target[2].weight
        original = target[2].parametrizations.weight.original
        version = original._version
        for p in net.parameters():
            p.data.add_(0.5)
        polyak_update(net.parameters(), target.parameters(), 0.5)
    assert original._version == version  # the cache cannot rely on it
    assert_fresh(target[2])
    with torch.no_grad():
        assert not torch.equal(target[2].weight, before)


def test_optimizer_step_and_in_place_writes_invalidate_the_cache(net):
    layer = net[2]
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
    assert_fresh(layer)
    net(torch.randn(5, 6)).square().sum().backward()
    optimizer.step()
    assert_fresh(layer)
    with torch.no_grad():
        layer.parametrizations.weight.original.mul_(-1.0)
    assert_fresh(layer)
    with torch.no_grad():  # a write that keeps the version but changes one bit: 0.0 to -0.0
        vectors = layer.parametrizations.weight.original
        vectors.data[0, 0, 0] = 0.0
        assert_fresh(layer)
        vectors.data[0, 0, 0] = -0.0
        assert_fresh(layer)
        assert torch.signbit(layer.weight[0, 0])


def test_a_returned_weight_changed_in_place_is_not_reused(net):
    layer = net[2]
    with torch.no_grad():
        layer.weight.add_(1.0)  # meaningless for a parametrized weight; the next access recomputes
    assert_fresh(layer)


def test_set_vectors_and_block_size_transitions_invalidate_the_cache(net):
    layer = net[2]
    assert_fresh(layer)
    set_circulant_vectors_(layer, torch.randn(4, 4, 4), 4)
    assert_fresh(layer)
    transition_projection_(net, 2)
    assert circulant_vectors(layer).shape == (8, 8, 2)
    assert_fresh(layer)
    other = mlp()
    block_circulant_(other, 4)
    assert_fresh(other[2])
    transition_exact_(other, 2)
    assert_fresh(other[2])


def test_a_mask_on_the_vectors_is_applied(net):
    layer = net[2]
    assert_fresh(layer)
    mask = (torch.rand(4, 4, 4, generator=torch.Generator().manual_seed(1)) > 0.5).float()
    prune_with_mask_(layer.parametrizations.weight, "original", mask)
    assert_fresh(layer)
    with torch.no_grad():
        assert (layer.weight == 0).float().mean() > 0.2
    prune_with_mask_(layer.parametrizations.weight, "original", 1 - mask)
    assert_fresh(layer)


def test_gradients_flow_on_a_hit_and_on_a_miss(net):
    layer = net[2]
    x = torch.randn(7, 6)
    vectors = layer.parametrizations.weight.original
    reference = mlp()
    block_circulant_(reference, 4)
    for _ in range(2):  # a miss, then after a no_grad access (which fills the cache) a hit
        for module in (net, reference):
            module.zero_grad()
        with torch.no_grad():
            net(x)
        net(x).square().sum().backward()
        hidden_cache(reference).expand = lambda v: expand_circulant(v)  # no cache: the reference path
        reference(x).square().sum().backward()
        assert vectors.grad is not None
        assert torch.equal(vectors.grad, reference[2].parametrizations.weight.original.grad)
        for module in (net, reference):
            with torch.no_grad():
                for p in module.parameters():
                    p.sub_(0.1 * p.grad)
    with torch.no_grad():
        weight = layer.weight
    assert weight.grad_fn is None and not weight.requires_grad
    assert layer.weight.requires_grad  # with gradients on, the weight is in the graph again


def test_copies_and_pickles_start_empty(net):
    with torch.no_grad():
        net(torch.randn(2, 6))
    assert hidden_cache(net)._value is not None
    clone = copy.deepcopy(net)
    assert hidden_cache(clone)._value is None
    assert_fresh(clone[2])
    parametrization = pickle.loads(pickle.dumps(net[2].parametrizations.weight[0]))
    assert parametrization.expansion_cache._value is None


def test_inference_mode_and_dtype_changes_bypass_or_miss(net):
    layer = net[2]
    with torch.inference_mode():
        weight = layer.weight
    assert torch.equal(weight, expected(layer))
    assert_fresh(layer)
    net.double()
    assert_fresh(layer)
    with torch.no_grad():
        assert layer.weight.dtype == torch.float64


def train_td3(with_qat: bool) -> list[torch.Tensor]:
    """Return every parameter of a tiny TD3 trained with GST (B=4, a transition to B=2), and QAT if asked."""
    from rlq.sb3.gst_callback import GSTCallback
    from rlq.sb3.qat_callback import QATCallback

    gst = GSTCallback(total_steps=160, block_schedule=((0.0, 4), (0.5, 2)), bc_end=1.0, s_shift=1.0)
    return trained_td3_parameters(
        [gst, QATCallback(4, delay_steps=60, convert_at_end=False)] if with_qat else gst
    )


@pytest.mark.parametrize("with_qat", [False, True], ids=["gst", "gst+qat"])
def test_td3_with_gst_trains_bit_for_bit_as_without_the_cache(monkeypatch, with_qat):
    """Target networks, the rollout actor and the actor loss hit the cache; the trained weights are unchanged."""
    hits = []
    lookup = ExpansionCache.get

    def counting_lookup(self, vectors):
        dense = lookup(self, vectors)
        hits.append(dense is not None)
        return dense

    monkeypatch.setattr(ExpansionCache, "get", counting_lookup)
    cached = train_td3(with_qat)
    assert sum(hits) > len(hits) / 3  # TD3 reuses about 4 expansions in 9
    monkeypatch.setattr(ExpansionCache, "expand", lambda self, vectors: expand_circulant(vectors))
    uncached = train_td3(with_qat)
    assert len(cached) == len(uncached)
    for a, b in zip(cached, uncached, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_a_change_past_the_first_entries_is_seen():
    """The comparison first looks at a few entries, then at all of them."""
    layer = nn.Linear(400, 300)
    block_circulant_(nn.Sequential(nn.Linear(4, 400), layer, nn.Linear(300, 2)), 4)
    assert_fresh(layer)
    with torch.no_grad():
        layer.parametrizations.weight.original.data[-1, -1, -1] += 1.0
    assert_fresh(layer)
