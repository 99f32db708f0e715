"""The stored forms a compiled layer runs in, each with the NumPy forward that the compiled kernel matches.

Every op packs one layer into the arrays ``rlq/deploy/_policy_kernels.c`` reads (:meth:`PackedOp.words`
lays them out for it) and computes the same function in NumPy (:meth:`PackedOp.forward`: the fallback where
the kernels are not built, and the reference the tests hold the kernels to).

- :class:`DenseF32`: the float32 weight, rows zero-padded to a multiple of 32.
- :class:`DenseI8`: int8 weight codes with one symmetric scale per output row (rlq's rule,
  :func:`rlq.quant.tensor.quantize_to_codes`: codes in [-127, 127], scale ``max|w| / 127``); each input row
  is quantized on the fly to uint8 with its own scale and zero point (asymmetric, as ONNX Runtime's
  ``DynamicQuantizeLinear``), so the product is an exact int32 sum of u8 x s8 products, dequantized once.
- :class:`SparseI8`: the same arithmetic over the kept ``R x K`` blocks of a pruned weight: per block row,
  the kept blocks' column indices (int32) and their codes, block after block (each block its ``R`` rows of
  ``K`` codes, the shape one vector multiply-add takes where ``R * K`` is 64); all-zero blocks are neither
  stored nor read.
- :class:`Affine`: ``clip(x * scale + shift, low, high)`` per feature (SB3's action scaling), or an
  activation on its own.

Block-circulant layers run in the frequency domain: :class:`rlq.deploy.frequency.Circulant`.
"""

from __future__ import annotations

import numpy as np
import torch

from rlq.core.blocks import kept_blocks
from rlq.deploy.reader import LinearSpec
from rlq.quant.tensor import quantize_to_codes

LANES = 32
"""Float lanes of the kernels' accumulators: dense rows and DFT blocks are padded to a multiple of it."""
I8_ROW_ALIGN = 64
"""int8 rows are padded to a multiple of this many codes."""
DENSE_I8_BLOCK = (16, 4)
"""The ``(rows, inputs)`` blocks :class:`DenseI8` stores a layer with few inputs in (64 bytes: one vector)."""
DENSE_I8_BLOCKED_INPUTS = 64
"""The most inputs a :class:`DenseI8` layer has to be stored in :data:`DENSE_I8_BLOCK` blocks (a row of more
codes sums faster along the row: measured on AVX-512 VNNI, TD3's 400-input and a 2048-input layer)."""
SPARSE_BLOCKS = ((16, 4), (8, 8), (4, 16), (4, 4), (1, 64), (1, 32), (1, 16), (1, 4))
"""Block shapes ``(rows, inputs)`` :func:`choose_block` tries for a pruned weight, in order of preference."""
VECTOR_BLOCKS = ((16, 4), (8, 8), (4, 16))
"""The 64-byte block shapes the compiled kernels sum with one vector multiply-add per block (AVX-512 VNNI's
``vpdpbusd``, AVX2's ``vpmaddwd``), where the build has that path (``VECTOR_I8_BLOCKS``)."""
MAX_SPARSE_DENSITY = 0.5
"""A pruned weight runs block-sparse when its kept blocks hold at most this fraction of the dense entries."""
ACTIVATION_CODES = {"none": 0, "relu": 1, "tanh": 2}
MAX_INT8_INPUTS = (2**31 - 1) // (255 * 127)
"""Most inputs (or input blocks) an int8 op sums over: its int32 sums of u8 x s8 products cannot overflow."""
ACTION_SCALING = "action scaling"
"""The name of the :class:`Affine` op that maps a continuous policy's output to its action space."""


def round_up(n: int, multiple: int) -> int:
    """Return the smallest multiple of ``multiple`` that is at least ``n`` (and at least ``multiple``)."""
    return max(multiple, -(-n // multiple) * multiple)


def activate(y: np.ndarray, activation: str) -> np.ndarray:
    """Return ``y`` after the activation ``"none"``, ``"relu"`` or ``"tanh"``."""
    if activation == "relu":
        return np.maximum(y, np.float32(0.0))
    if activation == "tanh":
        return np.tanh(y)
    return y


def _pointer(a: np.ndarray | None) -> int:
    return 0 if a is None else int(a.__array_interface__["data"][0])


class PackedOp:
    """One layer packed for the kernels: its arrays, its op words, and its NumPy forward."""

    kernel = ""
    """The kernel's name (``dense_fp32``, ``dense_int8``, ``sparse_int8``, ``circulant_fp32`` ...)."""
    code_name = ""
    """The op's name in the C module's constants (``DENSE_F32`` ...)."""
    quantizes_activations = False
    """Whether the kernel rounds its input to 8-bit codes (see :func:`quantize_rows`)."""

    def __init__(self, name: str, n_in: int, n_out: int, activation: str):
        self.name, self.n_in, self.n_out, self.activation = name, n_in, n_out, activation
        self.arrays: dict[str, np.ndarray] = {}

    def sizes(self) -> tuple[int, int, int]:
        """Return the op's three size words (see the C file's header)."""
        return 0, 0, 0

    def pointers(self) -> list[np.ndarray | None]:
        """Return the arrays for pointer words 7, 8, ... (None for a null pointer)."""
        return []

    def words(self, codes: dict[str, int], op_words: int) -> list[int]:
        """Return the op's ``op_words`` int64 words for the C program, with ``codes`` from its constants."""
        words = [
            codes[self.code_name],
            self.n_in,
            self.n_out,
            ACTIVATION_CODES[self.activation],
            *self.sizes(),
        ]
        words += [_pointer(a) for a in self.pointers()]
        return words + [0] * (op_words - len(words))

    def work_floats(self) -> int:
        """Return the float buffer width the op needs (its padded input and its output)."""
        return max(self.n_in, self.n_out)

    def work_bytes(self) -> int:
        """Return the byte buffer the op needs (its input's uint8 codes)."""
        return 0

    def weight_bytes(self) -> int:
        """Return the bytes of weights, scales, indices, tables and bias one call reads."""
        return sum(int(a.nbytes) for a in self.arrays.values())

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Return the op's float32 output for a float32 batch ``(batch, n_in)``, activation applied."""
        raise NotImplementedError

    def effective_weight(self) -> np.ndarray | None:
        """Return the dense float64 ``(out, in)`` weight the op multiplies by (None for :class:`Affine`)."""
        return None

    def rounding_bound(self, x: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """Return a bound ``(batch, n_out)`` on the output error from rounding the op's input to codes.

        ``x`` is the exact float64 input, ``delta`` a bound on how far the op's actual input is from it
        (see :mod:`rlq.deploy.bounds`); 0 for ops that do not quantize their input.
        """
        return np.zeros((len(x), self.n_out))

    def describe(self) -> str:
        """Return a one-line description of the stored form."""
        return self.kernel


def _bias(spec: LinearSpec) -> np.ndarray | None:
    return None if spec.bias is None else np.ascontiguousarray(spec.bias, np.float32)


class DenseF32(PackedOp):
    """A Linear layer as a float32 matrix (rows padded to :data:`LANES`)."""

    kernel, code_name = "dense_fp32", "DENSE_F32"

    def __init__(self, spec: LinearSpec):
        super().__init__(spec.name, spec.n_in, spec.n_out, spec.activation)
        self.in_pad = round_up(spec.n_in, LANES)
        weight = np.zeros((spec.n_out, self.in_pad), np.float32)
        weight[:, : spec.n_in] = spec.weight
        self.arrays = {"weight": weight}
        if spec.bias is not None:
            self.arrays["bias"] = _bias(spec)

    def sizes(self) -> tuple[int, int, int]:
        return self.in_pad, 0, 0

    def pointers(self) -> list[np.ndarray | None]:
        return [self.arrays["weight"], self.arrays.get("bias")]

    def work_floats(self) -> int:
        return max(self.in_pad, self.n_out)

    def forward(self, x: np.ndarray) -> np.ndarray:
        y = x @ self.arrays["weight"][:, : self.n_in].T
        if "bias" in self.arrays:
            y = y + self.arrays["bias"]
        return activate(y.astype(np.float32, copy=False), self.activation)

    def effective_weight(self) -> np.ndarray:
        return self.arrays["weight"][:, : self.n_in].astype(np.float64)


def check_int8_width(name: str, n: int) -> None:
    """Raise ValueError when an int8 op of layer ``name`` would sum over more than :data:`MAX_INT8_INPUTS` terms."""
    if n > MAX_INT8_INPUTS:
        raise ValueError(
            f"layer {name!r} sums {n} int8 products per output, more than int32 sums hold ({MAX_INT8_INPUTS}); "
            "compile it at fp32"
        )


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return ``(codes, scale, zero_point)`` of each row of ``x``, as the kernels quantize a layer's input.

    Asymmetric uint8, as ONNX Runtime's ``DynamicQuantizeLinear``: ``s = (max(x, 0) - min(x, 0)) / 255``
    (1 for an all-zero row), ``z = round(-min(x, 0) / s)``, ``codes = round(x / s) + z``, both saturated to
    [0, 255], rounding half to even, in float32 as the C loop computes them; ``x ~ s (codes - z)``. The codes
    come back as float64 (exact) for an exact float64 product with integer weights.
    """
    lo = np.minimum(x.min(axis=1), np.float32(0.0))
    hi = np.maximum(x.max(axis=1), np.float32(0.0))
    scale = (hi - lo) / np.float32(255.0)
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    zero = np.clip(np.rint(-lo / scale), 0, 255).astype(np.float32)
    codes = np.clip(np.rint(x / scale[:, None]) + zero[:, None], 0, 255)
    return codes.astype(np.float64), scale, zero


class _Int8Rows(PackedOp):
    """Shared by the int8 ops: per-row weight codes and scales, the input quantized per row."""

    quantizes_activations = True

    def _quantize(self, spec: LinearSpec, bits: int = 8) -> np.ndarray:
        check_int8_width(spec.name, spec.n_in)
        if bits == 8 and spec.int8 is not None:  # the codes it arrived as: quantizing again gives them back
            codes, scale = spec.int8
            self.codes = np.ascontiguousarray(codes, np.int8)
            self.arrays["scale"] = np.asarray(scale, np.float32).reshape(-1)
        else:
            codes, scale, _ = quantize_to_codes(
                torch.from_numpy(spec.weight),
                bits,
                per_channel_axis=0,
                what=f"the weight of layer {spec.name!r}",
            )
            self.codes = codes.numpy().astype(np.int8)  # (out, in), kept for the fallback and the bounds
            self.arrays["scale"] = scale.reshape(-1).numpy().astype(np.float32)
        self.arrays["colsum"] = self.codes.sum(axis=1, dtype=np.int64).astype(np.int32)
        if spec.bias is not None:
            self.arrays["bias"] = _bias(spec)
        return self.codes

    def forward(self, x: np.ndarray) -> np.ndarray:
        u, s, z = quantize_rows(x)
        acc = u @ self.codes.astype(np.float64).T  # exact: integers far below 2**53
        y = (acc - z[:, None] * self.arrays["colsum"]).astype(np.float32) * (
            s[:, None] * self.arrays["scale"]
        )
        if "bias" in self.arrays:
            y = y + self.arrays["bias"]
        return activate(y, self.activation)

    def effective_weight(self) -> np.ndarray:
        return self.codes.astype(np.float64) * self.arrays["scale"].astype(np.float64)[:, None]

    def rounding_bound(self, x: np.ndarray, delta: np.ndarray) -> np.ndarray:
        # the input's step s = (max - min) / 255 over a row widened by delta; each code is within one
        # step of its value (half a step, or a whole one where the top code saturates)
        hi = np.maximum((x + delta).max(axis=1), 0.0)
        lo = np.minimum((x - delta).min(axis=1), 0.0)
        step = (hi - lo) / 255.0 * (1 + 1e-6)  # the kernel computes it in float32
        return step[:, None] * np.abs(self.effective_weight()).sum(axis=1)[None, :]

    def work_floats(self) -> int:
        return max(self.n_in, self.n_out, round_up(self.n_in, I8_ROW_ALIGN))


class DenseI8(_Int8Rows):
    """A Linear layer as int8 codes, one scale per output row.

    The kernels read a layer with many inputs row by row (each row padded to :data:`I8_ROW_ALIGN` codes: a
    row's sum runs in whole vectors, then across lanes once), and a layer with few inputs
    (:data:`DENSE_I8_BLOCKED_INPUTS` or fewer, an MLP's first) in ``16 x 4`` blocks (:data:`DENSE_I8_BLOCK`),
    block row after block row, each block its 16 rows of 4 codes: one vector multiply-add takes a block and no
    row needs a sum across lanes, which is most of a row's time when it holds a few dozen codes. ``codes``
    keeps them row by row, unpadded (the NumPy path, the exported C file).
    """

    kernel, code_name = "dense_int8", "DENSE_I8"

    def __init__(self, spec: LinearSpec):
        super().__init__(spec.name, spec.n_in, spec.n_out, spec.activation)
        codes = self._quantize(spec)
        self.blocked = spec.n_in <= DENSE_I8_BLOCKED_INPUTS
        rows, cols = DENSE_I8_BLOCK if self.blocked else (1, I8_ROW_ALIGN)
        self.in_pad = round_up(spec.n_in, cols)
        padded = np.zeros((round_up(spec.n_out, rows), self.in_pad), np.int8)
        padded[: spec.n_out, : spec.n_in] = codes
        if self.blocked:
            padded = padded.reshape(-1, rows, self.in_pad // cols, cols).transpose(0, 2, 1, 3)
        self.arrays["weight"] = np.ascontiguousarray(padded).reshape(-1)

    def sizes(self) -> tuple[int, int, int]:
        return self.in_pad, int(self.blocked), 0

    def pointers(self) -> list[np.ndarray | None]:
        a = self.arrays
        return [a["weight"], a.get("bias"), a["scale"], a["colsum"]]

    def work_bytes(self) -> int:
        return self.in_pad


LOW_BITS = (2, 3, 4, 5, 6, 7)
"""Weight widths :class:`DenseLowBit` packs (8 is :class:`DenseI8`)."""


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Return signed ``bits``-bit ``codes`` (flattened) as a little-endian bit stream of uint8, plus one zero byte.

    Code ``i`` is the two's-complement value in bits ``[i * bits, (i + 1) * bits)`` of the stream (bit ``k`` of
    byte ``k // 8`` is stream bit ``k``); the extra byte lets a reader fetch two bytes for any code.
    """
    flat = np.asarray(codes, np.int64).reshape(-1)
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if flat.size and (flat.min() < low or flat.max() > high):
        raise ValueError(f"codes outside the signed {bits}-bit range [{low}, {high}]")
    unsigned = (flat & ((1 << bits) - 1)).astype(np.uint64)
    stream = ((unsigned[:, None] >> np.arange(bits, dtype=np.uint64)) & 1).astype(np.uint8).reshape(-1)
    packed = np.packbits(stream, bitorder="little")
    return np.concatenate([packed, np.zeros(1, np.uint8)])


def unpack_codes(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Return the ``count`` signed codes of a stream written by :func:`pack_codes` (its inverse)."""
    stream = np.unpackbits(np.asarray(packed, np.uint8), bitorder="little")[: count * bits].reshape(
        count, bits
    )
    unsigned = (stream.astype(np.int64) << np.arange(bits)).sum(axis=1)
    return np.where(unsigned >= 2 ** (bits - 1), unsigned - 2**bits, unsigned)


class DenseLowBit(_Int8Rows):
    """A Linear layer as ``bits``-bit codes (2 to 7), one scale per output row, packed into a bit stream.

    The arithmetic is :class:`DenseI8`'s (codes in ``[-(2^(b-1) - 1), 2^(b-1) - 1]``, ``scale = max|w| /
    (2^(b-1) - 1)`` per row, the input quantized per row to uint8 on the fly); only the storage differs: ``b``
    bits per weight. The exported C file unpacks each code as it multiplies by it; the runtime's compiled
    kernels have no such op, so a policy holding one runs in NumPy (``use_kernels=False``).
    """

    kernel, code_name = "dense_lowbit", ""

    def __init__(self, spec: LinearSpec, bits: int):
        if bits not in LOW_BITS:
            raise ValueError(f"low-bit weights take bits in {LOW_BITS}, got {bits!r}")
        super().__init__(spec.name, spec.n_in, spec.n_out, spec.activation)
        self.bits = bits
        codes = self._quantize(spec, bits)
        self.arrays["packed"] = pack_codes(codes, bits)

    def describe(self) -> str:
        return f"{self.kernel} {self.bits}-bit"


def choose_block(
    nonzero: np.ndarray,
    candidates: tuple[tuple[int, int], ...] = SPARSE_BLOCKS,
    max_density: float = MAX_SPARSE_DENSITY,
    vector_blocks: bool = False,
) -> tuple[int, int] | None:
    """Return the block shape to store a pruned weight in, or None when it should stay dense.

    For plain loops (the exported C file, a build without a vector path): a shape fits when its kept blocks
    store no more than 1.25 times the nonzero entries (the zeros a block carries cost bytes and multiply-adds);
    the first fitting shape of ``candidates`` whose kept blocks hold at most ``max_density`` of the dense
    entries wins. An unstructured mask fits no shape but the narrowest.

    With ``vector_blocks`` (compiled kernels that take a 64-byte block in one vector multiply-add, see
    :data:`VECTOR_BLOCKS`): only those shapes of ``candidates`` are tried, and the one whose kept blocks are
    fewest (the first of them on a tie) wins if they hold at most ``max_density`` of the dense entries. The
    other shapes run in scalar loops: on an AVX-512 VNNI CPU a TD3 actor's 400 x 300 layer in 4 x 4 blocks
    took 3.0-3.8 times the dense int8 kernel's time while storing about a tenth of its entries
    (benchmarks/README.md), so no count of zeros makes them worth it there.
    """
    count = int(nonzero.sum())
    dense = nonzero.size
    if count > max_density * dense:  # kept blocks hold every nonzero entry: no shape can fit
        return None
    if vector_blocks:
        stored = {block: _stored(nonzero, block) for block in candidates if block in VECTOR_BLOCKS}
        best = min(stored, key=stored.__getitem__, default=None)
        return best if best is not None and stored[best] <= max_density * dense else None
    for block in candidates:
        stored = _stored(nonzero, block)
        if stored <= 1.25 * max(count, 1) and stored <= max_density * dense:
            return block
    return None


def _stored(nonzero: np.ndarray, block: tuple[int, int]) -> int:
    """Return the entries the kept ``block``-shaped blocks of the ``nonzero`` pattern store."""
    return int(kept_blocks(nonzero, block).sum()) * block[0] * block[1]


class SparseI8(_Int8Rows):
    """A pruned Linear layer as its kept ``R x K`` blocks of int8 codes (see the module docstring)."""

    kernel, code_name = "sparse_int8", "SPARSE_I8"

    def __init__(self, spec: LinearSpec, block: tuple[int, int]):
        super().__init__(spec.name, spec.n_in, spec.n_out, spec.activation)
        self.block = rows, cols = int(block[0]), int(block[1])
        codes = self._quantize(spec)
        keep = kept_blocks(codes != 0, block)
        out_pad, in_pad = keep.shape[0] * rows, keep.shape[1] * cols
        padded = np.zeros((out_pad, in_pad), np.int8)
        padded[: spec.n_out, : spec.n_in] = codes
        tiles = padded.reshape(keep.shape[0], rows, keep.shape[1], cols)
        # per block row: its kept blocks one after another, each block its R rows of K codes
        values = [tiles[br][:, keep[br], :].transpose(1, 0, 2).reshape(-1) for br in range(keep.shape[0])]
        self.arrays["weight"] = np.ascontiguousarray(np.concatenate([*values, np.zeros(1, np.int8)]))
        self.arrays["rowptr"] = np.concatenate([[0], np.cumsum(keep.sum(axis=1))]).astype(np.int32)
        self.arrays["col"] = np.concatenate([np.flatnonzero(r) for r in keep] + [[0]]).astype(np.int32)
        self.block_rows, self.in_pad = keep.shape[0], in_pad
        self.density = float(keep.mean()) if keep.size else 0.0

    def sizes(self) -> tuple[int, int, int]:
        return self.block[0], self.block[1], self.block_rows

    def pointers(self) -> list[np.ndarray | None]:
        a = self.arrays
        return [a["weight"], a.get("bias"), a["scale"], a["colsum"], a["rowptr"], a["col"]]

    def work_floats(self) -> int:
        return max(self.n_in, self.n_out, self.in_pad)

    def work_bytes(self) -> int:
        return self.in_pad

    def describe(self) -> str:
        return f"{self.kernel} {self.block[0]}x{self.block[1]} blocks, {self.density:.1%} kept"


class Affine(PackedOp):
    """``clip(x * scale + shift, low, high)`` per feature, then the activation."""

    kernel, code_name = "affine", "AFFINE"

    def __init__(
        self,
        name: str,
        scale: np.ndarray,
        shift: np.ndarray,
        low: np.ndarray,
        high: np.ndarray,
        activation: str = "none",
    ):
        n = int(scale.shape[0])
        super().__init__(name, n, n, activation)
        self.arrays = {
            k: np.ascontiguousarray(v, np.float32)
            for k, v in dict(scale=scale, shift=shift, low=low, high=high).items()
        }

    @classmethod
    def identity(cls, name: str, width: int, activation: str) -> Affine:
        """Return an op that applies ``activation`` alone to ``width`` features."""
        ones = np.ones(width, np.float32)
        return cls(name, ones, 0 * ones, -np.inf * ones, np.inf * ones, activation)

    def pointers(self) -> list[np.ndarray | None]:
        return [self.arrays[k] for k in ("scale", "shift", "low", "high")]

    def forward(self, x: np.ndarray) -> np.ndarray:
        a = self.arrays
        return activate(np.clip(x * a["scale"] + a["shift"], a["low"], a["high"]), self.activation)


def check_block(block: tuple[int, int]) -> tuple[int, int]:
    """Return ``block`` as ``(rows, inputs)`` ints if both are positive, else raise ValueError."""
    if (
        not isinstance(block, (tuple, list))
        or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        raise ValueError(f"a sparse block shape is (rows, inputs), two positive ints; got {block!r}")
    return int(block[0]), int(block[1])
