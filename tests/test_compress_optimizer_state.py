"""Optimizer state of masked entries: parking changes no weight, regrown entries start fresh."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from conftest import relu_mlp as mlp
from rlq.compress import magnitude_prune_, park_masked_state_, reset_optimizer_state_
from rlq.compress.masks import mask_of, stored_tensor
from rlq.compress.optimizer_state import PARKED_SECOND_MOMENT, SECOND_MOMENT_KEYS

OPTIMIZERS = {
    "Adam": lambda params: torch.optim.Adam(params, lr=1e-2),
    "AdamW": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1),
    "Adam amsgrad": lambda params: torch.optim.Adam(params, lr=1e-2, amsgrad=True),
    # SB3's A2C: RMSprop with alpha 0.99 and eps 1e-5
    "RMSprop": lambda params: torch.optim.RMSprop(params, lr=1e-2, alpha=0.99, eps=1e-5),
    "RMSprop centered momentum": lambda params: torch.optim.RMSprop(
        params, lr=1e-2, centered=True, momentum=0.9
    ),
    "SGD momentum": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
    "Adagrad": lambda params: torch.optim.Adagrad(params, lr=1e-2),
}


def step(net: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        net(x).square().mean().backward()
        optimizer.step()


def park_all(net: nn.Module, optimizer: torch.optim.Optimizer, previous: dict | None = None) -> int:
    changed = 0
    for name, layer in net.named_children():
        mask = mask_of(layer, "weight")
        if mask is not None:
            prev = (previous or {}).get(name)
            changed += park_masked_state_(optimizer, stored_tensor(layer, "weight"), mask, prev)
    return changed


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_parking_leaves_training_unchanged_to_the_bit(name):
    torch.manual_seed(0)
    x = torch.randn(32, 6)
    net = mlp()
    optimizer = OPTIMIZERS[name](net.parameters())
    step(net, optimizer, x, 3)  # state exists before the masks come
    magnitude_prune_(net, 0.75)
    twin, twin_optimizer = copy.deepcopy((net, optimizer))  # one memo: the copy steps the copied weights
    assert park_all(twin, twin_optimizer) > 0
    decays = twin_optimizer.param_groups[0].get("weight_decay", 0) != 0
    for _ in range(3):  # masks changing in between, as GST's and gradual pruning's updates do
        frozen = [
            (layer.weight_orig.detach().clone(), layer.weight_mask == 0) for layer in (twin[2], twin[4])
        ]
        step(net, optimizer, x, 4)
        step(twin, twin_optimizer, x, 4)
        if not decays:  # a parked entry's update is exactly 0 (decoupled weight decay still shrinks it)
            for (before, masked), layer in zip(frozen, (twin[2], twin[4]), strict=True):
                assert torch.equal(layer.weight_orig.detach()[masked], before[masked])
        for a, b in zip(net.parameters(), twin.parameters(), strict=True):
            assert a.shape == b.shape
        for layer, twin_layer in zip(net, twin, strict=True):
            assert torch.equal(
                getattr(layer, "weight", torch.zeros(1)), getattr(twin_layer, "weight", torch.zeros(1))
            )
        magnitude_prune_(net, 0.8)
        magnitude_prune_(twin, 0.8)
        park_all(twin, twin_optimizer)
    assert torch.equal(net(x), twin(x))


def test_masked_entries_are_parked_and_regrown_entries_start_from_zero_state():
    torch.manual_seed(0)
    x = torch.randn(32, 6)
    net = mlp()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    magnitude_prune_(net, 0.75)
    step(net, optimizer, x, 5)
    assert park_all(net, optimizer) == 4  # two masked layers, exp_avg and exp_avg_sq each
    layer = net[2]
    masked = layer.weight_mask == 0
    state = optimizer.state[layer.weight_orig]
    assert (state["exp_avg"][masked] == 0).all()
    assert (state["exp_avg_sq"][masked] == PARKED_SECOND_MOMENT).all()
    kept_sq = state["exp_avg_sq"][~masked].clone()
    assert (kept_sq != PARKED_SECOND_MOMENT).all()  # kept entries untouched

    previous = {"2": layer.weight_mask.clone(), "4": net[4].weight_mask.clone()}
    magnitude_prune_(net, 0.5)  # lowering the sparsity regrows entries from 0
    regrown = (previous["2"] == 0) & (layer.weight_mask == 1)
    assert regrown.any()
    park_all(net, optimizer, previous)
    for key in ("exp_avg", "exp_avg_sq"):
        assert (state[key][regrown] == 0).all()
    assert (state["exp_avg_sq"][layer.weight_mask == 0] == PARKED_SECOND_MOMENT).all()
    assert torch.equal(state["exp_avg_sq"][~masked], kept_sq)


def test_parameters_without_state_are_left_alone_and_bad_masks_are_rejected():
    net = mlp()
    optimizer = torch.optim.Adam(net.parameters())
    magnitude_prune_(net, 0.5)
    assert park_all(net, optimizer) == 0  # no step yet: no state to park
    with pytest.raises(ValueError, match="does not fit"):
        park_masked_state_(optimizer, net[2].weight_orig, torch.ones(3, 3))
    assert reset_optimizer_state_(optimizer) == 0


def test_second_moment_keys_are_the_optimizers_own_names():
    # the keys must match what torch's optimizers store, or parking silently misses them
    p = nn.Parameter(torch.randn(4))
    stored = set()
    for make in OPTIMIZERS.values():
        optimizer = make([p])
        p.grad = torch.randn(4)
        optimizer.step()
        stored |= {k for k, v in optimizer.state[p].items() if torch.is_tensor(v) and v.shape == p.shape}
    assert SECOND_MOMENT_KEYS <= stored
