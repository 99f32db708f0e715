"""Input scaling: one power of two per observation feature, folded into the first layer, for int8 inputs.

An int8 layer quantizes its input row with one scale per call (:func:`rlq.deploy.formats.quantize_rows`):
the row's range over 255. Where observation features span different ranges (HalfCheetah's joint velocities
reach 10-20, its joint angles stay within about 1), the wide ones set the step and the narrow ones keep a
few codes. Given ``calibration`` observations, :func:`compile_policy` divides each feature by
``c_j = 2^ceil(log2 max |x_j|)`` before the first layer (an :class:`~rlq.deploy.formats.Affine` op named
:data:`INPUT_SCALING`) and multiplies the first layer's column ``j`` by ``c_j``. Both are exact in float
(powers of two), so the compiled function is the module's until quantization; only the codes change: each
feature now spans at most [-1, 1] and gets a share of the 256 input codes that no longer depends on the
others' ranges. The per-call dynamic scale stays, so an observation outside the calibration's range is
quantized as before, with its own row's range.

The weight codes pay part of it: the first layer's codes are per row, so a row's step is set by its
largest ``|w_ij| c_j``. What it gives on trained actors: docs/deploy.md.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rlq.deploy.formats import Affine
from rlq.deploy.reader import LinearSpec

INPUT_SCALING = "input scaling"
"""The name of the :class:`Affine` op that divides each observation feature by its calibrated power of two."""
MAX_EXPONENT = 32
"""The scales are powers of two in ``[2^-32, 2^32]``: a trained float32 weight times one stays finite and normal,
so the fold is exact (a feature below ``2^-32`` on every calibration row is as good as 0)."""


def input_scales(calibration: np.ndarray, obs_dim: int) -> np.ndarray:
    """Return ``c_j = 2^ceil(log2 max |x_j|)`` per feature of the ``(n, obs_dim)`` ``calibration`` observations
    (float64; 1 for a feature that is 0 on every row); raise ValueError for a wrong shape or a non-finite value."""
    x = np.asarray(calibration, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] != obs_dim:
        raise ValueError(
            f"calibration must be observations of shape (n, {obs_dim}) with n >= 1, got shape {x.shape}"
        )
    if not np.isfinite(x).all():
        raise ValueError("calibration observations must be finite (one holds NaN or an infinity)")
    largest = np.abs(x).max(axis=0)
    exponent = np.ceil(np.log2(np.where(largest > 0, largest, 1.0)))
    return np.exp2(np.clip(exponent, -MAX_EXPONENT, MAX_EXPONENT))


def fold_input_scales(specs: list[LinearSpec], scales: np.ndarray) -> tuple[Affine, list[LinearSpec]]:
    """Return the op dividing each input feature by ``scales`` and ``specs`` with the first layer's columns
    multiplied by them (:func:`scaled_first_layer`): the same function, exactly (``scales`` are powers of two)."""
    width = scales.shape[0]
    scaling = Affine(
        INPUT_SCALING, 1.0 / scales, np.zeros(width), np.full(width, -np.inf), np.full(width, np.inf)
    )
    return scaling, scaled_first_layer(specs, scales)


def scaled_first_layer(specs: list[LinearSpec], scales: np.ndarray) -> list[LinearSpec]:
    """Return ``specs`` with the first layer's column ``j`` multiplied by ``scales[j]``.

    The first layer must be a plain or pruned ``nn.Linear`` (a block-circulant layer's columns are tied);
    int8 codes it arrived with are dropped, since its weights change: the int8 op quantizes the folded weight.
    """
    first = specs[0]
    if first.kind != "linear" or first.weight is None or first.vectors is not None:
        raise ValueError(
            f"input scaling multiplies the first layer's columns, so it must be a plain or pruned nn.Linear; "
            f"{first.name!r} is block-circulant"
        )
    weight = first.weight * scales[None, :].astype(np.float32)
    folded = dataclasses.replace(first, weight=np.ascontiguousarray(weight, np.float32), int8=None)
    return [folded, *specs[1:]]


def folded_specs(specs: list[LinearSpec], scaling: Affine) -> list[LinearSpec]:
    """Return ``specs`` with the first layer's columns multiplied as the ``scaling`` op of a compiled policy
    divides its inputs (the inverse of :func:`fold_input_scales`'s op)."""
    return scaled_first_layer(specs, 1.0 / scaling.arrays["scale"].astype(np.float64))
