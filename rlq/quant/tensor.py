"""Uniform fake quantization of tensors: the arithmetic the rest of ``rlq.quant`` builds on.

With ``b`` bits a tensor (or each slice along ``per_channel_axis``) is mapped to integer codes ``q`` and
back to ``scale * (q - zero_point)``; "fake" quantization returns that dequantized float tensor.

- Symmetric (weights): codes in ``[-(2^(b-1) - 1), 2^(b-1) - 1]`` (the restricted range, ``2^b - 1`` levels,
  as in PyTorch's and TensorRT's int8 weights), ``scale = max|t| / (2^(b-1) - 1)``, zero point 0, so zero
  and the largest magnitude are exact.
- Asymmetric (activations): codes in ``[0, 2^b - 1]`` over the range ``[lo, hi] = [min(t.min(), 0),
  max(t.max(), 0)]`` widened to hold zero, ``scale = (hi - lo) / (2^b - 1)``,
  ``zero_point = round(-lo / scale)``.

Every value must be finite: one NaN or inf would make its tensor's (or channel's) scale NaN or inf and so wipe
out every other value (a NaN scale falls back to 1 and rounds the rest to 0; an inf scale turns them to NaN).
Quantizing such a tensor raises a ``ValueError`` that counts the NaN and inf values. The check looks at the
reduced min/max the scale is computed from (NaN and inf reach them, as ``torch.amin``/``amax`` propagate
NaN), so it costs one tiny ``isfinite`` per tensor, not a pass over it. Casts to fp16 / bf16 (``rlq.quant.ptq``)
map each value on its own and carry a NaN through as the one NaN it was.

QuaRL's public code (harvard-edge/QuaRL) used the step ``(|min| + |max|) / 2^n`` for linear layers: for a
range symmetric about zero that is ``2 max|t| / 2^n``, close to our ``2 max|t| / (2^n - 2)``, but it maps
``max|t|`` to the code ``2^(n-1)``, one past the largest signed n-bit code, which the rule here cannot.

Precision names (:func:`parse_precision`): ``fp32``, ``fp16``, ``bf16``; ``int2`` ... ``int16``; and ``sim8``.
``int8`` alone means PyTorch's real int8 kernels (which also quantize activations); every other ``intN`` is
simulated, weights only. ``sim8`` is the simulated, weights-only 8-bit point, made exactly like ``int7`` or
``int9``, so that an 8-bit point sits in the simulated sweep beside the kernel ``int8`` one
(:attr:`Precision.simulated` tells the two kinds apart).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

MIN_BITS = 2
MAX_BITS = 16
FLOAT_PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}
KERNEL_INT8 = "int8"
"""The one integer precision run with real integer kernels (``torch.ao``), activations quantized too."""
SIMULATED_INT8 = "sim8"
"""The weights-only simulated 8-bit precision: :func:`quantize_tensor` at 8 bits, like every other ``intN``."""


@dataclass(frozen=True)
class Precision:
    """A parsed precision: a float type (``fp32``, ``fp16``, ``bf16``) or signed integers of ``bits`` bits."""

    name: str
    """Canonical name, e.g. ``"int4"`` or ``"fp16"``."""
    bits: int
    """Bits per value."""
    is_float: bool
    """True for the float precisions."""

    @property
    def dtype(self) -> torch.dtype:
        """Return the torch dtype of a float precision."""
        if not self.is_float:
            raise ValueError(f"{self.name} is an integer precision and has no float dtype")
        return FLOAT_PRECISIONS[self.name]

    @property
    def simulated(self) -> bool:
        """Return True for the weights-only simulated integer precisions: every ``intN`` but ``int8``, and ``sim8``."""
        return not self.is_float and self.name != KERNEL_INT8


def precision_choices() -> str:
    """Return the accepted precision names, for error messages."""
    return ", ".join([*FLOAT_PRECISIONS, f"int{MIN_BITS} ... int{MAX_BITS}", SIMULATED_INT8])


def parse_precision(precision: str | Precision) -> Precision:
    """Return the :class:`Precision` that a string such as ``"int4"``, ``"int8"``, ``"sim8"`` or ``"fp16"`` names.

    ``"int8"`` is the real int8 kernels; ``"sim8"`` (8 bits) the weights-only simulated 8-bit point, which
    :func:`rlq.quant.ptq` makes exactly as it makes ``"int7"`` or ``"int9"`` (see the module docstring).
    """
    if isinstance(precision, Precision):
        return precision
    if not isinstance(precision, str):
        raise TypeError(f"precision must be a string such as 'int8', got {type(precision).__name__}")
    name = precision.strip().lower()
    name = _ALIASES.get(name, name)
    if name in FLOAT_PRECISIONS:
        return Precision(name, int(name[2:]), True)
    if name == SIMULATED_INT8:
        return Precision(SIMULATED_INT8, 8, False)
    if name.startswith("int") and name[3:].isdigit():
        bits = int(name[3:])
        if MIN_BITS <= bits <= MAX_BITS:
            return Precision(f"int{bits}", bits, False)
    raise ValueError(f"unknown precision {precision!r}; choose one of {precision_choices()}")


def check_bits(bits: int) -> int:
    """Return ``bits`` after checking that it is an int in ``[MIN_BITS, MAX_BITS]``."""
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"bits must be an int, got {type(bits).__name__}")
    if not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"bits must be in [{MIN_BITS}, {MAX_BITS}], got {bits}")
    return bits


def integer_range(bits: int, symmetric: bool = True) -> tuple[int, int]:
    """Return the smallest and largest integer code at ``bits`` bits (restricted signed range if symmetric)."""
    check_bits(bits)
    if symmetric:
        top = 2 ** (bits - 1) - 1
        return -top, top
    return 0, 2**bits - 1


def _reduce_dims(t: Tensor, per_channel_axis: int | None) -> tuple[int, ...] | None:
    if per_channel_axis is None:
        return None
    if t.dim() == 0:
        raise ValueError("per_channel_axis needs a tensor with at least one dimension")
    if not -t.dim() <= per_channel_axis < t.dim():
        raise ValueError(f"per_channel_axis {per_channel_axis} is out of range for a {t.dim()}-d tensor")
    axis = per_channel_axis % t.dim()
    return tuple(d for d in range(t.dim()) if d != axis)


def _compute_dtype(t: Tensor) -> torch.dtype:
    if not t.is_floating_point():
        raise TypeError(f"can only quantize floating-point tensors, got {t.dtype}")
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def non_finite_error(t: Tensor, what: str = "the tensor") -> ValueError:
    """Return the error for quantizing ``t`` (named ``what``), which holds NaN or inf: it counts them."""
    x = t.detach()
    n_nan, n_inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
    return ValueError(
        f"cannot quantize {what}: it holds {n_nan} NaN and {n_inf} inf among its {x.numel()} values; "
        "quantization needs finite values (one non-finite value makes the scale non-finite and destroys every "
        "other value sharing it)"
    )


def check_finite(t: Tensor, what: str = "the tensor") -> None:
    """Raise a ``ValueError`` counting ``t``'s NaN and inf values (``t`` named ``what``) unless all are finite."""
    if not bool(torch.isfinite(t.detach()).all()):
        raise non_finite_error(t, what)


def quantization_params(
    t: Tensor,
    bits: int,
    per_channel_axis: int | None = None,
    symmetric: bool = True,
    *,
    what: str = "the tensor",
) -> tuple[Tensor, Tensor]:
    """Return ``(scale, zero_point)`` for ``t``, shaped to broadcast against it (see the module docstring).

    Raises a ``ValueError`` naming ``t`` as ``what`` (e.g. ``"the weight of layer 'fc1'"``) if it holds NaN or inf.
    """
    check_bits(bits)
    dims = _reduce_dims(t, per_channel_axis)
    x = t.detach().to(_compute_dtype(t))
    if dims is None:
        lo, hi = x.min(), x.max()
    else:
        lo, hi = x.amin(dim=dims, keepdim=True), x.amax(dim=dims, keepdim=True)
    # min/max propagate NaN and keep inf, so checking them (or the symmetric scale, finite exactly when they
    # are) sees every non-finite value of t: one small isfinite per tensor on QAT's every forward pass.
    qmin, qmax = integer_range(bits, symmetric)
    if symmetric:
        scale = torch.maximum(lo.abs(), hi.abs()) / qmax
        finite = torch.isfinite(scale).all()
        zero_point = torch.zeros_like(scale)
    else:
        finite = (torch.isfinite(lo) & torch.isfinite(hi)).all()
        lo, hi = lo.clamp(max=0), hi.clamp(min=0)
        scale = (hi - lo) / (qmax - qmin)
    if not bool(finite):
        raise non_finite_error(t, what)
    # An all-zero slice has scale 0; any positive scale maps it to code 0 and back to exactly 0.
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    if not symmetric:
        zero_point = torch.clamp(torch.round(-lo / scale), qmin, qmax)
    return scale, zero_point


def fake_quantize(t: Tensor, scale: Tensor, zero_point: Tensor, qmin: int, qmax: int) -> Tensor:
    """Return ``scale * (clamp(round(t / scale) + zero_point, qmin, qmax) - zero_point)`` in ``t``'s dtype."""
    x = t.to(scale.dtype)
    codes = torch.clamp(torch.round(x / scale) + zero_point, qmin, qmax)
    return ((codes - zero_point) * scale).to(t.dtype)


def fake_quantize_ste(
    t: Tensor, scale: Tensor, zero_point: Tensor, qmin: int, qmax: int, clipped: bool = True
) -> Tensor:
    """Return :func:`fake_quantize` of ``t`` whose gradient is the straight-through estimator.

    The backward pass treats rounding as the identity; with ``clipped`` the gradient is zero where ``t`` lies
    outside the representable range (Bengio et al. 2013; Jacob et al. 2018, section 2.3), as the clamp
    really cuts those values off.
    """
    quantized = fake_quantize(t.detach(), scale, zero_point, qmin, qmax)
    passthrough = t - t.detach()  # zero in value, identity in gradient
    if clipped:
        lo = ((qmin - zero_point) * scale).to(t.dtype)
        hi = ((qmax - zero_point) * scale).to(t.dtype)
        passthrough = passthrough * ((t.detach() >= lo) & (t.detach() <= hi)).to(t.dtype)
    return quantized + passthrough


def quantize_to_codes(
    t: Tensor,
    bits: int,
    per_channel_axis: int | None = None,
    symmetric: bool = True,
    *,
    what: str = "the tensor",
) -> tuple[Tensor, Tensor, Tensor]:
    """Return the integer codes (int64) of ``t`` with their ``scale`` and ``zero_point`` (``t`` must be finite)."""
    scale, zero_point = quantization_params(t, bits, per_channel_axis, symmetric, what=what)
    qmin, qmax = integer_range(bits, symmetric)
    codes = torch.clamp(torch.round(t.detach().to(scale.dtype) / scale) + zero_point, qmin, qmax)
    return codes.to(torch.int64), scale, zero_point


def quantize_tensor(
    t: Tensor,
    bits: int,
    per_channel_axis: int | None = None,
    symmetric: bool = True,
    *,
    what: str = "the tensor",
) -> Tensor:
    """Return ``t`` fake-quantized to ``bits`` bits: at most ``2^bits`` distinct values per tensor or channel.

    ``per_channel_axis`` gives each slice along that axis its own scale (use 0 for the output channels of a
    Linear or Conv weight). The result has ``t``'s dtype and shape and carries no gradient. A ``t`` holding
    NaN or inf raises a ``ValueError`` that names it as ``what`` and counts them.
    """
    scale, zero_point = quantization_params(t, bits, per_channel_axis, symmetric, what=what)
    qmin, qmax = integer_range(bits, symmetric)
    return fake_quantize(t.detach(), scale, zero_point, qmin, qmax)
