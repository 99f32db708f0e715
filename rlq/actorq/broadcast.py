"""The broadcaster's wire format: a policy's weights quantized to fp32, fp16, bf16, int8 or n bits, as bytes.

ActorQ (Krishnan et al., arXiv 1910.01055, section 5) quantizes the learner's policy before sending it, so
that actors pull fewer bytes. Here a broadcast is one compact ``bytes`` blob: a short JSON header naming
each array, then the raw arrays. At ``intN`` every Linear weight is stored as symmetric per-output-channel
N-bit codes with one float32 scale per channel (``rlq.quant.tensor``'s rule; N < 8 and 9..16 bit-packed
with ``rlq.quant.size.pack_codes``), biases as float32; an int8 blob is about a quarter of the fp32 one.
Decoding gives the codes back as they are, so that an int8 actor can use them without requantizing;
decoding fp32, fp16 and int8 needs NumPy only (PyTorch is imported for encoding, bf16 and packed codes).

A block-circulant layer's weight is given, and sent, as its B-vectors: a 3-d ``(out/B, in/B, B)`` array in
:mod:`rlq.compress.circulant`'s layout, so it travels as ``1/B`` of the dense weight's values. At ``intN`` its
codes have one scale per block row (over the row's ``in`` vector entries): each of the block row's ``B``
output rows holds exactly those values, so the codes expanded (:meth:`QuantizedWeight.expanded`) are the
per-output-channel codes of the dense expansion, and the dequantized expansion is the expansion of the
dequantized vectors. :meth:`DecodedPolicy.expanded` gives engines that run dense layers the dense form.

A weight holding NaN or inf cannot be quantized (its row's scale would wipe out the rest of the row): at an
integer precision encoding raises a ``ValueError`` naming the weight, so a learner that diverged stops at its
next broadcast instead of sending garbage to every actor. Float precisions cast each value on its own and send
a NaN as the one NaN it was, as ``rlq.quant.ptq``'s fp16 / bf16 copies do.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"RLQACTQ1"
_ALIGN = 16


def expand_vectors(vectors: np.ndarray) -> np.ndarray:
    """Return the dense ``(out, in)`` weight of B-vectors ``(out/B, in/B, B)``: ``W[iB + r, jB + c] = v[i, j, (r - c) mod B]``.

    Works on float values and integer codes alike (the dtype is kept).
    """
    if vectors.ndim != 3:
        raise ValueError(f"B-vectors have shape (out/B, in/B, B), got {vectors.shape}")
    rows, cols, b = vectors.shape
    r = np.arange(b)
    blocks = vectors[:, :, (r[:, None] - r[None, :]) % b]  # (i, j, r, c)
    return np.ascontiguousarray(blocks.transpose(0, 2, 1, 3).reshape(rows * b, cols * b))


@dataclass
class QuantizedWeight:
    """A Linear weight as signed integer codes with one scale per output channel (row), or per block row of B-vectors."""

    codes: np.ndarray
    """Integer codes, shape (out, in), or (out/B, in/B, B) for B-vectors: int8 for 8 bits or fewer, int16 above."""
    scale: np.ndarray
    """float32 scale per output channel, shape (out,) (per block row, (out/B,), for B-vectors)."""
    bits: int
    """Bits per code."""

    def dequantize(self) -> np.ndarray:
        """Return the float32 weight ``codes * scale`` (B-vectors stay B-vectors)."""
        shape = (-1,) + (1,) * (self.codes.ndim - 1)
        return self.codes.astype(np.float32) * self.scale.reshape(shape)

    @property
    def is_circulant(self) -> bool:
        """Return whether the codes are B-vectors ``(out/B, in/B, B)``."""
        return self.codes.ndim == 3

    def expanded(self) -> QuantizedWeight:
        """Return the dense ``(out, in)`` codes with one scale per output row (self when already dense)."""
        if not self.is_circulant:
            return self
        b = self.codes.shape[2]
        return QuantizedWeight(expand_vectors(self.codes), np.repeat(self.scale, b), self.bits)


Weight = np.ndarray | QuantizedWeight


@dataclass
class DecodedPolicy:
    """A broadcast as the actor reads it back."""

    version: int
    """Policy version: the learner step it was taken at (0 = the initial policy)."""
    precision: str
    """Precision it travelled at."""
    weights: dict[str, Weight]
    """Float arrays (fp32, fp16; bf16 comes back as fp32) or quantized weights, by name."""

    def float_weights(self) -> dict[str, np.ndarray]:
        """Return every weight as a dense float32 array (quantized ones dequantized, B-vectors expanded)."""
        return {
            k: v.dequantize() if isinstance(v, QuantizedWeight) else np.asarray(v, dtype=np.float32)
            for k, v in self.expanded().weights.items()
        }

    def block_sizes(self) -> dict[str, int]:
        """Return ``{name: B}`` of the weights that travelled as B-vectors."""
        return {
            k: int((v.codes if isinstance(v, QuantizedWeight) else v).shape[2])
            for k, v in self.weights.items()
            if (v.codes if isinstance(v, QuantizedWeight) else np.asarray(v)).ndim == 3
        }

    def expanded(self) -> DecodedPolicy:
        """Return the policy with every B-vector weight expanded to its dense form (codes stay codes); self if none."""
        if not self.block_sizes():
            return self
        weights: dict[str, Weight] = {
            k: v.expanded() if isinstance(v, QuantizedWeight) else _dense(np.asarray(v))
            for k, v in self.weights.items()
        }
        return DecodedPolicy(self.version, self.precision, weights)


def _dense(value: np.ndarray) -> np.ndarray:
    return expand_vectors(value) if value.ndim == 3 else value


def quantize_weight(weight: np.ndarray, bits: int, name: str | None = None) -> QuantizedWeight:
    """Return ``weight`` (out, in) as symmetric per-output-channel ``bits``-bit codes with float32 scales.

    B-vectors ``(out/B, in/B, B)`` get one scale per block row (see the module docstring). A weight holding
    NaN or inf raises a ``ValueError`` that names it (``name``) and counts them.
    """
    import torch

    from rlq.quant.tensor import quantize_to_codes

    array = np.asarray(weight, dtype=np.float32)
    tensor = torch.as_tensor(array.reshape(array.shape[0], -1))
    what = "the weight" if name is None else f"the weight {name!r}"
    codes, scale, _ = quantize_to_codes(tensor, bits, per_channel_axis=0, symmetric=True, what=what)
    dtype = np.int8 if bits <= 8 else np.int16
    codes_array = codes.numpy().astype(dtype).reshape(array.shape)
    return QuantizedWeight(codes_array, scale.reshape(-1).numpy().astype(np.float32), bits)


def encode_policy(weights: dict[str, np.ndarray], precision: str, version: int = 0) -> bytes:
    """Return the blob of ``weights`` (``{name: float array}``) at ``precision``, tagged with ``version``.

    Arrays whose name ends in ``.weight`` and that are 2-d (dense) or 3-d (B-vectors) are quantized at an
    integer precision (one holding NaN or inf raises a ``ValueError`` naming it); all others (biases) stay
    float32. Float precisions cast every array.
    """
    import torch

    from rlq.quant import parse_precision
    from rlq.quant.size import pack_codes
    from rlq.quant.tensor import integer_range

    spec = parse_precision(precision)
    arrays: list[tuple[str, np.ndarray]] = []
    quantized: dict[str, dict] = {}
    for name, value in weights.items():
        value = np.asarray(value, dtype=np.float32)
        if spec.is_float:
            if spec.name == "fp32":
                arrays.append((name, value))
            elif spec.name == "fp16":
                arrays.append((name, value.astype(np.float16)))
            else:  # bf16 has no NumPy dtype: send its 16-bit patterns
                arrays.append((name, torch.from_numpy(value).to(torch.bfloat16).view(torch.int16).numpy()))
        elif name.endswith(".weight") and value.ndim in (2, 3):
            q = quantize_weight(value, spec.bits, name=name)
            packed = spec.bits != 8
            if packed:
                qmin, _ = integer_range(spec.bits, symmetric=True)
                codes = pack_codes(torch.from_numpy(q.codes.astype(np.int64) - qmin), spec.bits).numpy()
            else:
                codes = q.codes
            arrays += [(f"{name}.codes", codes), (f"{name}.scale", q.scale)]
            quantized[name] = {"bits": spec.bits, "shape": list(value.shape), "packed": packed}
        else:
            arrays.append((name, value))
    entries, chunks, offset = [], [], 0
    for key, array in arrays:
        array = np.ascontiguousarray(array)
        pad = -offset % _ALIGN
        chunks.append(b"\0" * pad)
        offset += pad
        entries.append({"key": key, "dtype": array.dtype.str, "shape": list(array.shape), "offset": offset})
        raw = array.tobytes()
        chunks.append(raw)
        offset += len(raw)
    header = json.dumps(
        {"version": int(version), "precision": spec.name, "arrays": entries, "quantized": quantized},
        separators=(",", ":"),
    ).encode()
    head = MAGIC + struct.pack("<I", len(header)) + header
    head += b"\0" * (-len(head) % _ALIGN)
    return head + b"".join(chunks)


def decode_policy(blob: bytes | bytearray | memoryview | np.ndarray) -> DecodedPolicy:
    """Return the :class:`DecodedPolicy` in ``blob`` (from :func:`encode_policy`); arrays are read-only views."""
    buffer = (
        memoryview(blob).cast("B") if not isinstance(blob, np.ndarray) else memoryview(blob.view(np.uint8))
    )
    if bytes(buffer[: len(MAGIC)]) != MAGIC:
        raise ValueError("not an ActorQ policy broadcast (bad magic bytes)")
    (size,) = struct.unpack("<I", buffer[len(MAGIC) : len(MAGIC) + 4])
    start = len(MAGIC) + 4
    header = json.loads(bytes(buffer[start : start + size]))
    base = start + size + (-(start + size) % _ALIGN)
    arrays: dict[str, np.ndarray] = {}
    for entry in header["arrays"]:
        dtype = np.dtype(entry["dtype"])
        count = int(np.prod(entry["shape"], dtype=np.int64))
        arrays[entry["key"]] = np.frombuffer(
            buffer, dtype=dtype, count=count, offset=base + entry["offset"]
        ).reshape(entry["shape"])
    precision = header["precision"]
    weights: dict[str, Weight] = {}
    if precision == "bf16":
        import torch

        for key, value in arrays.items():
            weights[key] = torch.from_numpy(value.copy()).view(torch.bfloat16).float().numpy()
        return DecodedPolicy(header["version"], precision, weights)
    for key, value in arrays.items():
        if key.endswith((".codes", ".scale")):
            continue
        weights[key] = value
    for name, meta in header["quantized"].items():
        bits, shape = meta["bits"], tuple(meta["shape"])
        codes = arrays[f"{name}.codes"]
        if meta["packed"]:
            import torch

            from rlq.quant.size import unpack_codes
            from rlq.quant.tensor import integer_range

            qmin, _ = integer_range(bits, symmetric=True)
            unpacked = unpack_codes(torch.from_numpy(codes.copy()), bits, int(np.prod(shape))).numpy() + qmin
            codes = unpacked.astype(np.int8 if bits <= 8 else np.int16).reshape(shape)
        weights[name] = QuantizedWeight(codes, arrays[f"{name}.scale"], bits)
    order = [e["key"] for e in header["arrays"]]
    ordered = sorted(weights, key=lambda k: order.index(k) if k in order else order.index(f"{k}.codes"))
    return DecodedPolicy(header["version"], precision, {k: weights[k] for k in ordered})
