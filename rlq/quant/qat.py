"""Quantization-aware training (QAT): fake-quantized weights with a straight-through estimator.

QuaRL (Krishnan et al., arXiv 1910.01055, section 4.2) trains with n-bit fake quantization switched on after
a "quantization delay". Its public code inserts no fake quantization at all at its current head (its issue
#15); here :func:`prepare_qat_` always registers a :class:`WeightFakeQuant` parametrization on every Linear
and convolution weight, and a test checks that the forward pass really changes.

Usage: ``prepare_qat_(policy, bits=4)``; train (``set_qat_enabled(policy, False)`` until the delay has
passed); then ``convert_qat_(policy)`` bakes the quantized weights into plain parameters.
"""

from __future__ import annotations

import torch.nn as nn
from torch import Tensor
from torch.nn.utils import parametrize

from rlq.core.parametrizations import remove_parametrizations_
from rlq.quant.activations import attach_input_quantizers, input_quantizers
from rlq.quant.quantizable import output_channel_axis, quantizable_layers, weight_name
from rlq.quant.tensor import check_bits, fake_quantize_symmetric, straight_through


class WeightFakeQuant(nn.Module):
    """Parametrization: fake-quantize a weight to ``bits`` (symmetric, see ``rlq.quant.tensor``) with an STE.

    The scale follows the weight's current range (per slice along ``axis``, or per tensor if None), so no
    value is clipped and the straight-through gradient is the identity. Disabled, the weight passes unchanged.

    A weight that holds NaN or inf when enabled raises a ``ValueError`` naming ``layer_name`` (set by
    :func:`prepare_qat_`): fake-quantized, it would turn its whole channel to NaN or zero and training would go
    on with NaN losses, so training stops at the first such forward pass instead. Training that diverges
    before the quantization delay ends (disabled) is left to the float model, as without QAT.
    """

    def __init__(self, bits: int, axis: int | None = 0, layer_name: str | None = None):
        super().__init__()
        self.bits = check_bits(bits)
        self.axis = axis
        self.enabled = True
        self.layer_name = layer_name  # the qualified name of the layer, for error messages

    def forward(self, weight: Tensor) -> Tensor:
        if not self.enabled:
            return weight
        what = "a QAT weight" if self.layer_name is None else f"{weight_name(self.layer_name)} in QAT"
        # the scale follows the weight, so nothing is clipped: the gradient is the identity
        return straight_through(weight, fake_quantize_symmetric(weight, self.bits, self.axis, what=what))

    def extra_repr(self) -> str:
        return f"bits={self.bits}, axis={self.axis}, enabled={self.enabled}"


def _weight_quantizers(layer: nn.Module) -> list[WeightFakeQuant]:
    if not parametrize.is_parametrized(layer, "weight"):
        return []
    return [p for p in layer.parametrizations["weight"] if isinstance(p, WeightFakeQuant)]


def weight_quantizers(module: nn.Module) -> list[WeightFakeQuant]:
    """Return every :class:`WeightFakeQuant` registered in ``module``."""
    return [q for layer in module.modules() for q in _weight_quantizers(layer)]


def is_qat(module: nn.Module) -> bool:
    """Return whether ``module`` holds QAT weight fake quantization (prepared and not yet converted)."""
    return bool(weight_quantizers(module))


def prepare_qat_(
    module: nn.Module, bits: int, activations: bool = False, per_channel: bool = True
) -> nn.Module:
    """Return ``module``, changed in place to train with ``bits``-bit fake quantization (enabled).

    Every Linear and convolution weight gets a :class:`WeightFakeQuant` parametrization (per output channel
    with ``per_channel``, else per tensor). The Parameter objects stay the same, so an optimizer built before
    keeps training them. With ``activations`` each such layer's input is fake-quantized too, over a range
    tracked by a moving average (``rlq.quant.activations``). Parametrizations already on a weight (pruning,
    block-circulant structure) run first and the quantizer quantizes their result.
    """
    check_bits(bits)
    if is_qat(module):
        raise ValueError("module is already prepared for QAT; convert_qat_ it or start from a fresh copy")
    layers = quantizable_layers(module)
    if not layers:
        raise ValueError(f"{type(module).__name__} has no Linear or convolution layer to quantize")
    for name, layer in layers:
        axis = output_channel_axis(layer) if per_channel else None
        parametrize.register_parametrization(layer, "weight", WeightFakeQuant(bits, axis, layer_name=name))
    if activations:
        attach_input_quantizers(module, bits, momentum=0.01)
    return module


def set_qat_enabled(module: nn.Module, enabled: bool) -> int:
    """Return the number of quantizers (weights and activations) in ``module`` switched on or off.

    Off, the forward pass equals the float forward exactly (activation ranges are still observed, so they
    are ready when a quantization delay ends).
    """
    quantizers = [*weight_quantizers(module), *input_quantizers(module)]
    if not quantizers:
        raise ValueError("module has no QAT quantizer: call prepare_qat_ first")
    for quantizer in quantizers:
        quantizer.enabled = bool(enabled)
    return len(quantizers)


def convert_qat_(module: nn.Module) -> nn.Module:
    """Return ``module`` with its quantized weights baked in place into plain parameters.

    Each converted weight holds at most ``2^bits`` distinct values (per output channel if prepared per
    channel), whether or not QAT was enabled. Other parametrizations on the same weights are made permanent
    too. Activation quantizers stay, enabled, with their observed ranges frozen.
    """
    converted = 0
    for layer in list(module.modules()):
        quantizers = _weight_quantizers(layer)
        if not quantizers:
            continue
        for quantizer in quantizers:
            quantizer.enabled = True
        remove_parametrizations_(layer, "weight", leave_parametrized=True)
        converted += 1
    if not converted:
        raise ValueError("module has no QAT quantizer to convert: call prepare_qat_ first")
    for quantizer in input_quantizers(module):
        quantizer.enabled, quantizer.observing = True, False
    return module
