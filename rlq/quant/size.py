"""Model size as really serialized, bit-packed n-bit weights, packed files, and relative changes for reporting.

:func:`save_packed` / :func:`load_packed` write and read the weights exactly as :func:`rlq.quant.bits_per_weight`
counts them (values at their width, sparse index, scales), so a file's size checks that count.
"""

from __future__ import annotations

import copy
import io
import json
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from rlq.core.blocks import expand_kept_blocks
from rlq.quant.bits import (
    BitsSpec,
    LayerStorage,
    relative_index_codes,
    relative_index_positions,
    size_report,
    stored_values,
    weight_layers,
    whole_kept_blocks,
)
from rlq.quant.quantizable import (
    bake_parametrizations,
    is_quantizable,
    output_channel_axis,
    quantizable_layers,
)
from rlq.quant.tensor import check_bits, integer_range, parse_precision, quantize_to_codes

CODES, SCALE, META = ".codes", ".scale", ".meta"


def relative_change(value: float, reference: float) -> float:
    """Return ``(value - reference) / |reference|``: e.g. -0.75 for a model a quarter of the reference size."""
    value, reference = float(value), float(reference)
    if reference == 0 or not math.isfinite(reference):
        raise ValueError(f"reference must be finite and non-zero, got {reference}")
    return (value - reference) / abs(reference)


def _pack_bits(flat: np.ndarray, width: int) -> bytes:
    """Return the non-negative ints ``flat`` packed ``width`` bits each, little-endian bit planes."""
    planes = ((flat.astype(np.int64)[:, None] >> np.arange(width)) & 1).astype(np.uint8)
    return np.packbits(planes.reshape(-1), bitorder="little").tobytes()


def _unpack_bits(data: bytes | np.ndarray, width: int, count: int) -> np.ndarray:
    """Return the ``count`` ints (int64) that :func:`_pack_bits` packed ``width`` bits each."""
    stream = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")[: count * width]
    if stream.size != count * width:
        raise ValueError(f"packed data holds fewer than {count} codes of {width} bits")
    return (stream.reshape(count, width).astype(np.int64) << np.arange(width)).sum(axis=1)


def pack_codes(codes: Tensor, bits: int) -> Tensor:
    """Return the unsigned integer ``codes`` (each in ``[0, 2^bits)``) packed ``bits`` bits each into uint8."""
    check_bits(bits)
    flat = codes.detach().cpu().reshape(-1).to(torch.int64).numpy()
    if flat.size and (flat.min() < 0 or flat.max() >= 2**bits):
        raise ValueError(f"codes must lie in [0, {2**bits}) to pack at {bits} bits")
    # Little-endian bit planes: bit j of code i is bit number i * bits + j of the stream.
    return torch.from_numpy(np.frombuffer(_pack_bits(flat, bits), dtype=np.uint8).copy())


def unpack_codes(packed: Tensor, bits: int, numel: int) -> Tensor:
    """Return the ``numel`` unsigned codes (int64) that :func:`pack_codes` packed at ``bits`` bits."""
    check_bits(bits)
    return torch.from_numpy(_unpack_bits(packed.cpu().numpy().astype(np.uint8).tobytes(), bits, numel))


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


# --------------------------------------------------------------------------------------------------------
# A packed file: what bits_per_weight counts, written out

PACKED_MAGIC = b"RLQPACK1"
"""First bytes of a packed file; then the header's length (uint32, little-endian), the JSON header, the data."""

PACKED_FORMAT = 3
"""The header's ``format``: 3 adds block indices (``block_bitmask``, ``block_relative``: a layer entry's
``index_block`` and ``index_entries``, the blocks kept); 2 writes relative indices with filler codes
(:func:`rlq.quant.bits.relative_index_codes`); files of format 1 (relative indices as ``gap - 1`` in a width
that holds the largest gap, no fillers) and 2 still load."""

READABLE_FORMATS = (1, 2, PACKED_FORMAT)

_FLOAT_DTYPES = {32: torch.float32, 16: torch.float16}


def _tensor_bytes(t: Tensor) -> bytes:
    return t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()


def _bytes_tensor(data: bytes, dtype: torch.dtype, shape: tuple[int, ...] | list[int]) -> Tensor:
    raw = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())
    return raw.view(dtype).reshape(shape)


def _encode_layer(storage: LayerStorage, layer: nn.Module) -> tuple[dict, list[bytes]]:
    """Return one layer's header entry and its data sections: index, values, scales, bias."""
    stored, mask, _ = stored_values(layer)
    values = stored.detach().float() if mask is None else stored.detach().float() * mask
    keep = torch.ones(values.numel(), dtype=torch.bool) if mask is None else mask.reshape(-1) != 0
    indexed, extra = keep, {}
    if storage.index_block is not None:  # the index is over the kept blocks
        indexed = whole_kept_blocks(mask, storage.index_block).reshape(-1)
        extra = {"index_entries": int(indexed.sum())}
    index = b""
    if storage.index_format in ("bitmask", "block_bitmask"):
        index = np.packbits(indexed.numpy().astype(np.uint8), bitorder="little").tobytes()
    elif storage.index_format in ("relative", "block_relative") and storage.stored:
        index = _pack_bits(relative_index_codes(indexed, storage.index_width).numpy(), storage.index_width)
    scales = b""
    if storage.integer:
        codes, scale, _ = quantize_to_codes(
            values,
            storage.value_bits,
            storage.scale_axis,
            symmetric=True,
            what=f"the weight of {storage.name!r}",
        )
        qmin, _ = integer_range(storage.value_bits, symmetric=True)
        data = _pack_bits((codes.reshape(-1)[keep] - qmin).numpy(), storage.value_bits)
        scales = _tensor_bytes(scale.float().reshape(-1))
    else:
        data = _tensor_bytes(values.reshape(-1)[keep].to(_FLOAT_DTYPES[storage.value_bits]))
    bias = getattr(layer, "bias", None)
    bias_bytes = b"" if bias is None else _tensor_bytes(bias.float())
    entry = {
        **{k: v for k, v in asdict(storage).items() if k not in ("total_bits",)},
        "weight_shape": list(layer.weight.shape),
        "stored_shape": list(stored.shape),
        "bias": bias is not None,
        "bytes": [len(index), len(data), len(scales), len(bias_bytes)],
        **extra,
    }
    return entry, [index, data, scales, bias_bytes]


def save_packed(
    module: nn.Module,
    path: str | os.PathLike,
    bits: BitsSpec | Mapping[str, BitsSpec] | None = None,
    per_channel: bool | None = None,
    block: tuple[int, int] | None = None,
) -> Path:
    """Return the path of a file holding ``module``'s Linear / convolution weights as :func:`bits_per_weight` counts them.

    Per layer: the kept stored values (integer codes bit-packed at their width, or float32 / float16
    values), the cheapest sparse index (bitmask or relative indices with filler codes, over entries or, with
    ``block``, over whole blocks), the float32 scales, and the float32 bias; a JSON header says how to read them. Weight data is the count of :func:`size_report` rounded up
    to whole bytes per section. :func:`load_packed` gives back dense weights (B-vectors expanded, n-bit
    codes dequantized). Other state (normalisation layers, ...) is not stored; ``torch.ao`` quantized
    layers are not supported (pack the float model with ``bits=8``).
    """
    rows = {r["name"]: r for r in size_report(module, bits, per_channel, block)}
    entries, sections = [], []
    with torch.no_grad():
        for name, layer in weight_layers(module):
            if not is_quantizable(layer):
                raise TypeError(
                    f"layer {name!r} is a torch.ao quantized layer; pack the float model with bits=8"
                )
            fields = {k: v for k, v in rows[name].items() if k != "bits_per_weight"}
            entry, data = _encode_layer(LayerStorage(**fields), layer)
            entries.append(entry)
            sections.extend(data)
    header = json.dumps({"format": PACKED_FORMAT, "layers": entries}, separators=(",", ":")).encode()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(PACKED_MAGIC + struct.pack("<I", len(header)) + header + b"".join(sections))
    return path


def packed_header(path: str | os.PathLike) -> dict:
    """Return the JSON header of a file written by :func:`save_packed`, with ``header_bytes`` (magic included)."""
    with open(path, "rb") as f:
        magic = f.read(len(PACKED_MAGIC))
        if magic != PACKED_MAGIC:
            raise ValueError(f"{path} is not a packed rlq file")
        (length,) = struct.unpack("<I", f.read(4))
        header = json.loads(f.read(length).decode())
    header["header_bytes"] = len(PACKED_MAGIC) + 4 + length
    return header


def expand_block_circulant(vectors: Tensor) -> Tensor:
    """Return the dense ``(out, in, *kernel)`` weight of B-vectors ``(out/B, in/B, B, *kernel)``.

    ``weight[i*B + r, j*B + c] = vectors[i, j, (r - c) mod B]``, the layout of ``rlq.compress.circulant``
    (which ``rlq.quant`` may not import; a test checks that both agree).
    """
    p, q, b = vectors.shape[:3]
    rows = torch.arange(b)
    blocks = vectors[:, :, (rows[:, None] - rows[None, :]) % b]  # (p, q, r, c, *kernel)
    order = (0, 2, 1, 3, *range(4, blocks.dim()))
    return blocks.permute(order).reshape(p * b, q * b, *vectors.shape[3:])


def _decode_keep(entry: dict, index: bytes, file_format: int) -> Tensor:
    """Return the flat bool mask of the kept stored values that a layer's index section encodes."""
    shape = entry["stored_shape"]
    index_format = entry["index_format"]
    if index_format is None:
        return torch.ones(math.prod(shape), dtype=torch.bool)
    if index_format not in ("bitmask", "relative", "block_bitmask", "block_relative"):
        raise ValueError(f"layer {entry['name']!r} has an unknown index format {index_format!r}")
    if not index_format.startswith("block_"):
        return _decode_positions(entry, index_format, index, math.prod(shape), entry["stored"], file_format)
    rows, cols = entry["index_block"]
    grid = (-(-shape[0] // rows), -(-math.prod(shape[1:]) // cols))
    kept = _decode_positions(
        entry, index_format[len("block_") :], index, math.prod(grid), entry["index_entries"], 2
    )
    flat_shape = (shape[0], math.prod(shape[1:]))
    keep = torch.from_numpy(expand_kept_blocks(kept.reshape(grid).numpy(), (rows, cols), flat_shape)).reshape(
        -1
    )
    if int(keep.sum()) != entry["stored"]:
        raise ValueError(f"the block index of layer {entry['name']!r} does not keep {entry['stored']} values")
    return keep


def _decode_positions(
    entry: dict, index_format: str, index: bytes, numel: int, kept: int, file_format: int
) -> Tensor:
    """Return the flat bool mask of ``numel`` positions, ``kept`` of them kept, that a bitmask or relative index encodes."""
    width = entry["index_width"]
    if index_format == "bitmask":
        return torch.from_numpy(np.unpackbits(np.frombuffer(index, np.uint8), bitorder="little")[:numel] != 0)
    keep = torch.zeros(numel, dtype=torch.bool)
    if file_format == 1:  # gap - 1 in a width that holds every gap
        positions = torch.from_numpy(np.cumsum(_unpack_bits(index, width, kept) + 1) - 1)
    else:
        codes = torch.from_numpy(_unpack_bits(index, width, kept + entry["index_fillers"]))
        positions = relative_index_positions(codes, width)
    if positions.numel() != kept or (kept and (positions[-1] >= numel or positions[0] < 0)):
        raise ValueError(
            f"the index of layer {entry['name']!r} does not decode to {kept} positions in {numel}"
        )
    keep[positions] = True
    return keep


def _decode_layer(entry: dict, sections: list[bytes], file_format: int) -> tuple[Tensor, Tensor | None]:
    index, data, scales, bias = sections
    shape, kept = entry["stored_shape"], entry["stored"]
    numel = math.prod(shape)
    keep = _decode_keep(entry, index, file_format)
    values = torch.zeros(numel)
    if entry["integer"]:
        qmin, _ = integer_range(entry["value_bits"], symmetric=True)
        codes = torch.zeros(numel)
        codes[keep] = torch.from_numpy(_unpack_bits(data, entry["value_bits"], kept) + qmin).float()
        scale = _bytes_tensor(scales, torch.float32, [-1])
        axis = entry["scale_axis"]
        view = [1] * len(shape)
        if axis is not None:
            view[axis] = shape[axis]
        values = codes.reshape(shape) * scale.reshape(view)
    else:
        values[keep] = _bytes_tensor(data, _FLOAT_DTYPES[entry["value_bits"]], [kept]).float()
        values = values.reshape(shape)
    weight = expand_block_circulant(values) if entry["block_size"] else values
    return weight.reshape(entry["weight_shape"]), (
        _bytes_tensor(bias, torch.float32, [-1]) if entry["bias"] else None
    )


def load_packed(path: str | os.PathLike) -> dict[str, Tensor]:
    """Return the dense float32 ``{<layer>.weight, <layer>.bias}`` state of a file from :func:`save_packed`.

    Load it into a plain (uncompressed) module of the same architecture with ``load_state_dict(...,
    strict=False)`` (only the Linear / convolution tensors are in the file).
    """
    header = packed_header(path)
    if header.get("format") not in READABLE_FORMATS:
        raise ValueError(
            f"{path} has packed format {header.get('format')!r}; this rlq reads {', '.join(map(str, READABLE_FORMATS))}"
        )
    state: dict[str, Tensor] = {}
    with open(path, "rb") as f:
        f.seek(header["header_bytes"])
        for entry in header["layers"]:
            sections = [f.read(n) for n in entry["bytes"]]
            if [len(x) for x in sections] != entry["bytes"]:
                raise ValueError(f"{path} is truncated: layer {entry['name']!r} lacks data")
            weight, bias = _decode_layer(entry, sections, header["format"])
            prefix = f"{entry['name']}." if entry["name"] else ""
            state[prefix + "weight"] = weight
            if bias is not None:
                state[prefix + "bias"] = bias
    return state
