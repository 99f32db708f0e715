"""Block-circulant layers in the frequency domain: the B-vectors' real DFTs, stored once, multiplied per bin.

rlq's layout (:mod:`rlq.compress.circulant`): block ``(i, j)`` of the weight is
``W[i*B + r, j*B + c] = v_ij[(r - c) mod B]``, so ``y_i = sum_j v_ij (*) x_j``, a circular convolution of
each input chunk with the block's first column ``v_ij``. With real DFTs of length B (bins
``k = 0 .. B/2``) that is ``Y_i[k] = sum_j V_ij[k] X_j[k]``, then ``y_i = IDFT(Y_i)``.

The op stores every ``V_ij`` in half-complex order, B real numbers per block (bins 0 and B/2 are real):
``[Re V[0], Re V[1], ..., Re V[h-1], Re V[h], Im V[1], ..., Im V[h-1]]`` with ``h = B/2``. A call takes the
DFT of each input chunk once, by a direct B x B product with a table of cosines and sines (:func:`dft_tables`;
for B <= 32 this is cheaper than an FFT's bookkeeping), accumulates the complex products of every block with
two lane-wise multiply-adds (``rlq/deploy/_policy_kernels.c``), and takes one inverse DFT per output
chunk, also by a table. A block costs ``2B`` multiply-adds where its dense form costs ``B * B``.

Precision of the stored DFTs (``circulant_precision``):

- ``"fp32"``: float32 DFTs, float32 input DFTs.
- ``"int16"``: int16 codes, float32 input DFTs (weights-only quantization, for accuracy).
- ``"int8"``: int8 codes, and the input's DFTs quantized per row to uint8 on the fly (the rule of
  :func:`rlq.deploy.formats.quantize_rows`), so that every block's products are exact int32 sums, four
  codes at a time (AVX-512 VNNI's ``vpdpbusd``), as the dense int8 kernel's are.

Codes have one symmetric scale per block row and half-complex component (``out`` scales a layer, as many
as per-output-channel dense int8): component ``c`` of block row ``i`` is scaled by ``max_j |V_ij[c]| / 127``
(``/ 32767`` at 16 bits). Such a scale is shared by every block ``j`` the row sums over, so it multiplies
the finished sum, and the inner loop is codes times input only; a scale per block ``(i, j)`` would need a
multiply per block inside the sum. Block sizes that divide 32 and are even run here: 2, 4, 8, 16, 32.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from rlq.deploy.formats import LANES, PackedOp, activate, check_int8_width, quantize_rows
from rlq.deploy.reader import LinearSpec
from rlq.quant.tensor import quantize_to_codes

I8_STEP = 128
"""Codes per int8 accumulator step in the C kernel (32 int32 lanes of 4 codes): int8 rows are padded to it."""
KERNEL_BLOCK_SIZES = (2, 4, 8, 16, 32)
"""B the frequency-domain kernel takes (even, dividing :data:`rlq.deploy.formats.LANES`)."""
PRECISIONS = {
    "fp32": (np.float32, None, "CIRC_F32"),
    "int8": (np.int8, 8, "CIRC_I8"),
    "int16": (np.int16, 16, "CIRC_I16"),
}
"""Stored precision of the DFTs: dtype, code bits, the C op."""


@functools.lru_cache(maxsize=8)
def dft_tables(block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Return float64 ``(D, E)``: ``hc = x @ D`` is the half-complex real DFT of a B-vector, ``x = hc @ E``.

    ``D[n, c]``: 1 (bin 0), ``cos(2 pi k n / B)`` (``Re`` of bin k), ``(-1)^n`` (bin B/2) and
    ``-sin(2 pi k n / B)`` (``Im`` of bin k), numpy's ``rfft`` sign. ``E`` is its inverse: for a real signal
    ``x[r] = (X_0 + (-1)^r X_h + 2 sum_k (Re X_k cos - Im X_k sin)(2 pi k r / B)) / B``.
    """
    b, h = block_size, block_size // 2
    n = np.arange(b)
    forward = np.zeros((b, b))
    inverse = np.zeros((b, b))
    forward[:, 0], inverse[0] = 1.0, 1.0 / b
    forward[:, h], inverse[h] = (-1.0) ** n, (-1.0) ** n / b
    for k in range(1, h):
        angle = 2 * np.pi * k * n / b
        forward[:, k], forward[:, h + k] = np.cos(angle), -np.sin(angle)
        inverse[k], inverse[h + k] = 2 * np.cos(angle) / b, -2 * np.sin(angle) / b
    return forward, inverse


@functools.lru_cache(maxsize=8)
def kernel_tables(block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return float32 ``(D, Ds, Ea, Eb)``, the tables the C kernel multiplies by (see its header).

    ``X = x @ D`` and ``Xs = x @ Ds`` (``X`` with the real and imaginary parts of bins 1..h-1 swapped, bins
    0 and h zero). From the lane sums ``A`` (of ``C * X``) and ``Bs`` (of ``C * Xs``) the output chunk is
    ``A @ Ea + Bs @ Eb``: ``Re Y_k = A_k - A_{h+k}``, ``Im Y_k = Bs_k + Bs_{h+k}``, then the inverse DFT.
    """
    forward, inverse = dft_tables(block_size)
    h = block_size // 2
    k = np.arange(1, h)
    swap = np.zeros_like(forward)
    swap[:, k], swap[:, h + k] = forward[:, h + k], forward[:, k]
    from_a, from_b = np.zeros_like(inverse), np.zeros_like(inverse)
    from_a[: h + 1] = inverse[: h + 1]
    from_a[h + k] = -inverse[k]
    from_b[k], from_b[h + k] = inverse[h + k], inverse[h + k]
    return tuple(t.astype(np.float32) for t in (forward, swap, from_a, from_b))


def half_complex_to_complex(hc: np.ndarray) -> np.ndarray:
    """Return the ``B/2 + 1`` complex bins (numpy's ``rfft`` layout) of half-complex values (last axis B)."""
    b = hc.shape[-1]
    h = b // 2
    bins = hc[..., : h + 1].astype(np.complex128)
    bins[..., 1:h] += 1j * hc[..., h + 1 :]
    return bins


class Circulant(PackedOp):
    """A block-circulant Linear layer as the real DFTs of its B-vectors (see the module docstring)."""

    def __init__(self, spec: LinearSpec, precision: str = "fp32"):
        if precision not in PRECISIONS:
            raise ValueError(f"circulant precision must be one of {tuple(PRECISIONS)}, got {precision!r}")
        super().__init__(spec.name, spec.n_in, spec.n_out, spec.activation)
        self.blocks_out, self.blocks_in, self.block_size = (int(d) for d in spec.vectors.shape)
        b = self.block_size
        if b not in KERNEL_BLOCK_SIZES:
            raise ValueError(f"the frequency-domain kernel takes B in {KERNEL_BLOCK_SIZES}, got {b}")
        self.precision = precision
        self.kernel, self.code_name = f"circulant_{precision}", PRECISIONS[precision][2]
        self.quantizes_activations = precision == "int8"
        if self.quantizes_activations:
            check_int8_width(spec.name, self.blocks_in)
        # the padded row is a whole number of accumulator steps: LANES floats, or I8_STEP int8 codes
        group = (I8_STEP if self.quantizes_activations else LANES) // b
        self.blocks_pad = -(-self.blocks_in // group) * group
        spectra = np.zeros((self.blocks_out, self.blocks_pad, b))
        spectra[:, : self.blocks_in] = spec.vectors.astype(np.float64) @ dft_tables(b)[0]
        dtype, bits, _ = PRECISIONS[precision]
        if bits is None:
            self.values = spectra.astype(np.float32)
            self.arrays["weight"] = self.values
        else:
            self._quantize(spectra, bits, spec.name)
            self.arrays["weight"] = self._kernel_layout(self.values.astype(dtype))
        if spec.bias is not None:
            self.arrays["bias"] = np.ascontiguousarray(spec.bias, np.float32)
        for key, table in zip(("dft", "dft_swap", "idft_a", "idft_b"), kernel_tables(b), strict=True):
            self.arrays[key] = table
        if self.quantizes_activations:
            self.arrays["colsum"] = self.values.sum(axis=1, dtype=np.int64).astype(np.int32)

    def _quantize(self, spectra: np.ndarray, bits: int, name: str) -> None:
        # one scale per (block row, component) over the blocks of the row: rows of (out/B * B, in/B)
        rows = torch.from_numpy(spectra.transpose(0, 2, 1).reshape(-1, self.blocks_pad))
        codes, scale, _ = quantize_to_codes(
            rows, bits, per_channel_axis=0, what=f"the DFTs of layer {name!r}"
        )
        shape = (self.blocks_out, self.block_size, self.blocks_pad)
        self.values = codes.numpy().reshape(shape).transpose(0, 2, 1).copy()  # (out/B, in/B, B) codes
        self.arrays["scale"] = scale.numpy().reshape(self.blocks_out, self.block_size).astype(np.float32)

    def _kernel_layout(self, values: np.ndarray) -> np.ndarray:
        """Return the stored DFTs in the C kernel's order: int8 codes by quads of input chunks (its header)."""
        if not self.quantizes_activations:
            return np.ascontiguousarray(values)
        p, q, b = values.shape
        return np.ascontiguousarray(values.reshape(p, q // 4, 4, b).transpose(0, 1, 3, 2))

    def sizes(self) -> tuple[int, int, int]:
        return self.block_size, self.blocks_pad, self.blocks_out

    def pointers(self) -> list[np.ndarray | None]:
        a = self.arrays
        tables = [a["dft"], a["dft_swap"], a["idft_a"], a["idft_b"]]
        return [a["weight"], a.get("bias"), a.get("scale"), *tables, a.get("colsum")]

    def work_floats(self) -> int:
        return max(self.n_in, self.n_out, self.blocks_pad * self.block_size)

    def work_bytes(self) -> int:
        return self.blocks_pad * self.block_size if self.quantizes_activations else 0

    def spectra(self) -> np.ndarray:
        """Return the stored DFTs as float64 ``(out/B, in/B, B)``, half-complex (dequantized for codes)."""
        weight = self.values[:, : self.blocks_in].astype(np.float64)
        if "scale" in self.arrays:
            weight = weight * self.arrays["scale"].astype(np.float64)[:, None, :]
        return weight

    def effective_vectors(self) -> np.ndarray:
        """Return the B-vectors the op multiplies by (float64): the stored DFTs transformed back."""
        return self.spectra() @ dft_tables(self.block_size)[1]

    def effective_weight(self) -> np.ndarray:
        vectors = self.effective_vectors()
        b = self.block_size
        rows = np.arange(b)
        blocks = vectors[:, :, (rows[:, None] - rows[None, :]) % b]  # (i, j, r, c) = v_ij[(r - c) mod B]
        return blocks.transpose(0, 2, 1, 3).reshape(self.n_out, self.n_in)

    def forward(self, x: np.ndarray) -> np.ndarray:
        if self.quantizes_activations:
            y = self._forward_codes(x)
        else:
            b = self.block_size
            x_bins = np.fft.rfft(x.astype(np.float64).reshape(len(x), self.blocks_in, b), axis=-1)
            y_bins = np.einsum("njk,ijk->nik", x_bins, half_complex_to_complex(self.spectra()))
            y = np.fft.irfft(y_bins, n=b, axis=-1).reshape(len(x), self.n_out)
        if "bias" in self.arrays:
            y = y + self.arrays["bias"]
        return activate(y.astype(np.float32), self.activation)

    def _input_codes(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Return the uint8 codes of the input chunks' DFTs ``X`` and ``Xs``, with their row scale and zero point."""
        a, b, h = self.arrays, self.block_size, self.block_size // 2
        chunks = np.zeros((len(x), self.blocks_pad, b), np.float32)
        chunks[:, : self.blocks_in] = x.reshape(len(x), self.blocks_in, b)
        u, s, z = quantize_rows((chunks @ a["dft"]).reshape(len(x), -1))
        u = u.reshape(len(x), self.blocks_pad, b)
        k = np.arange(1, h)
        swapped = np.empty_like(u)
        swapped[..., [0, h]] = z[:, None, None]  # Xs is 0 at bins 0 and h
        swapped[..., k], swapped[..., h + k] = u[..., h + k], u[..., k]
        return u, swapped, s, z

    def _forward_codes(self, x: np.ndarray) -> np.ndarray:
        """The int8 kernel's arithmetic: exact integer sums of codes, then the tables (see the C file)."""
        a = self.arrays
        u, swapped, s, z = self._input_codes(x)
        codes = self.values.astype(np.float64)
        scale = (s[:, None, None] * a["scale"][None]).astype(np.float32)  # (batch, out/B, B)
        parts = []
        for inputs in (u, swapped):
            sums = np.einsum("njc,ijc->nic", inputs, codes) - z[:, None, None] * a["colsum"][None]
            parts.append(sums.astype(np.float32) * scale)
        y = parts[0] @ a["idft_a"] + parts[1] @ a["idft_b"]  # (batch, out/B, B)
        return y.reshape(len(x), self.n_out)

    def rounding_bound(self, x: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """Return the output error bound from rounding the input's DFTs to codes (0 unless int8; see bounds)."""
        if not self.quantizes_activations:
            return np.zeros((len(x), self.n_out))
        b = self.block_size
        forward = dft_tables(b)[0]
        spectra = (x.reshape(len(x), self.blocks_in, b) @ forward).reshape(len(x), -1)
        widen = (delta.reshape(len(x), self.blocks_in, b) @ np.abs(forward)).reshape(len(x), -1)
        hi = np.maximum((spectra + widen).max(axis=1), 0.0)
        lo = np.minimum((spectra - widen).min(axis=1), 0.0)
        step = (hi - lo) / 255.0 * (1 + 1e-6)
        inverse = np.abs(self.arrays["idft_a"].astype(np.float64)) + np.abs(
            self.arrays["idft_b"].astype(np.float64)
        )
        per_block = np.abs(self.spectra()).sum(axis=1) @ inverse  # (out/B, B): per unit step
        return step[:, None] * per_block.reshape(-1)[None, :]

    def describe(self) -> str:
        return f"{self.kernel} B={self.block_size}"
