"""Model size as really serialized, bit-packed n-bit weights, and relative changes for reporting."""

from __future__ import annotations

import copy
import io
import math
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from rlq.quant.layers import bake_parametrizations, output_channel_axis, quantizable_layers
from rlq.quant.tensor import check_bits, integer_range, parse_precision, quantize_to_codes

CODES, SCALE, META = ".codes", ".scale", ".meta"


def relative_change(value: float, reference: float) -> float:
    """Return ``(value - reference) / |reference|``: e.g. -0.75 for a model a quarter of the reference size."""
    value, reference = float(value), float(reference)
    if reference == 0 or not math.isfinite(reference):
        raise ValueError(f"reference must be finite and non-zero, got {reference}")
    return (value - reference) / abs(reference)


def pack_codes(codes: Tensor, bits: int) -> Tensor:
    """Return the unsigned integer ``codes`` (each in ``[0, 2^bits)``) packed ``bits`` bits each into uint8."""
    check_bits(bits)
    flat = codes.detach().cpu().reshape(-1).to(torch.int64).numpy()
    if flat.size and (flat.min() < 0 or flat.max() >= 2**bits):
        raise ValueError(f"codes must lie in [0, {2**bits}) to pack at {bits} bits")
    # Little-endian bit planes: bit j of code i is bit number i * bits + j of the stream.
    planes = ((flat[:, None] >> np.arange(bits)) & 1).astype(np.uint8)
    return torch.from_numpy(np.packbits(planes.reshape(-1), bitorder="little"))


def unpack_codes(packed: Tensor, bits: int, numel: int) -> Tensor:
    """Return the ``numel`` unsigned codes (int64) that :func:`pack_codes` packed at ``bits`` bits."""
    check_bits(bits)
    stream = np.unpackbits(packed.cpu().numpy().astype(np.uint8), bitorder="little")[: numel * bits]
    if stream.size != numel * bits:
        raise ValueError(f"packed data holds fewer than {numel} codes of {bits} bits")
    planes = stream.reshape(numel, bits).astype(np.int64)
    return torch.from_numpy((planes << np.arange(bits)).sum(axis=1))


def pack_state_dict(module: nn.Module, bits: int) -> dict[str, Tensor]:
    """Return ``module``'s state with every Linear / convolution weight stored as packed ``bits``-bit codes.

    Each such weight ``w`` becomes ``w.codes`` (uint8, :func:`pack_codes` of its symmetric per-output-channel
    codes shifted to be non-negative), ``w.scale`` (float32, one per output channel) and ``w.meta``
    (int64: bits, channel axis, shape); every other floating tensor is kept as float32. This is what an ActorQ-style broadcaster
    needs to send; :func:`unpack_state_dict` turns it back into a loadable state dict. A weight holding NaN
    or inf raises a ``ValueError`` naming its key.
    """
    check_bits(bits)
    model = bake_parametrizations(copy.deepcopy(module))
    qmin, _ = integer_range(bits, symmetric=True)
    weights = {f"{name}.weight" if name else "weight": layer for name, layer in quantizable_layers(model)}
    packed: dict[str, Tensor] = {}
    for key, tensor in model.state_dict().items():
        layer = weights.get(key)
        if layer is None:
            packed[key] = tensor.float() if tensor.is_floating_point() else tensor
            continue
        axis = output_channel_axis(layer)
        codes, scale, _ = quantize_to_codes(
            tensor, bits, per_channel_axis=axis, symmetric=True, what=f"the weight {key!r}"
        )
        packed[key + CODES] = pack_codes(codes - qmin, bits)
        packed[key + SCALE] = scale.float().reshape(-1)
        packed[key + META] = torch.tensor([bits, axis, *tensor.shape], dtype=torch.int64)
    return packed


def unpack_state_dict(packed: dict[str, Tensor]) -> dict[str, Tensor]:
    """Return the float32 state dict that :func:`pack_state_dict` packed, weights dequantized."""
    state: dict[str, Tensor] = {}
    for key, tensor in packed.items():
        if key.endswith((SCALE, META)):
            continue
        if not key.endswith(CODES):
            state[key] = tensor
            continue
        name = key[: -len(CODES)]
        bits, axis, *dims = packed[name + META].tolist()
        shape = torch.Size(dims)
        qmin, _ = integer_range(bits, symmetric=True)
        codes = unpack_codes(tensor, bits, shape.numel()).reshape(shape) + qmin
        scale_shape = [1] * len(shape)
        scale_shape[axis] = shape[axis]
        state[name] = (codes.to(torch.float32) * packed[name + SCALE].reshape(scale_shape)).float()
    return state


def _serialized_size(obj: object) -> int:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getbuffer().nbytes


def model_size_bytes(module_or_path: nn.Module | str | os.PathLike, precision: str | None = None) -> int:
    """Return the serialized size in bytes of a model, or of an ONNX (or any) file.

    For a module: the size of ``torch.save(state_dict)``, as the module is (``precision=None``: an int8 module
    from :func:`rlq.quant.ptq` counts its packed int8 weights) or stored at ``precision``: ``"fp32"``,
    ``"fp16"`` and ``"bf16"`` cast its floating tensors; ``"intN"`` stores its Linear / convolution weights
    as N-bit codes (:func:`pack_state_dict`, per-channel scales included) and the rest as float32. For a
    path: the file's size (``precision`` must then be None).
    """
    if isinstance(module_or_path, (str, os.PathLike)):
        if precision is not None:
            raise ValueError("a file's size is what it is: pass precision=None with a path")
        path = Path(module_or_path)
        if not path.is_file():
            raise FileNotFoundError(f"no file at {path}")
        return path.stat().st_size
    if not isinstance(module_or_path, nn.Module):
        raise TypeError(f"expected an nn.Module or a path, got {type(module_or_path).__name__}")
    if precision is None:
        return _serialized_size(module_or_path.state_dict())
    spec = parse_precision(precision)
    if not spec.is_float:
        return _serialized_size(pack_state_dict(module_or_path, spec.bits))
    state = {
        key: tensor.to(spec.dtype) if tensor.is_floating_point() else tensor
        for key, tensor in module_or_path.state_dict().items()
    }
    return _serialized_size(state)
