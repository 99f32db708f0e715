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

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from rlq.core.kernels import kernel_readable, kernels_switched_on

try:  # built by setup.py where a C compiler is present; optional
    from rlq.quant import _fake_quant_kernels
except ImportError:  # pragma: no cover - depends on the install
    _fake_quant_kernels = None

USE_KERNELS = kernels_switched_on("RLQ_QUANT_KERNELS")
"""Whether :func:`fake_quantize_symmetric` uses the compiled kernel when it is built (``RLQ_QUANT_KERNELS=0``
to compare: ``benchmarks/bench_gst_throughput.py`` times both)."""

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


_NO_ZERO_SCALE_ABOVE = 1e-30
"""A scale no smaller than this is far from 0 (the smallest subnormal is 1e-45 in float32)."""


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
    compute = _compute_dtype(t)
    x = t.detach()
    if x.dtype != compute:
        x = x.to(compute)
    qmin, qmax = integer_range(bits, symmetric)
    # QAT runs this on every forward pass of every weight, mostly on small tensors where each torch call's
    # fixed cost outweighs its arithmetic: hence few calls, in place on the small reduced tensors.
    if symmetric:
        # max|t| in one reduction over |t|: the same number as max(|min|, |max|), NaN propagated likewise
        scale = x.abs().amax() if dims is None else x.abs().amax(dim=dims, keepdim=True)
        # min/max propagate NaN and keep inf, so the largest reduced value is finite exactly when every
        # value of t is: one tiny reduction per tensor on QAT's every forward pass, not a pass over t
        smallest, largest = _extremes(scale)
        if not math.isfinite(largest):
            raise non_finite_error(t, what)
        scale = scale.div_(qmax)
        zero_point = torch.zeros_like(scale)
    else:
        if dims is None:
            lo, hi = x.min(), x.max()
        else:
            lo, hi = x.amin(dim=dims, keepdim=True), x.amax(dim=dims, keepdim=True)
        if not (math.isfinite(_extremes(lo)[0]) and math.isfinite(_extremes(hi)[1])):
            raise non_finite_error(t, what)
        lo, hi = lo.clamp(max=0), hi.clamp(min=0)
        scale = (hi - lo).div_(qmax - qmin)
        smallest = _extremes(scale)[0]
    if smallest < qmax * _NO_ZERO_SCALE_ABOVE:
        # An all-zero slice has scale 0 (so may an underflowing tiny one); any positive scale maps it to
        # code 0 and back to exactly 0. Above the bound no scale can be 0, and the pass is skipped.
        scale = scale.masked_fill_(scale == 0, 1.0)
    if not symmetric:
        zero_point = torch.clamp(torch.round(-lo / scale), qmin, qmax)
    return scale, zero_point


def _extremes(reduced: Tensor) -> tuple[float, float]:
    """Return the smallest and largest value of a small reduced tensor (NaN if it holds one), as Python floats."""
    if reduced.dim() == 0:
        value = float(reduced)
        return value, value
    lo, hi = torch.aminmax(reduced)
    return float(lo), float(hi)


def _dequantized_(codes: Tensor, scale: Tensor, zero_point: Tensor | None, qmin: int, qmax: int) -> Tensor:
    """Return ``codes`` (holding ``t / scale``) turned in place into the fake-quantized values.

    In place: the same operations as the textbook expression, so the same bits, without its five temporaries
    (a 400x300 weight: about 130 us instead of 210 us). With ``zero_point`` None (zero) the zero point's
    addition and subtraction are skipped: they change no value but turn -0.0 into +0.0, which the callers
    do in their own last pass.
    """
    codes.round_()
    if zero_point is None:
        return codes.clamp_(qmin, qmax).mul_(scale)
    return codes.add_(zero_point).clamp_(qmin, qmax).sub_(zero_point).mul_(scale)


def fake_quantize(t: Tensor, scale: Tensor, zero_point: Tensor | None, qmin: int, qmax: int) -> Tensor:
    """Return ``scale * (clamp(round(t / scale) + zero_point, qmin, qmax) - zero_point)`` in ``t``'s dtype.

    ``zero_point`` None means zero (symmetric quantization) and saves a pass; ``scale`` must be positive.
    """
    out = _dequantized_(torch.div(t.to(scale.dtype), scale), scale, zero_point, qmin, qmax)
    if zero_point is None:
        out.add_(0.0)  # -0.0 -> +0.0, as adding the zero point 0 did
    return out.to(t.dtype)


_ZEROS: dict[torch.dtype, Tensor] = {}


def _zero(dtype: torch.dtype) -> Tensor:
    """Return a shared 0-d zero of ``dtype`` (never written)."""
    zero = _ZEROS.get(dtype)
    if zero is None:
        zero = _ZEROS[dtype] = torch.zeros((), dtype=dtype)
    return zero


def _straight_through_values_(
    out: Tensor, x: Tensor, scale: Tensor, zero_point: Tensor | None, qmin: int, qmax: int
) -> Tensor:
    """Write into ``out`` the values of ``fake_quantize(x) + (x - x)``, as the textbook straight-through estimator.

    ``x - x`` is +0.0 for a finite value (so it turns a -0.0 into +0.0) and NaN for inf or NaN. One fused
    pass, ``out - x * 0`` (addcmul), does both: ``x * 0`` is NaN for inf or NaN, and otherwise a zero with
    ``x``'s sign; a -0.0 result comes from a code rounded to -0.0, so from a negative ``x``, whose ``-x * 0``
    is +0.0, and -0.0 + +0.0 is +0.0; a nonzero result or +0.0 is unchanged by adding a zero. With a
    ``zero_point`` tensor the result holds no -0.0 (the zero point's addition removed them).
    """
    torch.div(x, scale, out=out)
    _dequantized_(out, scale, zero_point, qmin, qmax)
    return out.addcmul_(x, _zero(out.dtype), value=-1)


def fake_quantize_ste(
    t: Tensor, scale: Tensor, zero_point: Tensor | None, qmin: int, qmax: int, clipped: bool = True
) -> Tensor:
    """Return :func:`fake_quantize` of ``t`` whose gradient is the straight-through estimator.

    The backward pass treats rounding as the identity; with ``clipped`` the gradient is zero where ``t`` lies
    outside the representable range (Bengio et al. 2013; Jacob et al. 2018, section 2.3), as the clamp
    really cuts those values off. The values are those of ``fake_quantize(t) + (t - t.detach())``: NaN where
    ``t`` is inf or NaN. ``zero_point`` None means zero; ``scale`` must be positive.
    """
    x = t.detach()
    if x.dtype != scale.dtype:
        x = x.to(scale.dtype)
    if not (torch.is_grad_enabled() and t.requires_grad):
        return _straight_through_values_(torch.empty_like(x), x, scale, zero_point, qmin, qmax).to(t.dtype)
    # The output is made by an op whose backward is the straight-through gradient and then overwritten in
    # place (no_grad) with the fake-quantized values: neither op's backward reads the values it overwrites.
    # That costs one pass where the textbook quantized + (t - t.detach()) [* mask] costs two or three.
    if clipped:
        lo = (qmin * scale if zero_point is None else (qmin - zero_point) * scale).to(t.dtype)
        hi = (qmax * scale if zero_point is None else (qmax - zero_point) * scale).to(t.dtype)
        inside = ((t.detach() >= lo) & (t.detach() <= hi)).to(t.dtype)
        out = t * inside  # gradient grad * inside, bit for bit the textbook passthrough's
    else:
        out = t.clone()  # gradient: the identity
    with torch.no_grad():
        if out.dtype == x.dtype:
            _straight_through_values_(out, x, scale, zero_point, qmin, qmax)
        else:
            out.copy_(_straight_through_values_(torch.empty_like(x), x, scale, zero_point, qmin, qmax))
    return out


def kernels_available() -> bool:
    """Return whether the compiled fake-quantization kernel was built with this install of rlq."""
    return _fake_quant_kernels is not None


def _kernel_rows(x: Tensor, per_channel_axis: int | None) -> int | None:
    """Return how many rows the compiled kernel cuts ``x`` into (one scale each), or None if it does not take ``x``.

    It takes a tensor :func:`rlq.core.kernels.kernel_readable` accepts, quantized per tensor (one row) or
    per slice of its first axis.
    """
    if not (USE_KERNELS and _fake_quant_kernels is not None and x.numel() > 0 and kernel_readable(x)):
        return None
    if per_channel_axis is None:
        return 1
    if x.dim() >= 1 and per_channel_axis in (0, -x.dim()):
        return x.shape[0]
    return None


def fake_quantize_symmetric(
    t: Tensor, bits: int, per_channel_axis: int | None = None, *, what: str = "the tensor"
) -> Tensor:
    """Return the symmetric ``bits``-bit fake-quantized values of ``t`` (no gradient), -0.0 given as +0.0.

    The values of ``fake_quantize_ste(t, scale, None, qmin, qmax)`` with the scale of
    :func:`quantization_params` (what QAT's weight quantizer computes), bit for bit: by the compiled kernel
    of ``rlq/quant/_fake_quant_kernels.c`` (one call per tensor) where it applies, else by PyTorch ops.
    Raises a ``ValueError`` naming ``t`` as ``what`` if it holds NaN or inf.
    """
    qmin, qmax = integer_range(bits, symmetric=True)
    x = t.detach()
    rows = _kernel_rows(x, per_channel_axis)
    if rows is not None:
        out = torch.empty_like(x)
        if not _fake_quant_kernels.fake_quant_rows_f32(
            x.data_ptr(), out.data_ptr(), rows, x.numel() // rows, qmax
        ):
            raise non_finite_error(t, what)
        return out
    scale, _ = quantization_params(x, bits, per_channel_axis, symmetric=True, what=what)
    return fake_quantize_ste(x, scale, None, qmin, qmax, clipped=False)


class _StraightThrough(torch.autograd.Function):
    """``values`` forward, ``t``'s gradient passed back unchanged."""

    @staticmethod
    def forward(ctx, t: Tensor, values: Tensor) -> Tensor:  # type: ignore[override]
        # detach(): a new tensor object for autograd to attach its node to; the values are not copied
        return values.detach()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return grad, None


def straight_through(t: Tensor, values: Tensor) -> Tensor:
    """Return ``values`` (no copy) with the gradient of ``t``: the identity, as ``values + (t - t.detach())``.

    Why: reusing a fake-quantized weight computed earlier (``rlq.sb3.qat_stacking.MemoizedWeightFakeQuant``) needs
    only its straight-through gradient; ``values + (t - t.detach())`` costs two passes and two temporaries
    for the same bits when ``t`` is finite and ``values`` holds no -0.0 (as :func:`fake_quantize_ste`'s).
    """
    if not (torch.is_grad_enabled() and t.requires_grad):
        return values
    return _StraightThrough.apply(t, values)


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
    return fake_quantize(t.detach(), scale, None if symmetric else zero_point, qmin, qmax)
