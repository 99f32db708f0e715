"""Fake quantization of layer inputs (activations), for simulated PTQ and for QAT.

Each Linear / convolution layer gets an :class:`ActivationQuantizer` child named ``input_quantizer`` and a
forward pre-hook that passes the layer's input through it: integer hardware multiplies quantized inputs by
quantized weights, so the input of every such layer is what has to be representable (the network's
observation included).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch import Tensor

from rlq.quant.quantizable import quantizable_layers
from rlq.quant.tensor import check_bits, fake_quantize_ste, integer_range

INPUT_QUANTIZER = "input_quantizer"


class ActivationQuantizer(nn.Module):
    """Asymmetric fake quantization of activations with a clipped straight-through gradient.

    The range ``[min_val, max_val]`` is observed from the tensors that pass while ``observing`` is true: a
    running min/max when ``momentum`` is None (calibration), else an exponential moving average with that
    momentum (QAT, as TensorFlow's and PyTorch's moving-average observers). Before any observation, or
    with ``dynamic``, each batch is quantized over its own range. Observation goes on while ``enabled`` is
    false, so that ranges are ready when a quantization delay ends; disabled, the input passes unchanged.
    """

    def __init__(self, bits: int, momentum: float | None = 0.01, dynamic: bool = False):
        super().__init__()
        self.bits = check_bits(bits)
        if momentum is not None and not 0.0 < momentum <= 1.0:
            raise ValueError(f"momentum must be in (0, 1] or None, got {momentum}")
        self.momentum = momentum
        self.dynamic = dynamic
        self.enabled = True
        self.observing = not dynamic
        self.register_buffer("min_val", torch.tensor(math.inf))
        self.register_buffer("max_val", torch.tensor(-math.inf))

    @property
    def has_range(self) -> bool:
        """Return whether a range has been observed."""
        return bool(torch.isfinite(self.min_val)) and bool(torch.isfinite(self.max_val))

    @torch.no_grad()
    def observe(self, x: Tensor) -> None:
        """Update the observed range with the values of ``x``."""
        lo, hi = x.detach().min().float(), x.detach().max().float()
        if not self.has_range or self.momentum is None:
            lo = torch.minimum(lo, self.min_val) if self.has_range else lo
            hi = torch.maximum(hi, self.max_val) if self.has_range else hi
        else:
            lo = self.min_val + self.momentum * (lo - self.min_val)
            hi = self.max_val + self.momentum * (hi - self.max_val)
        self.min_val.copy_(lo)
        self.max_val.copy_(hi)

    def forward(self, x: Tensor) -> Tensor:
        if self.observing and not self.dynamic:
            self.observe(x)
        if not self.enabled:
            return x
        if self.dynamic or not self.has_range:
            lo, hi = x.detach().min().float(), x.detach().max().float()
        else:
            lo, hi = self.min_val, self.max_val
        qmin, qmax = integer_range(self.bits, symmetric=False)
        lo, hi = lo.clamp(max=0), hi.clamp(min=0)
        scale = (hi - lo) / (qmax - qmin)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        zero_point = torch.clamp(torch.round(-lo / scale), qmin, qmax)
        return fake_quantize_ste(x, scale, zero_point, qmin, qmax, clipped=True)

    def extra_repr(self) -> str:
        mode = "dynamic" if self.dynamic else f"momentum={self.momentum}"
        return f"bits={self.bits}, {mode}, enabled={self.enabled}, observing={self.observing}"


def _quantize_input(layer: nn.Module, args: tuple) -> tuple:
    return (getattr(layer, INPUT_QUANTIZER)(args[0]), *args[1:])


def attach_input_quantizers(
    module: nn.Module, bits: int, momentum: float | None = 0.01, dynamic: bool = False
) -> list[ActivationQuantizer]:
    """Return the input quantizers added (in place) to every Linear and convolution layer of ``module``."""
    check_bits(bits)
    added = []
    for name, layer in quantizable_layers(module):
        if hasattr(layer, INPUT_QUANTIZER):
            raise ValueError(f"layer {name or '<root>'} already has an input quantizer")
        quantizer = ActivationQuantizer(bits, momentum=momentum, dynamic=dynamic).to(layer.weight.device)
        layer.add_module(INPUT_QUANTIZER, quantizer)
        layer.register_forward_pre_hook(_quantize_input)
        added.append(quantizer)
    return added


def input_quantizers(module: nn.Module) -> list[ActivationQuantizer]:
    """Return every :class:`ActivationQuantizer` in ``module``."""
    return [m for m in module.modules() if isinstance(m, ActivationQuantizer)]
