"""Bits per weight, counted as a real export stores the weights: values, sparse indices, scales.

:func:`bits_per_weight` is the storage of every ``nn.Linear`` / ``nn.Conv*`` weight of a module (biases
excluded), in bits, over the module's dense weight count; :func:`size_report` gives the same count per layer.
A dense fp32 network is exactly 32.0; a dense int8 one is 8 plus its scales.

What each layer stores (the rule; structure is read from the module itself, as ``torch`` keeps it):

- **Stored values.** The tensor a layer keeps is its weight, or, when the weight is parametrized
  (``torch.nn.utils.parametrize``), the parametrization's ``original``: the B-vectors of a
  block-circulant layer (``rlq.compress``), ``out * in / B`` values, or the latent weight beneath QAT's
  fake quantization. A ``torch.nn.utils.prune`` mask on that tensor (``<name>_mask``) keeps only its
  non-zero entries; zeros that no mask enforces are stored like any value (as ``rlq.compress.measures``
  counts them).
- **Value width.** In this order: an explicit ``bits`` override (see below); the bit width of QAT's
  :class:`rlq.quant.WeightFakeQuant` on the weight, or the mark :func:`mark_weight_format_` left on a
  converted layer (``rlq.sb3.qat_policy.convert_policy_qat_`` marks its layers); 8 for a ``torch.ao`` quantized layer (``ptq(...,
  "int8")``); else the width of the weight's float dtype (32 for fp32, 16 for fp16 / bf16). A copy made by
  ``ptq(..., "int4")`` holds float values with at most 16 levels and reads as 32 bits unless told.
- **Scales.** An integer layer stores one 32-bit scale per tensor, or per output channel; a
  block-circulant layer quantized per output channel stores one per block row (``out / B``), since the
  ``B`` rows of a block row hold the same values and so share their scale. Zero points (32 bits each) are
  counted only where they are not all zero (asymmetric quantization); rlq's weight quantization is
  symmetric. Float layers store no scale.
- **Sparse index.** A masked tensor of ``n`` positions with ``k`` kept entries stores, whichever is
  cheaper (a tie goes to the bitmask): a **bitmask** of ``n`` bits, or **relative indices** in the manner of
  Deep Compression (Han et al., 2016): each kept entry's distance ``d >= 1`` to the previous kept one
  (row-major order over the stored tensor; the first counted from position -1) as one ``w``-bit code. Codes
  ``0 .. 2^w - 2`` mean "the next kept entry is ``code + 1`` positions on"; the top code ``E = 2^w - 1`` is a
  **filler**: "move ``E`` positions on, nothing kept here". A gap ``d`` thus takes ``(d - 1) // E`` fillers
  and one code, and the index is ``w * (k + fillers)`` bits. ``w`` is chosen per layer as the width (1 up
  to the one that needs no filler) with the fewest bits; a tie goes to the narrower. Unlike Deep
  Compression, whose filler is a stored zero weight, our filler stores no value (our design: the escape
  code costs one index slot, not a value slot as well). A layer with nothing kept stores no index.
- **Block index** (only when asked, with ``block=(R, K)``). A mask that keeps whole ``R x K`` blocks of
  the weight viewed 2-D as ``out x (in * prod(kernel))`` (edge blocks cropped; for a block-circulant
  layer, whole B-vectors of its stored values: what ``rlq.compress`` prunes with ``block``) may instead
  store its index over the block grid: a bitmask of one bit per block, or relative indices over the
  blocks in row-major order, by the rule above; it is a candidate beside the two element indices, and the
  cheapest of the four is counted (a tie goes to an element index). Kept values are counted as before,
  entry by entry. The block-sparse int8 kernel of ``rlq.deploy`` stores its index per block the same way
  (its exact bytes are its ``weight_bytes``).

Per-layer headers (shapes, the index width, the chosen format) are not counted: a few bytes per layer,
the "small header" of a packed file.

``bits`` override: an int (integer codes of that many bits, 2..16, with scales), or a precision name
(``"fp32"``, ``"fp16"``, ``"bf16"``, ``"int4"``, ``"sim8"``, ``"int8"``: :func:`rlq.quant.parse_precision`),
for every layer, or a mapping from layer names (as ``named_modules`` gives them) to such values for some
layers. Overridden integer layers get scales per output channel for convolutions and per tensor for
``nn.Linear`` (what :func:`rlq.quant.ptq` does) unless ``per_channel`` says otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from rlq.core.blocks import expand_kept_blocks, kept_blocks
from rlq.quant.qat import WeightFakeQuant
from rlq.quant.quantizable import is_quantizable, output_channel_axis
from rlq.quant.tensor import MAX_BITS, MIN_BITS, Precision, check_bits, parse_precision

SCALE_BITS = 32
"""Bits of one stored scale or zero point (float32 / int32)."""

BitsSpec = int | str | Precision
"""One layer's override: integer code bits, or a precision name such as ``"int4"`` or ``"fp16"``."""

WEIGHT_FORMAT = "rlq_weight_format"
"""Attribute of a layer whose float weight holds integer levels: ``{"bits": b, "axis": a}`` (set by
:func:`mark_weight_format_`; kept by ``copy.deepcopy``, not by ``state_dict``)."""


def mark_weight_format_(layer: nn.Module, bits: int, axis: int | None) -> nn.Module:
    """Return ``layer``, marked as holding ``bits``-bit symmetric levels with scales along weight ``axis``.

    Conversions that bake quantized values into float tensors (``rlq.sb3.qat_policy.convert_policy_qat_``) mark
    their layers, so :func:`bits_per_weight` counts them at their width without an override.
    """
    setattr(layer, WEIGHT_FORMAT, {"bits": check_bits(bits), "axis": axis})
    return layer


@dataclass(frozen=True)
class LayerStorage:
    """The storage of one layer's weight under the module docstring's rule (one row of :func:`size_report`)."""

    name: str
    """Qualified layer name."""
    kind: str
    """``"dense"``, ``"block_circulant"``, ``"pruned"`` or ``"block_circulant+pruned"``."""
    block_size: int | None
    """B of a block-circulant layer, else None."""
    dense: int
    """Dense weight count (what the layer would hold uncompressed)."""
    stored: int
    """Values stored (kept B-vector entries or kept weights)."""
    value_bits: int
    """Bits per stored value."""
    integer: bool
    """Whether values are integer codes (which need scales) rather than floats."""
    scale_axis: int | None
    """Axis of the stored tensor along which the scales vary (None: one scale, or none for floats)."""
    index_format: str | None
    """``"bitmask"``, ``"relative"``, ``"block_bitmask"``, ``"block_relative"`` or None (no mask)."""
    index_width: int | None
    """``w`` of the relative indices (also given when the bitmask was cheaper), else None."""
    index_fillers: int | None
    """Filler codes the relative indices need at width ``index_width`` (None without a mask)."""
    index_block: tuple[int, int] | None
    """``(R, K)`` of the blocks (of the stored values viewed 2-D) that a block index counts, else None."""
    index_bits: int
    """Bits of the sparse index."""
    scales: int
    """Scales (and zero points) stored."""
    scale_bits: int
    """Bits of the scales and zero points."""
    total_bits: int
    """``stored * value_bits + index_bits + scale_bits``."""

    @property
    def bits_per_weight(self) -> float:
        """Return ``total_bits / dense`` (NaN for a layer without weights, e.g. ``nn.Linear(0, 0)``)."""
        return self.total_bits / self.dense if self.dense else float("nan")


def _gaps(mask: Tensor) -> Tensor:
    """Return the distances (int64, each >= 1) between consecutive kept entries of ``mask``, the first from -1."""
    positions = torch.nonzero(mask.detach().reshape(-1)).reshape(-1)
    return torch.diff(positions, prepend=positions.new_tensor([-1]))


def relative_index_cost(mask: Tensor) -> tuple[int, int, int]:
    """Return ``(w, fillers, bits)`` of the cheapest relative indices of ``mask`` (``(0, 0, 0)`` if none is kept)."""
    gaps = _gaps(mask)
    if gaps.numel() == 0:
        return 0, 0, 0
    widest = max(1, math.ceil(math.log2(int(gaps.max()) + 1)))  # 2^w - 1 >= every gap: no filler
    best = None
    for width in range(1, widest + 1):
        fillers = int(((gaps - 1) // (2**width - 1)).sum())
        bits = width * (gaps.numel() + fillers)
        if best is None or bits < best[2]:
            best = (width, fillers, bits)
    return best


def relative_index_width(mask: Tensor) -> int:
    """Return ``w``, the width of the cheapest relative indices of the kept entries of ``mask`` (0 if none is kept)."""
    return relative_index_cost(mask)[0]


def relative_index_codes(mask: Tensor, width: int) -> Tensor:
    """Return the ``width``-bit relative index codes (int64, fillers included) of the kept entries of ``mask``."""
    gaps = _gaps(mask)
    filler = 2**width - 1
    fillers = (gaps - 1) // filler
    codes = torch.full((int(gaps.numel() + fillers.sum()),), filler, dtype=torch.int64)
    # each gap's own code comes after its fillers
    ends = torch.cumsum(fillers + 1, 0) - 1
    codes[ends] = gaps - 1 - fillers * filler
    return codes


def relative_index_positions(codes: Tensor, width: int) -> Tensor:
    """Return the kept positions (int64) that :func:`relative_index_codes` encoded as ``codes``."""
    filler = 2**width - 1
    codes = codes.to(torch.int64)
    steps = torch.where(codes == filler, filler, codes + 1)
    return (torch.cumsum(steps, 0) - 1)[codes != filler]


def _cheaper_index(mask: Tensor) -> tuple[str, int, int, int]:
    """Return ``(format, relative index width, fillers at that width, bits)`` of the cheaper sparse index."""
    width, fillers, relative = relative_index_cost(mask)
    if width == 0:
        return "relative", 0, 0, 0
    bitmask = mask.numel()
    return (
        ("bitmask", width, fillers, bitmask)
        if bitmask <= relative
        else ("relative", width, fillers, relative)
    )


def stored_block(stored: Tensor, circulant: bool, block: tuple[int, int]) -> tuple[int, int]:
    """Return the ``(R, K)`` blocks of ``stored`` viewed 2-D that ``block`` of the dense weight is (one B-vector if circulant)."""
    if len(block) != 2 or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in block):
        raise ValueError(f"block must be two positive ints (rows, inputs), got {block!r}")
    return (1, math.prod(stored.shape[2:])) if circulant else (int(block[0]), int(block[1]))


def whole_kept_blocks(mask: Tensor, block: tuple[int, int]) -> Tensor | None:
    """Return the bool map of ``mask``'s ``block``-shaped blocks that hold a kept entry, or None unless it keeps whole blocks.

    ``mask`` is viewed as ``(shape[0], numel / shape[0])``; edge blocks that ``block`` does not fit are
    cropped (whole means every entry of the block inside the tensor).
    """
    flat = (mask.detach() != 0).reshape(mask.shape[0], -1).cpu().numpy()
    kept = kept_blocks(flat, block)
    whole = np.array_equal(expand_kept_blocks(kept, block, flat.shape), flat)
    return torch.from_numpy(kept) if whole else None


def index_bits(mask: Tensor) -> tuple[str, int, int]:
    """Return ``(format, relative index width, bits)`` of the cheaper sparse index of ``mask``."""
    index_format, width, _, bits = _cheaper_index(mask)
    return index_format, width, bits


def stored_values(layer: nn.Module) -> tuple[Tensor, Tensor | None, bool]:
    """Return a Linear / convolution layer's stored values, their mask (or None), and whether it is parametrized."""
    if parametrize.is_parametrized(layer, "weight"):
        owner, name = layer.parametrizations["weight"], "original"
    else:
        owner, name = layer, "weight"
    mask = owner._buffers.get(f"{name}_mask")
    values = owner._parameters.get(f"{name}_orig")
    return (getattr(owner, name) if values is None else values), mask, owner is not layer


def _torch_quantized_types() -> tuple[type[nn.Module], ...]:
    import torch.ao.nn.quantized as nnq
    from torch.ao.nn.quantized.modules.conv import _ConvNd as QuantizedConv

    return (nnq.Linear, QuantizedConv)


def weight_layers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """Return ``(name, layer)`` of every Linear / convolution of ``module``, ``torch.ao`` quantized ones included."""
    quantized = _torch_quantized_types()
    return [(n, m) for n, m in module.named_modules() if is_quantizable(m) or isinstance(m, quantized)]


def _stored_axis(layer: nn.Module, circulant: bool, axis: int | None) -> int | None:
    """Return the axis of the stored tensor along which scales vary (None: one per tensor)."""
    if axis is None:
        return None
    return 0 if circulant else axis  # per output channel is per block row of the B-vectors (their axis 0)


def _override_for(name: str, bits: BitsSpec | Mapping[str, BitsSpec] | None) -> Precision | None:
    spec = bits.get(name) if isinstance(bits, Mapping) else bits
    if spec is None:
        return None
    if isinstance(spec, bool) or not isinstance(spec, (int, str, Precision)):
        raise TypeError(f"bits for layer {name!r} must be an int or a precision name, got {spec!r}")
    if isinstance(spec, int):
        if not MIN_BITS <= spec <= MAX_BITS:
            raise ValueError(f"bits for layer {name!r} must be in [{MIN_BITS}, {MAX_BITS}], got {spec}")
        return Precision(f"int{spec}", spec, False)
    return parse_precision(spec)


def _format(
    name: str,
    layer: nn.Module,
    stored: Tensor,
    circulant: bool,
    override: Precision | None,
    per_channel: bool | None,
) -> tuple[int, bool, int | None, int]:
    """Return ``(value bits, integer codes?, scale axis of the stored tensor, scales and zero points)``."""
    if override is not None:
        if override.is_float:
            return override.bits, False, None, 0
        channel = per_channel if per_channel is not None else not isinstance(layer, nn.Linear)
        axis = _stored_axis(layer, circulant, output_channel_axis(layer) if channel else None)
        return override.bits, True, axis, 1 if axis is None else stored.shape[axis]
    if isinstance(layer, _torch_quantized_types()):
        weight = layer.weight()
        if weight.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            axis, scales, zero_points = None, 1, weight.q_zero_point() != 0
        else:
            axis, scales = weight.q_per_channel_axis(), weight.q_per_channel_scales().numel()
            zero_points = bool(weight.q_per_channel_zero_points().count_nonzero())
        return weight.element_size() * 8, True, axis, scales * (2 if zero_points else 1)
    quantizers = []
    if parametrize.is_parametrized(layer, "weight"):
        quantizers = [p for p in layer.parametrizations["weight"] if isinstance(p, WeightFakeQuant)]
    marked = getattr(layer, WEIGHT_FORMAT, None)
    if quantizers or marked is not None:
        bits, axis = (
            (quantizers[-1].bits, quantizers[-1].axis) if quantizers else (marked["bits"], marked["axis"])
        )
        axis = _stored_axis(layer, circulant, axis)
        return bits, True, axis, 1 if axis is None else stored.shape[axis]
    if not stored.is_floating_point():
        raise TypeError(f"layer {name!r} stores {stored.dtype} values; give its width with bits=")
    return torch.finfo(stored.dtype).bits, False, None, 0


def _sparse_index(
    mask: Tensor | None, stored: Tensor, circulant: bool, block: tuple[int, int] | None
) -> tuple[str | None, int | None, int | None, int, tuple[int, int] | None]:
    """Return ``(format, relative width, fillers, bits, index block)`` of the cheapest index of ``mask`` (see the module doc)."""
    if mask is None:
        return None, None, None, 0, None
    index_format, width, fillers, bits = _cheaper_index(mask)
    if block is not None:
        shape = stored_block(stored, circulant, block)
        kept = whole_kept_blocks(mask, shape)
        if kept is not None:
            grid_format, grid_width, grid_fillers, grid_bits = _cheaper_index(kept)
            if grid_bits < bits:
                return f"block_{grid_format}", grid_width, grid_fillers, grid_bits, shape
    return index_format, width, fillers, bits, None


def layer_storage(
    name: str,
    layer: nn.Module,
    bits: BitsSpec | None = None,
    per_channel: bool | None = None,
    block: tuple[int, int] | None = None,
) -> LayerStorage:
    """Return what one Linear / convolution layer stores, under the module docstring's rule (``block``: its block index)."""
    if isinstance(layer, _torch_quantized_types()):
        stored, mask, parametrized = layer.weight(), None, False
        dense = stored.numel()
    else:
        stored, mask, parametrized = stored_values(layer)
        dense = math.prod(layer.weight.shape)
    circulant = parametrized and stored.dim() == layer.weight.dim() + 1
    value_bits, integer, scale_axis, scales = _format(
        name, layer, stored, circulant, _override_for(name, bits), per_channel
    )
    kept = stored.numel() if mask is None else int(mask.count_nonzero())
    index_format, width, fillers, idx_bits, index_block = _sparse_index(mask, stored, circulant, block)
    kinds = (["block_circulant"] if circulant else []) + (["pruned"] if mask is not None else [])
    kind = "+".join(kinds) or "dense"
    scale_bits = scales * SCALE_BITS
    return LayerStorage(
        name=name,
        kind=kind,
        block_size=int(stored.shape[2]) if circulant else None,
        dense=int(dense),
        stored=kept,
        value_bits=int(value_bits),
        integer=integer,
        scale_axis=scale_axis,
        index_format=index_format,
        index_width=width,
        index_fillers=fillers,
        index_block=index_block,
        index_bits=idx_bits,
        scales=scales,
        scale_bits=scale_bits,
        total_bits=kept * int(value_bits) + idx_bits + scale_bits,
    )


def size_report(
    module: nn.Module,
    bits: BitsSpec | Mapping[str, BitsSpec] | None = None,
    per_channel: bool | None = None,
    block: tuple[int, int] | None = None,
) -> list[dict[str, Any]]:
    """Return one row per Linear / convolution weight: its storage fields and ``bits_per_weight``.

    ``pandas.DataFrame(size_report(m))`` makes the table. ``bits``, ``per_channel`` and ``block`` (the block
    index): see the module docstring. A layer reachable under several names is counted once.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(module).__name__}")
    if isinstance(bits, Mapping):
        known = {name for name, _ in weight_layers(module)}
        unknown = sorted(set(bits) - known)
        if unknown:
            raise ValueError(f"bits names layers the module does not have: {unknown}")
    rows = []
    with torch.no_grad():
        for name, layer in weight_layers(module):
            storage = layer_storage(name, layer, _layer_spec(name, bits), per_channel, block)
            rows.append({**asdict(storage), "bits_per_weight": storage.bits_per_weight})
    return rows


def _layer_spec(name: str, bits: BitsSpec | Mapping[str, BitsSpec] | None) -> BitsSpec | None:
    return bits.get(name) if isinstance(bits, Mapping) else bits


def bits_per_weight(
    module: nn.Module,
    bits: BitsSpec | Mapping[str, BitsSpec] | None = None,
    per_channel: bool | None = None,
    block: tuple[int, int] | None = None,
) -> float:
    """Return the stored bits of all Linear / convolution weights over their dense count (see the module doc).

    ``block=(R, K)`` lets a layer pruned in whole blocks of that shape count a block index.
    """
    rows = size_report(module, bits, per_channel, block)
    if not rows:
        raise ValueError(f"{type(module).__name__} has no Linear or convolution layer to measure")
    dense = sum(r["dense"] for r in rows)
    if dense == 0:
        raise ValueError(
            f"{type(module).__name__}'s Linear and convolution layers hold no weight (all are empty)"
        )
    return sum(r["total_bits"] for r in rows) / dense


__all__ = [
    "SCALE_BITS",
    "WEIGHT_FORMAT",
    "LayerStorage",
    "bits_per_weight",
    "index_bits",
    "layer_storage",
    "mark_weight_format_",
    "relative_index_codes",
    "relative_index_cost",
    "relative_index_positions",
    "relative_index_width",
    "size_report",
    "stored_block",
    "stored_values",
    "weight_layers",
    "whole_kept_blocks",
]
