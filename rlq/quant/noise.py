"""The matched random-noise control for quantization: weights perturbed by noise of a quantization step's size.

Rounding a weight to a grid of step ``Δ`` moves it by at most ``Δ/2``; for weights spread over many steps
that error is close to uniform on ``[-Δ/2, Δ/2]``. :func:`perturb_weights` adds independent draws of exactly
that noise, with the ``Δ`` :func:`rlq.quant.ptq` would use at the same bit width, to the same layers. A
policy that fails under the noise as often as under quantization is fragile, not badly quantized (the
control QuaRL's bit sweep lacks).
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from rlq.quant.quantizable import (
    bake_parametrizations,
    check_finite_weights,
    output_channel_axis,
    quantizable_layers,
    weight_name,
)
from rlq.quant.tensor import check_bits, quantization_params


def quantization_step(
    layer: nn.Module, bits: int, per_channel_linear: bool = False, *, what: str = ""
) -> torch.Tensor:
    """Return the quantization step ``Δ`` of ``layer.weight`` at ``bits`` bits, shaped to broadcast against it.

    ``Δ`` is the scale :func:`rlq.quant.quantize_tensor` uses (symmetric: ``max|w| / (2^(bits-1) - 1)``), per
    output channel for convolutions and, with ``per_channel_linear``, for linear layers, per tensor
    otherwise, exactly as :func:`rlq.quant.ptq` quantizes the layer at ``"int{bits}"``. An all-zero tensor
    or channel, which quantization leaves exact, gets ``Δ = 0``.
    """
    weight = layer.weight.detach()
    per_channel = per_channel_linear or not isinstance(layer, nn.Linear)
    axis = output_channel_axis(layer) if per_channel else None
    scale, _ = quantization_params(weight, bits, axis, symmetric=True, what=what or "the weight")
    if axis is None:
        magnitude = weight.abs().max()
    else:
        dims = tuple(d for d in range(weight.dim()) if d != axis % weight.dim())
        magnitude = weight.abs().amax(dim=dims, keepdim=True)
    return torch.where(magnitude > 0, scale, torch.zeros_like(scale))


def perturb_weights(
    module: nn.Module, bits: int, *, seed: int, per_channel_linear: bool = False
) -> nn.Module:
    """Return an eval-mode copy of ``module`` whose Linear / convolution weights carry uniform noise in ``[-Δ/2, Δ/2]``.

    ``Δ`` is each weight's quantization step at ``bits`` bits (:func:`quantization_step`; per tensor or per
    output channel as :func:`rlq.quant.ptq` with the same ``per_channel_linear``). Every entry gets an
    independent draw; biases, other parameters and buffers are untouched. ``seed`` fixes the draws: the
    same seed reproduces the copy, different seeds give independent ones. ``module`` itself is left untouched;
    parametrizations are made permanent in the copy first, and a weight holding NaN or inf raises a
    ``ValueError`` naming its layer.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(module).__name__}")
    check_bits(bits)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    model = bake_parametrizations(copy.deepcopy(module).eval())
    layers = quantizable_layers(model)
    if not layers:
        raise ValueError(f"{type(module).__name__} has no Linear or convolution layer to perturb")
    check_finite_weights(model, f"noise of int{bits}")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, layer in layers:
            what = f"{weight_name(name)} to noise of int{bits}"
            step = quantization_step(layer, bits, per_channel_linear, what=what)
            uniform = torch.rand(layer.weight.shape, generator=generator, dtype=step.dtype)  # [0, 1)
            noise = (uniform - 0.5) * step
            layer.weight.add_(noise.to(device=layer.weight.device, dtype=layer.weight.dtype))
    return model
