"""The one walk over a model that every quantization transform shares: which layers, which weight axis."""

from __future__ import annotations

import torch.nn as nn
from torch.nn.modules.conv import _ConvNd
from torch.nn.utils import parametrize

from rlq.core.parametrizations import remove_parametrizations_
from rlq.quant.tensor import check_finite

QUANTIZABLE_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, _ConvNd)
"""Layers whose ``weight`` rlq quantizes: ``nn.Linear`` and every ``nn.ConvNd`` / ``nn.ConvTransposeNd``."""


def is_quantizable(layer: nn.Module) -> bool:
    """Return whether ``layer`` is a Linear or convolution layer whose weight rlq quantizes."""
    return isinstance(layer, QUANTIZABLE_TYPES)


def quantizable_layers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """Return ``(qualified name, layer)`` for every Linear and convolution layer in ``module``, itself included."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(module).__name__}")
    found = []
    for name, layer in module.named_modules():
        if not is_quantizable(layer):
            continue
        if isinstance(layer.weight, nn.parameter.UninitializedParameter):
            raise ValueError(
                f"layer {name or '<root>'} is lazy and not initialised yet: run one forward pass first"
            )
        found.append((name, layer))
    return found


def weight_name(name: str) -> str:
    """Return how error messages name the weight of the layer called ``name`` (``""`` is the root module)."""
    return f"the weight of layer {name or '<root>'!r}"


def check_finite_weights(module: nn.Module, precision: str) -> None:
    """Raise a ``ValueError`` naming the first Linear / convolution layer whose weight holds NaN or inf.

    Quantizing such a weight would destroy the rest of it (see ``rlq.quant.tensor``); one ``isfinite`` per weight.
    """
    for name, layer in quantizable_layers(module):
        check_finite(layer.weight, f"{weight_name(name)} to {precision}")


def has_convolutions(module: nn.Module) -> bool:
    """Return whether ``module`` holds any convolution layer."""
    return any(isinstance(layer, _ConvNd) for layer in module.modules())


def output_channel_axis(layer: nn.Module) -> int:
    """Return the axis of ``layer.weight`` that indexes output channels (1 for transposed convolutions)."""
    if isinstance(layer, _ConvNd) and layer.transposed:
        return 1
    return 0


def bake_parametrizations(module: nn.Module) -> nn.Module:
    """Return ``module`` (changed in place) with every parametrization and pruning mask made permanent in its tensor.

    ``torch.nn.utils.prune`` masks are forward pre-hooks that recompute ``weight`` from ``weight_orig`` at every
    call: left in place, they would overwrite a quantized weight with the float one at the next forward.
    """
    from torch.nn.utils import prune

    for layer in list(module.modules()):
        if parametrize.is_parametrized(layer):
            for tensor_name in list(layer.parametrizations.keys()):
                remove_parametrizations_(layer, tensor_name, leave_parametrized=True)
        for hook in list(layer._forward_pre_hooks.values()):
            if isinstance(hook, prune.BasePruningMethod):
                prune.remove(layer, hook._tensor_name)
    return module
