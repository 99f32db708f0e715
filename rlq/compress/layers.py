"""Which layers of a module a compression touches: networks, their first and last layers, and the report.

A module may hold several independent networks (an SB3 critic holds two Q-networks, an actor-critic
policy an actor and a critic), so "keep the first and last layer dense" must be decided per network,
never as ``[1:-1]`` over ``module.modules()``. :func:`find_networks` groups the compressible layers
(``nn.Linear`` and ``nn.Conv1d/2d/3d``) into networks in one of three ways:

- ``"sequential"`` (default): each outermost ``nn.Sequential`` is one network, holding every compressible
  layer below it in registration order (nested containers flattened). Layers under no ``nn.Sequential``
  form "leaf chains": the compressible layers that are direct children of the same parent, in
  registration order. This fits MLP policies: an SB3 actor's ``mu``, each of a critic's ``qf0``/``qf1``.
  It does not fit networks whose output layer lives outside their ``nn.Sequential`` (SB3's PPO/A2C
  ``mlp_extractor`` plus ``action_net``): pass explicit groups for those.
- ``"whole"``: every compressible layer of ``module`` is one network (a ResNet, a CNN classifier).
- explicit groups: a sequence of sequences of qualified layer names (as in ``named_modules()``), one per
  network, in forward order; layers named in no group are never eligible.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from torch import nn

#: Layers whose weight rlq.compress can make block-circulant or prune.
COMPRESSIBLE_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
#: Layers whose weights the measures count (transposed convolutions included, always dense).
WEIGHT_LAYER_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.modules.conv._ConvNd)

Networks = Literal["sequential", "whole"] | Sequence[Sequence[str]]


@dataclass
class CompressionReport:
    """What an in-place compression did: the layers it compressed, those left dense and why."""

    compressed: list[str] = field(default_factory=list)
    """Qualified names of the layers now compressed by this transform."""
    dense: dict[str, str] = field(default_factory=dict)
    """Layers left as they were, with the reason (first/last layer, block size does not divide, ...)."""
    covered_fraction: float = 0.0
    """Fraction of the module's Linear/Conv weight parameters (biases excluded) held by ``compressed``."""
    shift: dict[str, float] = field(default_factory=dict)
    """Relative Frobenius change of each layer's dense weight, for transforms that move values."""


def weight_layers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """Return ``(name, layer)`` for every Linear and convolution of ``module``, in registration order."""
    return [(name, m) for name, m in module.named_modules() if isinstance(m, WEIGHT_LAYER_TYPES)]


def compressible_layers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """Return ``(name, layer)`` for every layer of ``module`` that rlq.compress can compress, in order."""
    return [(name, m) for name, m in module.named_modules() if _is_compressible(m)]


def _is_compressible(layer: nn.Module) -> bool:
    # parametrize swaps a layer's class for a subclass ("ParametrizedLinear"): accept it, no other.
    cls = type(layer)
    if cls in COMPRESSIBLE_TYPES:
        return True
    return cls.__name__.startswith("Parametrized") and cls.__bases__[0] in COMPRESSIBLE_TYPES


def _ancestors(name: str) -> list[str]:
    """Return the qualified names above ``name``, outermost first ('' is the root)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts))]


def find_networks(module: nn.Module, networks: Networks = "sequential") -> list[list[tuple[str, nn.Module]]]:
    """Return the compressible layers of ``module`` grouped into networks, each in forward order.

    See the module docstring for the three ways of grouping (``"sequential"``, ``"whole"``, explicit names).
    """
    layers = compressible_layers(module)
    if isinstance(networks, str):
        if networks == "whole":
            return [layers] if layers else []
        if networks != "sequential":
            raise ValueError(
                f"networks must be 'sequential', 'whole' or groups of layer names, got {networks!r}"
            )
        sequentials = {name for name, m in module.named_modules() if isinstance(m, nn.Sequential)}
        groups: dict[tuple[str, str], list[tuple[str, nn.Module]]] = {}
        for name, layer in layers:
            outer = next((a for a in _ancestors(name) if a in sequentials), None)
            key = ("sequential", outer) if outer is not None else ("chain", ".".join(name.split(".")[:-1]))
            groups.setdefault(key, []).append((name, layer))
        return list(groups.values())
    by_name = dict(layers)
    seen: set[str] = set()
    result = []
    for group in networks:
        if isinstance(group, str):
            raise ValueError(
                f"networks must be a sequence of sequences of layer names, got the string {group!r}"
            )
        chosen = []
        for name in group:
            if name not in by_name:
                known = ", ".join(by_name) or "none"
                raise ValueError(
                    f"{name!r} is not a compressible layer of the module; compressible layers: {known}"
                )
            if name in seen:
                raise ValueError(f"layer {name!r} appears in more than one network")
            seen.add(name)
            chosen.append((name, by_name[name]))
        if chosen:
            result.append(chosen)
    return result


def classify_layers(
    module: nn.Module, skip_first_last: bool = True, networks: Networks = "sequential"
) -> tuple[list[tuple[str, nn.Module]], dict[str, str]]:
    """Return the eligible ``(name, layer)`` pairs and, for every other compressible layer, why it is not."""
    eligible: list[tuple[str, nn.Module]] = []
    reasons: dict[str, str] = {}
    grouped: set[str] = set()
    for network in find_networks(module, networks):
        last = len(network) - 1
        for index, (name, layer) in enumerate(network):
            grouped.add(name)
            if skip_first_last and index == 0:
                reasons[name] = "first layer of its network (kept dense)"
            elif skip_first_last and index == last:
                reasons[name] = "last layer of its network (kept dense)"
            else:
                eligible.append((name, layer))
    for name, _ in compressible_layers(module):
        if name not in grouped:
            reasons[name] = "in none of the given networks"
    return eligible, reasons


def eligible_layers(
    module: nn.Module, skip_first_last: bool = True, networks: Networks = "sequential"
) -> list[tuple[str, nn.Module]]:
    """Return the ``(name, layer)`` pairs a compression may touch: with ``skip_first_last``, every network's
    layers except its first and last (a network of one or two layers then contributes none)."""
    return classify_layers(module, skip_first_last, networks)[0]


def covered_fraction_of(module: nn.Module, names: Iterable[str]) -> float:
    """Return the fraction of ``module``'s Linear/Conv weight parameters that sit in the layers ``names``."""
    wanted = set(names)
    total = covered = 0
    for name, layer in weight_layers(module):
        n = dense_weight_numel(layer)
        total += n
        if name in wanted:
            covered += n
    return covered / total if total else 0.0


def dense_weight_numel(layer: nn.Module) -> int:
    """Return how many numbers the layer's weight holds when dense (``out * in / groups * prod(kernel)``)."""
    if isinstance(layer, nn.Linear):
        return layer.out_features * layer.in_features
    if isinstance(layer, nn.modules.conv._ConvNd):
        return layer.out_channels * (layer.in_channels // layer.groups) * math.prod(layer.kernel_size)
    raise TypeError(f"not a Linear or convolution layer: {type(layer).__name__}")
